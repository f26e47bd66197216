"""Pallas flash attention (interpret mode) against the jnp reference: forward and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.flash_attention.ops import FlashConfig, flash_attention
from kernels_pallas.flash_attention.reference import attention_reference

# Small tiles: several query and key tiles, skipped tiles in the dk/dv pass, padding of t to the tile.
CONFIG = FlashConfig(block_q=16, block_k=16, block_q_bwd=16, block_k_bwd=16)
H = 16


def _inputs(b, t, s, n, g, dtype, seed=0):
    kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (b, t, n, H), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, s, g, H), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (b, s, g, H), jnp.float32).astype(dtype)
    do = jax.random.normal(kd, (b, t, n, H), jnp.float32).astype(dtype)
    return q, k, v, do


def _close(actual, expected, rel):
    actual = np.asarray(actual, np.float32)
    expected = np.asarray(expected, np.float32)
    assert np.all(np.isfinite(actual))
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * scale)


def _value_and_vjp(f):
    """jit of (f(q, k, v), its vjp applied to do): one compiled program, no op-by-op dispatch."""

    def run(q, k, v, do):
        out, vjp = jax.vjp(f, q, k, v)
        return out, vjp(do)

    return jax.jit(run)


def _check(q, k, v, do, q_pos, kv_len, rel):
    attend = lambda q, k, v: flash_attention(q, k, v, q_pos, kv_len, config=CONFIG)
    ref = lambda q, k, v: attention_reference(q, k, v, q_pos, kv_len)
    out, grads = _value_and_vjp(attend)(q, k, v, do)
    out_ref, grads_ref = _value_and_vjp(ref)(q, k, v, do)
    assert out.dtype == q.dtype
    _close(out, out_ref, rel)
    for got, want, x in zip(grads, grads_ref, (q, k, v)):
        assert got.dtype == x.dtype and got.shape == x.shape
        _close(got, want, rel)
    return out, grads


# (n, g): grouped-query and multi-query (g == 1); multi-head (n == g) runs in test_bf16
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)])
def test_rows_of_different_lengths_f32(heads):
    """Training layout: keys are the call's tokens; row 1 has 23 real tokens then padding (position -1)."""
    b, t, (n, g) = 2, 40, heads  # t = 40 is padded to 48 inside the op
    q, k, v, do = _inputs(b, t, t, n, g, jnp.float32)
    ar = jnp.arange(t, dtype=jnp.int32)
    q_pos = jnp.stack([ar, jnp.where(ar < 23, ar, -1)])
    kv_len = jnp.array([t, 23], jnp.int32)
    out, (dq, dk, dv) = _check(q, k, v, do, q_pos, kv_len, 2e-5)
    # padding queries output zero and pass no gradient; keys past the row's length get none either
    assert np.all(np.asarray(out[1, 23:]) == 0)
    assert np.all(np.asarray(dq[1, 23:]) == 0)
    assert np.all(np.asarray(dk[1, 23:]) == 0) and np.all(np.asarray(dv[1, 23:]) == 0)


def test_prefill_at_an_offset_into_a_longer_cache_f32():
    """Queries at positions 20..35 and 5..20 against a 64-entry cache with per-row lengths."""
    b, t, s, n, g = 2, 16, 64, 4, 2
    q, k, v, do = _inputs(b, t, s, n, g, jnp.float32, seed=1)
    q_pos = jnp.stack([20 + jnp.arange(t), 5 + jnp.arange(t)]).astype(jnp.int32)
    kv_len = jnp.array([36, 21], jnp.int32)
    _check(q, k, v, do, q_pos, kv_len, 2e-5)


def test_bf16():
    b, t, n, g = 2, 32, 2, 2
    q, k, v, do = _inputs(b, t, t, n, g, jnp.bfloat16, seed=2)
    ar = jnp.arange(t, dtype=jnp.int32)
    q_pos = jnp.stack([ar, jnp.where(ar < 17, ar, -1)])
    kv_len = jnp.array([t, 17], jnp.int32)
    _check(q, k, v, do, q_pos, kv_len, 3e-2)


def test_a_row_with_no_keys_is_zero_and_finite():
    b, t, n, g = 2, 16, 2, 1
    q, k, v, do = _inputs(b, t, t, n, g, jnp.float32, seed=3)
    q_pos = jnp.stack([jnp.arange(t), jnp.full((t,), -1)]).astype(jnp.int32)
    kv_len = jnp.array([t, 0], jnp.int32)
    out, (dq, dk, dv) = _check(q, k, v, do, q_pos, kv_len, 2e-5)
    assert np.all(np.asarray(out[1]) == 0)
    assert np.all(np.asarray(dk[1]) == 0)
