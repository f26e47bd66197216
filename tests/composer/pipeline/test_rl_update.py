"""The RL UPDATE on a real (tiny) learner: several updates per batch (rl.epochs x rl.minibatches) with the
PPO ratio against the learner's own log-probs before the first, so the clip acts; one update leaves the
ratio at 1."""

import jax
import numpy as np
import pytest

from composer import model
from composer.pipeline import rl
from experiments import composer as experiment


def _config(epochs: int, minibatches: int):
    config = experiment.get_config("tiny")
    config.model.update(copy_head_dim=0, copy_head_lines=False, max_seq_len=64)
    config.rl.update(
        epochs=epochs, minibatches=minibatches, learning_rate=3e-2, tasks_per_step=2, group_size=4
    )
    config.optim.warmup_steps = 0
    return config


def _seqs(n: int, vocab: int) -> list[dict]:
    """`n` episodes of 24 tokens, the last 16 generated; half solved (advantage +1), half not (-1)."""
    rng = np.random.default_rng(0)
    return [
        {
            "tokens": rng.integers(0, vocab, 24).astype(np.int32),
            "loss_mask": np.r_[np.zeros(8), np.ones(16)].astype(np.float32),
            "sampler_logprobs": np.full(24, -np.log(vocab), np.float32),
            "rewards": float(i % 2),
            "truncated": False,
            "off_policy": 0.0,
            "advantages": 1.0 if i % 2 else -1.0,
        }
        for i in range(n)
    ]


def _update(epochs: int, minibatches: int):
    config = _config(epochs, minibatches)
    cfg = model.ModelConfig.from_config(config)
    params = model.init(jax.random.key(0), cfg)
    policy = rl._policy(config, cfg, params, None)
    metrics = rl._update(policy, _seqs(8, cfg.vocab_size), config, jax.random.key(1))
    return policy, metrics


def test_one_update_a_batch_keeps_the_ratio_at_one():
    policy, metrics = _update(1, 1)
    assert policy.old_logprobs is None
    assert metrics["updates"] == 1 and int(policy.learner.state.step) == 1
    assert metrics["ratio"] == pytest.approx(1.0, abs=1e-6) and metrics["clip_frac"] == 0.0


def test_several_updates_a_batch_move_the_ratio_and_the_clip_acts():
    policy, metrics = _update(epochs=3, minibatches=2)
    assert metrics["updates"] == 6 and int(policy.learner.state.step) == 6
    # Past the first step the policy has moved away from the old log-probs: tokens with A > 0 rise past
    # 1 + clip_high, tokens with A < 0 fall below 1 - clip_low, and their gradient is cut.
    assert metrics["approx_kl"] > 0
    assert metrics["clip_frac_high"] > 0 and metrics["clip_frac_low"] > 0
    assert metrics["clip_frac"] == pytest.approx(metrics["clip_frac_high"] + metrics["clip_frac_low"])


def test_the_schedule_counts_every_update_and_bad_counts_fail_at_start():
    config = _config(epochs=2, minibatches=4)
    assert rl.updates_per_step(config.rl) == 8
    config.rl.minibatches = 9  # more minibatches than the 8 episodes of a step
    with pytest.raises(ValueError, match="rl.minibatches"):
        rl.updates_per_step(config.rl)
    config.rl.update(minibatches=1, epochs=0)
    with pytest.raises(ValueError, match="rl.epochs"):
        rl.updates_per_step(config.rl)
