"""float8 e4m3 quantisation formats used by the fp8 grouped matmul and its reference.

Per-channel scaling (what the Hopper kernel uses): one f32 scale per lhs row and per (expert, output
column) of rhs, ``scale = amax / 448`` over the contracted axis, ``q = cast_e4m3(clip(x / scale, +-448))``.
Clipping matters: a value that rounds past 448 would otherwise become NaN in float8_e4m3fn. An all-zero
channel gets scale 1. Inputs must be finite.

Block scaling (OCP MX, "MXFP8"): blocks of 32 consecutive elements along the contracted axis share a
power-of-two E8M0 scale ``2^(floor(log2 amax) - 8)`` (8: the exponent of e4m3's largest normal,
448 = 1.75 * 2^8); scaled values lie in [256, 512) at the block maximum and are clipped to 448. This is
the layout of ``jax.nn.scaled_matmul`` (values [..., K] e4m3, scales [..., K / 32] float8_e8m0fnu),
which runs at speed only on Blackwell; here it is emulated so the format can be tested anywhere.

Error per element (e4m3 has 3 mantissa bits; the smallest normal is 2^-6, the subnormal spacing 2^-9):
per-channel: |dequant(q) - x| <= 2^-4 |x| + 2^-10 * scale; MX blocks: <= 2^-3 |x| + 2^-10 * scale (the
clip at 448 costs up to 1/8).
"""

import jax
import jax.numpy as jnp

E4M3 = jnp.float8_e4m3fn
E4M3_MAX = 448.0
MX_BLOCK = 32
_E4M3_MAX_EXP = 8


def quantize_channels(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Per-channel e4m3 quantisation with amax taken over `axis` (the contracted one).

    Returns (q in float8_e4m3fn with x's shape, scale f32 with `axis` kept as size 1); x ~ q * scale.
    """
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=axis, keepdims=True)
    scale = jnp.where(amax > 0, amax / E4M3_MAX, 1.0)
    q = jnp.clip(xf / scale, -E4M3_MAX, E4M3_MAX).astype(E4M3)
    return q, scale


def channel_error_bound(x: jax.Array, scale: jax.Array) -> jax.Array:
    """Elementwise bound on |q * scale - x| for quantize_channels (same shape as x)."""
    return 2.0**-4 * jnp.abs(x.astype(jnp.float32)) + 2.0**-10 * scale


def quantize_mxfp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """MXFP8 along the last axis (a multiple of 32): returns (q [..., K] e4m3, scales [..., K/32] e8m0)."""
    *lead, k = x.shape
    if k % MX_BLOCK:
        raise ValueError(f"MXFP8 needs the contracted size to be a multiple of {MX_BLOCK}, got {k}")
    xb = x.astype(jnp.float32).reshape(*lead, k // MX_BLOCK, MX_BLOCK)
    amax = jnp.max(jnp.abs(xb), axis=-1, keepdims=True)
    exponent = jnp.where(amax > 0, jnp.floor(jnp.log2(jnp.where(amax > 0, amax, 1.0))) - _E4M3_MAX_EXP, 0.0)
    exponent = jnp.clip(exponent, -127.0, 127.0)  # the E8M0 range
    scale = jnp.exp2(exponent)
    q = jnp.clip(xb / scale, -E4M3_MAX, E4M3_MAX).astype(E4M3).reshape(*lead, k)
    return q, scale[..., 0].astype(jnp.float8_e8m0fnu)


def dequantize_mxfp8(q: jax.Array, scales: jax.Array) -> jax.Array:
    """f32 values q * scale of each element's block."""
    return q.astype(jnp.float32) * jnp.repeat(scales.astype(jnp.float32), MX_BLOCK, axis=-1)


def mx_error_bound(x: jax.Array, scales: jax.Array) -> jax.Array:
    """Elementwise bound on |dequantize_mxfp8(quantize_mxfp8(x)) - x| (x's shape)."""
    block_scale = jnp.repeat(scales.astype(jnp.float32), MX_BLOCK, axis=-1)
    return 2.0**-3 * jnp.abs(x.astype(jnp.float32)) + 2.0**-10 * block_scale
