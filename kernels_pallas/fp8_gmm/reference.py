"""Pure-jnp references for the fp8 grouped matmul.

- ``gmm_fp8_reference``: the kernel's format (per-row / per-(expert, column) e4m3, quantize.py), computed by
  dequantising to f32 and running ``jax.lax.ragged_dot`` at full f32 precision.
- ``scaled_matmul_reference`` and ``gmm_mxfp8_reference``: block-scaled MXFP8 (1x32 blocks, E8M0 scales)
  emulated on any backend, with the operand layout of ``jax.nn.scaled_matmul``.
"""

import jax
import jax.numpy as jnp

from kernels_pallas.fp8_gmm.quantize import dequantize_mxfp8, quantize_channels, quantize_mxfp8


def _ragged_f32(lhs_mk, rhs_ekn, group_sizes_e):
    return jax.lax.ragged_dot(
        lhs_mk,
        rhs_ekn,
        group_sizes_e,
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def gmm_fp8_reference(lhs_mk: jax.Array, rhs_ekn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
    """out [m, n] in lhs's dtype: the gmm of the per-channel e4m3 quantised operands, f32 accumulation."""
    lhs_q, row_scale = quantize_channels(lhs_mk, axis=1)  # [m, k], [m, 1]
    rhs_q, col_scale = quantize_channels(rhs_ekn, axis=1)  # [e, k, n], [e, 1, n]
    lhs_dq = lhs_q.astype(jnp.float32) * row_scale
    rhs_dq = rhs_q.astype(jnp.float32) * col_scale
    return _ragged_f32(lhs_dq, rhs_dq, group_sizes_e).astype(lhs_mk.dtype)


def scaled_matmul_reference(
    lhs_bmk: jax.Array, rhs_bnk: jax.Array, lhs_scales: jax.Array, rhs_scales: jax.Array
) -> jax.Array:
    """f32 [b, m, n] = (lhs * repeat(lhs_scales)) @ (rhs * repeat(rhs_scales))^T, as jax.nn.scaled_matmul."""
    lhs_block = lhs_bmk.shape[-1] // lhs_scales.shape[-1]
    rhs_block = rhs_bnk.shape[-1] // rhs_scales.shape[-1]
    lhs = lhs_bmk.astype(jnp.float32) * jnp.repeat(lhs_scales.astype(jnp.float32), lhs_block, axis=-1)
    rhs = rhs_bnk.astype(jnp.float32) * jnp.repeat(rhs_scales.astype(jnp.float32), rhs_block, axis=-1)
    return jnp.einsum("bmk,bnk->bmn", lhs, rhs, precision=jax.lax.Precision.HIGHEST)


def gmm_mxfp8_reference(lhs_mk: jax.Array, rhs_ekn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
    """out [m, n] f32: the gmm with both operands MXFP8-quantised in 1x32 blocks along k."""
    lhs_q, lhs_scales = quantize_mxfp8(lhs_mk)  # [m, k], [m, k / 32]
    rhs_q, rhs_scales = quantize_mxfp8(jnp.swapaxes(rhs_ekn, 1, 2))  # [e, n, k], [e, n, k / 32]
    lhs_dq = dequantize_mxfp8(lhs_q, lhs_scales)
    rhs_dq = jnp.swapaxes(dequantize_mxfp8(rhs_q, rhs_scales), 1, 2)
    return _ragged_f32(lhs_dq, rhs_dq, group_sizes_e)
