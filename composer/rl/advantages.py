"""Advantage estimators, chosen by name: 'grpo', 'drgrpo', 'rloo' (per sequence, within groups) and 'gae'.

Group layout: the rollouts of one task form a group, and rewards come as a dense array
`[groups, group_size]` (row i holds the G rollouts of task i). The group estimators return one advantage per
sequence in the same layout; flatten it to `[b]` (b = groups * group_size, row-major) and the policy loss
broadcasts it over the sequence's tokens. 'gae' works on tokens: rewards, values and mask `[b, t]`, and
returns advantages and returns per token.

Every estimator returns `Advantages(advantages, returns)`; `returns` are the value targets (for the group
estimators, the sequence's own reward, which is its return for an outcome reward with gamma = 1).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer import registry


class Advantages(NamedTuple):
    advantages: jax.Array  # [groups, group_size] (group estimators) or [b, t] (gae)
    returns: jax.Array  # same shape: the value targets


def grpo(rewards: jax.Array, *, eps: float = 1e-6) -> Advantages:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r)) / (std(r) + eps) within each group.

    rewards: [groups, group_size]. std is the population standard deviation (ddof = 0). A group whose
    rewards are all equal gets advantages 0.
    """
    rewards = rewards.astype(jnp.float32)
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    std = jnp.sqrt(jnp.mean(centred**2, axis=-1, keepdims=True))
    return Advantages(centred / (std + eps), rewards)


def drgrpo(rewards: jax.Array) -> Advantages:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i - mean(r), no std.

    Dividing by the group's std weights questions that are nearly always (or never) solved more, a bias the
    paper removes; its loss also drops the per-sequence length normalisation (see losses.DEFAULT_AGGREGATION).
    rewards: [groups, group_size].
    """
    rewards = rewards.astype(jnp.float32)
    return Advantages(rewards - rewards.mean(axis=-1, keepdims=True), rewards)


def rloo(rewards: jax.Array) -> Advantages:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j.

    Equivalently A_i = G / (G - 1) * (r_i - mean(r)): the baseline of each rollout is independent of it, so
    the gradient estimate is unbiased. rewards: [groups, group_size]; a group of size 1 has no other rollout
    to compare with and gets advantage 0.
    """
    rewards = rewards.astype(jnp.float32)
    g = rewards.shape[-1]
    if g < 2:
        return Advantages(jnp.zeros_like(rewards), rewards)
    others = (rewards.sum(axis=-1, keepdims=True) - rewards) / (g - 1)
    return Advantages(rewards - others, rewards)


def gae(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, *, gamma: float = 1.0, lam: float = 0.95
) -> Advantages:
    """Generalised advantage estimation (Schulman et al. 2016) over the valid tokens of each sequence.

    rewards, values, mask: [b, t]. The valid tokens (mask 1, the tokens the policy generated) are the time
    steps; masked tokens (prompt, tool results, padding) are skipped, as if the valid ones were contiguous:

        delta_t = r_t + gamma * V_{next(t)} - V_t
        A_t     = delta_t + gamma * lam * A_{next(t)}
        R_t     = A_t + V_t                       (the value target)

    with next(t) the next valid token of the sequence, and V = A = 0 after the last one (the episode ends).
    Advantages and returns are 0 on masked tokens. Put an outcome reward at the last valid token with
    `outcome_token_rewards`.
    """
    mask = mask.astype(jnp.float32)
    rewards, values = rewards.astype(jnp.float32) * mask, values.astype(jnp.float32)

    def step(carry, x):
        next_value, next_adv = carry
        r, v, m = x
        delta = r + gamma * next_value - v
        adv = delta + gamma * lam * next_adv
        # A masked token passes the carry through untouched: the recursion skips it.
        carry = (jnp.where(m > 0, v, next_value), jnp.where(m > 0, adv, next_adv))
        return carry, adv * m

    b = rewards.shape[0]
    init = (jnp.zeros((b,), jnp.float32), jnp.zeros((b,), jnp.float32))
    xs = (rewards.T, values.T, mask.T)  # scan over time: [t, b]
    _, adv_tb = jax.lax.scan(step, init, xs, reverse=True)
    advantages = adv_tb.T
    return Advantages(advantages, (advantages + values) * mask)


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """Places each sequence's reward on its last valid token: rewards [b], mask [b, t] -> [b, t].

    A sequence with no valid token gets no reward anywhere.
    """
    t = mask.shape[-1]
    valid = mask > 0
    last = t - 1 - jnp.argmax(valid[:, ::-1], axis=-1)  # index of the last valid token
    at_last = (jnp.arange(t)[None, :] == last[:, None]) & valid.any(axis=-1, keepdims=True)
    return jnp.where(at_last, rewards.astype(jnp.float32)[:, None], 0.0)


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-6) -> jax.Array:
    """(x - mean) / (std + eps) over the valid entries of the whole batch (PPO's advantage normalisation)."""
    mask = mask.astype(jnp.float32)
    n = jnp.maximum(mask.sum(), 1.0)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) / (jnp.sqrt(var) + eps) * mask


ADVANTAGES: dict[str, Callable[..., Advantages]] = {"grpo": grpo, "drgrpo": drgrpo, "rloo": rloo, "gae": gae}


def compute_advantages(name: str, *args, **kwargs) -> Advantages:
    """Runs the estimator registered as `name` (a value of `config.rl.algorithm`) on the given arguments.

    Group estimators: `compute_advantages(name, rewards [groups, group_size])` ('grpo' also takes eps);
    'gae': `compute_advantages('gae', rewards [b, t], values [b, t], mask [b, t], gamma=, lam=)`.
    """
    return registry.resolve(ADVANTAGES, name, "advantage estimator")(*args, **kwargs)
