"""Pallas decode attention (interpret mode) against the jnp reference; the split merge."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.decode_attention.ops import DecodeConfig, combine_splits, decode_attention
from kernels_pallas.decode_attention.reference import decode_attention_reference

S, H = 128, 32
_reference = jax.jit(decode_attention_reference)
CONFIG = DecodeConfig(split=32, block_k=16)  # 4 splits of 2 steps each


def _inputs(b, n, g, dtype, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, 1, n, H), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, S, g, H), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (b, S, g, H), jnp.float32).astype(dtype)
    return q, k, v


# Rows at different positions: a full cache, mid-cache on a split boundary, a single entry, a position
# behind the cache length (entries past it must stay hidden), and a padding row (position -1).
Q_POS = jnp.array([[127], [63], [0], [40], [-1]], jnp.int32)
KV_LEN = jnp.array([128, 64, 1, 100, 50], jnp.int32)


@pytest.mark.parametrize("heads", [(8, 2), (4, 1)])  # grouped-query, multi-query
def test_rows_at_different_positions_f32(heads):
    n, g = heads
    q, k, v = _inputs(5, n, g, jnp.float32)
    out = decode_attention(q, k, v, Q_POS, KV_LEN, config=CONFIG)
    ref = _reference(q, k, v, Q_POS, KV_LEN)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(out[4]) == 0)  # the padding row


def test_bf16_multi_head_and_one_split():
    q, k, v = _inputs(5, 4, 4, jnp.bfloat16, seed=1)
    ref = np.asarray(_reference(q, k, v, Q_POS, KV_LEN), np.float32)
    for config in (CONFIG, DecodeConfig(split=S, block_k=32)):
        out = decode_attention(q, k, v, Q_POS, KV_LEN, config=config)
        assert out.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2e-2, atol=2e-2)


def test_combine_splits_is_softmax_over_the_union():
    """Two parts normalised separately and merged by log2-sum-exp give the softmax over all entries."""
    kz, kv = jax.random.split(jax.random.key(0))
    z = jax.random.normal(kz, (8,))  # log2-domain scores of one query
    v = jax.random.normal(kv, (8, 3))

    @jax.jit
    def merged_and_direct(z, v):
        parts = []
        for part in (slice(0, 5), slice(5, 8)):
            w = jnp.exp2(z[part])
            parts.append((w @ v[part] / w.sum(), jnp.log2(w.sum())))
        o = jnp.stack([o for o, _ in parts])[None, :, None, None]  # [b=1, splits=2, g=1, r=1, 3]
        lse = jnp.stack([lse for _, lse in parts])[None, :, None, None]
        w = jnp.exp2(z)
        empty = combine_splits(jnp.zeros_like(o), jnp.full_like(lse, -jnp.inf))
        return combine_splits(o, lse)[0, 0, 0], w @ v / w.sum(), empty

    merged, direct, empty = merged_and_direct(z, v)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(direct), rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(empty) == 0)
