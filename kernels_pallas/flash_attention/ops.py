"""Public flash attention: ``flash_attention(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b) -> o_btnh``.

Causal GQA attention with per-row lengths (semantics in reference.py), forward and backward through the
Pallas kernels in kernel.py (Triton backend) under a custom_vjp. Scale 1/sqrt(h). t and s are padded up
to the tile sizes when needed (padded queries get position -1, padded keys lie past kv_len).
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from kernels_pallas.block_sizes import check_triton_tiles, row_block
from kernels_pallas.flash_attention.kernel import flash_backward, flash_forward
from kernels_pallas.pallas_call import jit_op, launch_args, op_config


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """Tile sizes (shrunk for short sequences, never below 16) and Triton launch parameters."""

    block_q: int = 128
    block_k: int = 64
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int | None = 8
    num_stages: int | None = 2
    interpret: bool = False


def _pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _tiles(config: FlashConfig, t: int, s: int) -> dict:
    # one padded length per axis serves forward and backward: the larger tile is a multiple of the smaller
    bq = row_block(t, config.block_q)
    bq_bwd = row_block(t, config.block_q_bwd)
    bk = row_block(s, config.block_k)
    bk_bwd = row_block(s, config.block_k_bwd)
    return dict(
        block_q=bq,
        block_k=bk,
        block_q_bwd=bq_bwd,
        block_k_bwd=bk_bwd,
        t_pad=-(-t // max(bq, bq_bwd)) * max(bq, bq_bwd),
        s_pad=-(-s // max(bk, bk_bwd)) * max(bk, bk_bwd),
    )


def _padded(q, k, v, q_pos, kv_len, tiles):
    q = _pad_axis(q, 1, tiles["t_pad"])
    q_pos = _pad_axis(q_pos.astype(jnp.int32), 1, tiles["t_pad"], value=-1)
    k = _pad_axis(k, 1, tiles["s_pad"])
    v = _pad_axis(v, 1, tiles["s_pad"])
    kv_len = jnp.clip(kv_len.astype(jnp.int32), 0, k.shape[1])
    return q, k, v, q_pos, kv_len


def _forward(q, k, v, q_pos, kv_len, config):
    """Returns (o [b, t, n, h], o padded, lse padded)."""
    t, s, h = q.shape[1], k.shape[1], q.shape[3]
    check_triton_tiles(config.interpret, head_dim=h)
    tiles = _tiles(config, t, s)
    o_pad, lse = flash_forward(
        *_padded(q, k, v, q_pos, kv_len, tiles),
        scale=1.0 / math.sqrt(h),
        block_q=tiles["block_q"],
        block_k=tiles["block_k"],
        **launch_args(config),
    )
    return o_pad[:, :t], o_pad, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash(q, k, v, q_pos, kv_len, config):
    return _forward(q, k, v, q_pos, kv_len, config)[0]


def _flash_fwd(q, k, v, q_pos, kv_len, config):
    o, o_pad, lse = _forward(q, k, v, q_pos, kv_len, config)
    return o, (q, k, v, q_pos, kv_len, o_pad, lse)


def _flash_bwd(config, residuals, do):
    q, k, v, q_pos, kv_len, o_pad, lse = residuals
    t, s, h = q.shape[1], k.shape[1], q.shape[3]
    tiles = _tiles(config, t, s)
    dq, dk, dv = flash_backward(
        *_padded(q, k, v, q_pos, kv_len, tiles),
        o_pad,
        lse,
        _pad_axis(do.astype(q.dtype), 1, tiles["t_pad"]),
        scale=1.0 / math.sqrt(h),
        block_q=tiles["block_q"],
        block_k=tiles["block_k"],
        block_q_bwd=tiles["block_q_bwd"],
        block_k_bwd=tiles["block_k_bwd"],
        **launch_args(config),
    )
    return dq[:, :t], dk[:, :s], dv[:, :s], None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


@jit_op
def flash_attention(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    *,
    config: FlashConfig | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Causal GQA attention: o [b, t, n, h] in q's dtype (n % g == 0; positions < 0 mark padding).

    interpret: None picks Pallas interpret mode on CPU only.
    """
    config = op_config(config, FlashConfig, interpret)
    # Triton dots take one operand dtype; the casts sit outside the custom_vjp, so autodiff handles them
    k_bsgh, v_bsgh = k_bsgh.astype(q_btnh.dtype), v_bsgh.astype(q_btnh.dtype)
    return _flash(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b, config)
