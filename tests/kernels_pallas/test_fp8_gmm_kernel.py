"""fp8 grouped matmul (interpret mode): equals its reference, error bounded against f32, no NaN past the
e4m3 range, straight-through gradients; the MXFP8 emulation."""

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas.fp8_gmm.ops import Fp8GmmConfig, gmm_fp8
from kernels_pallas.fp8_gmm.quantize import (
    E4M3,
    MX_BLOCK,
    channel_error_bound,
    dequantize_mxfp8,
    mx_error_bound,
    quantize_channels,
    quantize_mxfp8,
)
from kernels_pallas.fp8_gmm.reference import gmm_fp8_reference, gmm_mxfp8_reference, scaled_matmul_reference
from kernels_pallas.gmm.reference import gmm_reference

M, K, N = 100, 64, 32
CONFIG = Fp8GmmConfig(block_m=32, block_k=32, block_n=16)
SIZES = jnp.array([37, 0, 41, 12], jnp.int32)  # an empty group; rows 90.. belong to no group
# Relative slack for f32 accumulation order. Natively on Hopper, fp8 tensor-core MMAs accumulate with a
# reduced-precision adder (about 14 bits kept, per the DeepSeek-V3 technical report), hence the looser value.
ACC_REL = 1e-5 if jax.default_backend() == "cpu" else 1e-3


def _operands(seed=0, dtype=jnp.float32):
    kx, kw = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kx, (M, K), jnp.float32)
    rhs = jax.random.normal(kw, (4, K, N), jnp.float32) / np.sqrt(K)
    return lhs.astype(dtype), rhs.astype(dtype)


def _exact(lhs, rhs):
    return jax.lax.ragged_dot(lhs, rhs, SIZES, precision=jax.lax.Precision.HIGHEST)


def _error_bound(lhs, rhs, delta_lhs, delta_rhs):
    """|sum_k x_k w_k - x'_k w'_k| <= sum_k (|x_k| + dx_k)(|w_k| + dw_k) - |x_k||w_k| for |x' - x| <= dx."""
    ax, aw = jnp.abs(lhs), jnp.abs(rhs)
    return _exact(ax + delta_lhs, aw + delta_rhs) - _exact(ax, aw)


def test_kernel_equals_reference_f32():
    lhs, rhs = _operands()
    out = jax.jit(lambda x, w: gmm_fp8(x, w, SIZES, config=CONFIG))(lhs, rhs)
    ref = gmm_fp8_reference(lhs, rhs, SIZES)
    scale = float(jnp.max(jnp.abs(ref)))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=ACC_REL, atol=ACC_REL * scale)
    assert np.all(np.asarray(out[90:]) == 0)


def test_error_against_f32_is_bounded():
    """Bound (stated in fp8_gmm/ops.py): per element, the error of each quantised operand is at most
    2^-4 |x| + 2^-10 amax/448, so |gmm_fp8 - gmm_f32| <= (|x|+dx) @ (|w|+dw) - |x| @ |w|. On Gaussian data the
    relative (Frobenius) error must also stay under 5%."""
    lhs, rhs = _operands(seed=1)
    out = jax.jit(lambda x, w: gmm_fp8(x, w, SIZES, config=CONFIG))(lhs, rhs)
    exact = _exact(lhs, rhs)
    _, row_scale = quantize_channels(lhs, axis=1)
    _, col_scale = quantize_channels(rhs, axis=1)
    bound = _error_bound(lhs, rhs, channel_error_bound(lhs, row_scale), channel_error_bound(rhs, col_scale))
    err = jnp.abs(out - exact)
    slack = ACC_REL * _exact(jnp.abs(lhs), jnp.abs(rhs))  # rounding of the accumulation and scales
    assert bool(jnp.all(err <= bound + slack))
    assert float(jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)) < 0.05


def test_no_nan_beyond_the_e4m3_range():
    lhs, rhs = _operands(seed=2)
    lhs = lhs.at[:10].multiply(1e6).at[10:20].set(0.0)  # far past 448, and all-zero rows (scale 0)
    rhs = rhs.at[1].multiply(1e4)
    out = jax.jit(lambda x, w: gmm_fp8(x, w, SIZES, config=CONFIG))(lhs, rhs)
    assert np.all(np.isfinite(np.asarray(out)))
    exact = _exact(lhs, rhs)
    assert float(jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)) < 0.05
    assert np.all(np.asarray(out[10:20]) == 0)


def test_straight_through_gradients_bf16():
    """Gradients are those of the unquantised gmm (the documented straight-through choice)."""
    lhs, rhs = _operands(seed=3, dtype=jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(9), (M, N), jnp.float32).astype(jnp.bfloat16)

    def grads(f):
        return jax.jit(lambda x, w: jax.vjp(f, x, w)[1](dy))(lhs, rhs)

    got = grads(lambda x, w: gmm_fp8(x, w, SIZES, config=CONFIG))
    want = grads(lambda x, w: gmm_reference(x, w, SIZES))
    for g, r in zip(got, want):
        assert g.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(r.astype(jnp.float32))))
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=2e-2 * scale)


def test_channel_quantisation_roundtrip():
    x = jax.random.normal(jax.random.key(4), (16, 64)) * jnp.logspace(-4, 4, 64)  # wide dynamic range
    q, scale = quantize_channels(x, axis=1)
    assert q.dtype == E4M3 and scale.shape == (16, 1)
    assert bool(jnp.all(jnp.abs(q.astype(jnp.float32)) <= 448))
    err = jnp.abs(q.astype(jnp.float32) * scale - x)
    assert bool(jnp.all(err <= channel_error_bound(x, scale)))


def test_mxfp8_format():
    x = jax.random.normal(jax.random.key(5), (8, 4 * MX_BLOCK)) * 10.0 ** jnp.arange(-3, 5).reshape(8, 1)
    x = x.at[0, :MX_BLOCK].set(0.0).at[1, 5].set(1e9)  # a zero block; a value far past e4m3's range
    q, scales = quantize_mxfp8(x)
    assert q.dtype == E4M3 and scales.dtype == jnp.float8_e8m0fnu and scales.shape == (8, 4)
    s = np.asarray(scales.astype(jnp.float32))
    assert np.all(np.exp2(np.round(np.log2(s))) == s)  # exact powers of two
    xd = dequantize_mxfp8(q, scales)
    assert np.all(np.isfinite(np.asarray(xd)))
    assert bool(jnp.all(jnp.abs(xd - x) <= mx_error_bound(x, scales)))
    assert np.all(np.asarray(xd[0, :MX_BLOCK]) == 0)


def test_scaled_matmul_reference_and_mxfp8_gmm():
    lhs, rhs = _operands(seed=6)
    # scaled_matmul_reference on the e4m3 values and e8m0 scales equals the product of dequantised operands
    lq, ls = quantize_mxfp8(lhs)
    rq, rs = quantize_mxfp8(jnp.swapaxes(rhs[0], 0, 1))  # [N, K]
    got = scaled_matmul_reference(lq[None], rq[None], ls[None], rs[None])[0]
    want = dequantize_mxfp8(lq, ls) @ dequantize_mxfp8(rq, rs).T
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    # the MXFP8 gmm is within its bound of the f32 gmm (per element error <= 2^-3 |x| + 2^-10 scale)
    out = gmm_mxfp8_reference(lhs, rhs, SIZES)
    _, rhs_scales = quantize_mxfp8(jnp.swapaxes(rhs, 1, 2))
    delta_rhs = jnp.swapaxes(mx_error_bound(jnp.swapaxes(rhs, 1, 2), rhs_scales), 1, 2)
    bound = _error_bound(lhs, rhs, mx_error_bound(lhs, ls), delta_rhs)
    slack = 1e-5 * _exact(jnp.abs(lhs), jnp.abs(rhs))
    assert bool(jnp.all(jnp.abs(out - _exact(lhs, rhs)) <= bound + slack))
