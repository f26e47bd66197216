"""kernels_pallas.attention_ops.attend: one query per row goes to decode attention, longer to flash."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import attention_ops
from kernels_pallas.flash_attention.reference import attention_reference

_reference = jax.jit(attention_reference)


def _inputs(t, s, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (2, t, 4, 16), jnp.float32)
    k = jax.random.normal(kk, (2, s, 2, 16), jnp.float32)
    v = jax.random.normal(kv, (2, s, 2, 16), jnp.float32)
    return q, k, v


def test_dispatch(monkeypatch):
    calls = []
    for name in ("decode_attention", "flash_attention"):
        real = getattr(attention_ops, name)
        monkeypatch.setattr(
            attention_ops,
            name,
            lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw),
        )
    q, k, v = _inputs(1, 32)
    q_pos = jnp.array([[31], [9]], jnp.int32)
    kv_len = jnp.array([32, 10], jnp.int32)
    out = attention_ops.attend(q, k, v, q_pos, kv_len)
    np.testing.assert_allclose(out, _reference(q, k, v, q_pos, kv_len), rtol=1e-5, atol=1e-5)
    q, k, v = _inputs(32, 32)
    q_pos = jnp.tile(jnp.arange(32, dtype=jnp.int32), (2, 1))
    kv_len = jnp.array([32, 20], jnp.int32)
    out = attention_ops.attend(q, k, v, q_pos, kv_len)
    np.testing.assert_allclose(out, _reference(q, k, v, q_pos, kv_len), rtol=1e-5, atol=1e-5)
    assert calls == ["decode_attention", "flash_attention"]


def test_rejects_heads_not_a_multiple_of_kv_heads():
    q, k = np.zeros((2, 4, 3, 16), np.float32), np.zeros((2, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match="multiple"):
        attention_ops.attend(q, k, k, np.zeros((2, 4), np.int32), np.ones((2,), np.int32))
