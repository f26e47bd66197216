"""RL maths: advantage estimators (advantages.py) and policy and value losses (losses.py), in pure jnp."""

from composer.rl.advantages import ADVANTAGES, Advantages, compute_advantages, outcome_token_rewards
from composer.rl.losses import (
    AGGREGATIONS,
    DEFAULT_AGGREGATION,
    MaskedSum,
    finish,
    finish_all,
    policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "DEFAULT_AGGREGATION",
    "Advantages",
    "MaskedSum",
    "compute_advantages",
    "finish",
    "finish_all",
    "outcome_token_rewards",
    "policy_loss",
    "value_loss",
]
