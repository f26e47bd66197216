"""Decode attention kernel (Pallas, Triton backend; see kernels_pallas/gpu_backend.py): one new query per
row against its KV cache, split along the cache length (split-K / "flash decoding").

Shapes: q [b, g, r_pad, h] (the r query heads of kv head g, zero-padded to r_pad >= 16 rows because Triton
dots need 16), k/v cache [b, s, g, h], limit [b] int32 = number of visible cache entries of row b
(min(kv_len, position + 1), <= 0 for padding rows).

Grid (b, g, splits): a program reads one kv head's slice of ``split`` cache entries once for all r query
heads of the group (decode is bound by reading the cache, so each byte is read once), runs the online
softmax over its visible entries in base 2, and writes its normalised partial output and log2-sum-exp.
Entries past ``limit`` are never read. The splits are merged in ops.py:
    o = sum_i 2^(lse_i - M) o_i / sum_i 2^(lse_i - M),   M = max_i lse_i.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels_pallas.online_softmax import softmax_init, softmax_step
from kernels_pallas.pallas_call import jit_kernel, triton_call

_F32 = jnp.float32
LOG2E = math.log2(math.e)


def _dot(a: jax.Array, b: jax.Array, contract_a: int, contract_b: int) -> jax.Array:
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=_F32)


def _decode_kernel(limit_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, split, block_k):
    limit = limit_ref[pl.program_id(0)]
    start = pl.program_id(2) * split
    q = q_ref[...]  # [r_pad, h]
    r_pad, h = q.shape
    n_visible = jnp.clip(limit - start, 0, split)

    def body(j, carry):
        ks = pl.ds(j * block_k, block_k)
        z = _dot(q, k_ref[ks, :], 1, 1) * (scale * LOG2E)  # [r_pad, block_k]
        k_idx = j * block_k + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
        z = jnp.where((k_idx < n_visible)[None, :], z, -jnp.inf)
        return softmax_step(carry, z, v_ref[ks, :])

    init = softmax_init(r_pad, h)
    o, m, denom = lax.fori_loop(0, lax.div(n_visible + block_k - 1, block_k), body, init)
    has_keys = denom > 0
    l_safe = jnp.where(has_keys, denom, 1.0)
    o_ref[...] = o / l_safe[:, None]
    lse_ref[...] = jnp.where(has_keys, m + jnp.log2(l_safe), -jnp.inf)


@jit_kernel("scale", "split", "block_k")
def decode_partials(
    q_bgrh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    limit_b: jax.Array,
    *,
    scale: float,
    split: int,
    block_k: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Per-split partial outputs o [b, splits, g, r_pad, h] f32 and lse2 [b, splits, g, r_pad] f32.

    Needs s % split == 0 and split % block_k == 0. A split with no visible entry has lse2 = -inf, o = 0.
    """
    b, g, r_pad, h = q_bgrh.shape
    s = k_bsgh.shape[1]
    n_splits = s // split
    kv_spec = pl.BlockSpec((None, split, None, h), lambda bi, gi, si: (bi, si, gi, 0))
    return triton_call(
        functools.partial(_decode_kernel, scale=scale, split=split, block_k=block_k),
        grid=(b, g, n_splits),
        in_specs=[
            pl.BlockSpec((b,), lambda bi, gi, si: (0,)),
            pl.BlockSpec((None, None, r_pad, h), lambda bi, gi, si: (bi, gi, 0, 0)),
            kv_spec,
            kv_spec,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, r_pad, h), lambda bi, gi, si: (bi, si, gi, 0, 0)),
            pl.BlockSpec((None, None, None, r_pad), lambda bi, gi, si: (bi, si, gi, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((b, n_splits, g, r_pad, h), _F32),
            jax.ShapeDtypeStruct((b, n_splits, g, r_pad), _F32),
        ],
        name="decode_attention",
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interpret,
    )(limit_b, q_bgrh, k_bsgh, v_bsgh)
