"""Random [m, b, t] training batches for the train-step tests (test_train.py, test_sharded_steps.py)."""

import jax
import jax.numpy as jnp


def random_batch(key: jax.Array, m: int, b: int, t: int, *, vocab_size: int, rl: bool = False) -> dict:
    """Tokens of random lengths in [t / 2, t] (positions -1 after), loss on tokens 3 and up; with `rl`, the
    RL fields too: per-row advantages, flat sampler and reference log-probs, row [0, 0] truncated."""
    k1, k2, k3 = jax.random.split(key, 3)
    pos = jnp.broadcast_to(jnp.arange(t), (m, b, t))
    valid = pos < jax.random.randint(k2, (m, b), t // 2, t + 1)[..., None]
    batch = {
        "tokens": jax.random.randint(k1, (m, b, t), 0, vocab_size),
        "positions": jnp.where(valid, pos, -1),
        "loss_mask": (valid & (pos >= 3)).astype(jnp.float32),
    }
    if rl:
        batch["advantages"] = jax.random.normal(k3, (m, b))
        batch["sampler_logprobs"] = jnp.full((m, b, t), -4.0)
        batch["truncated"] = jnp.zeros((m, b), bool).at[0, 0].set(True)
        batch["ref_logprobs"] = jnp.zeros((m, b, t))
    return batch
