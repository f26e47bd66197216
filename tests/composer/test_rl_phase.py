"""The RL phase's decision to skip updates that carry no policy signal."""

from types import SimpleNamespace

import pytest

from composer.pipeline import rl
from experiments import composer as experiment


def _groups(rewards: list[list[float]]) -> list[list[SimpleNamespace]]:
    def episode(reward):
        return SimpleNamespace(ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], reward=reward,
                               truncated=False)  # fmt: skip

    return [[episode(r) for r in g] for g in rewards]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_all_equal_groups_carry_no_signal_and_mixed_ones_do(algorithm):
    config = experiment.get_config()
    config.rl.algorithm = algorithm
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [1, 1, 1, 1]]), algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [0, 1, 0, 0]]), algorithm)
    assert rl.has_policy_signal(seqs, config.rl)


@pytest.mark.parametrize(
    "override", [("skip_no_signal_updates", False), ("algorithm", "gae"), ("kl_coef", 0.1)]
)
def test_updates_without_advantages_still_run_when_something_else_trains(override):
    config = experiment.get_config()
    setattr(config.rl, *override)
    seqs, _ = rl._sequences(_groups([[0, 0], [0, 0]]), config.rl.algorithm)
    assert rl.has_policy_signal(seqs, config.rl)
