"""Flash attention kernels (Pallas, Triton backend; see kernels_pallas/gpu_backend.py): forward, dq, dk/dv.

Shapes: q, do, o [b, t, n, h]; k, v, dk, dv [b, s, g, h] with n = g * r (GQA: query head i reads kv head
i // r); q_pos [b, t] int32; kv_len [b] int32. Key j is visible to the query at position p iff
j <= p and j < kv_len[b]; a query with no visible key (p < 0: padding) gets output 0 and zero gradients.

Online softmax in base 2 (FlashAttention-2, Dao 2023, Algorithm 1): with z = (q . k) * scale * log2(e),
    m_j = max(m_{j-1}, rowmax z_j),  l_j = 2^(m_{j-1} - m_j) l_{j-1} + rowsum 2^(z_j - m_j),
    o_j = 2^(m_{j-1} - m_j) o_{j-1} + 2^(z_j - m_j) v_j,   o = o_J / l_J,   lse2 = m_J + log2 l_J.
Masked scores are -inf; m is replaced by 0 while still -inf, so no inf - inf appears.

Backward (Algorithm 2): P = 2^(z - lse2) on visible keys, dP = dO V^T, dS = P (dP - delta) with
delta = rowsum(dO * O), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO. The dk/dv kernel owns one kv head
and loops over its r query heads, so GQA needs no atomics; query tiles whose largest position is below the
key tile are skipped.
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


def _visible(q_pos: jax.Array, k_start, block_k: int, kv_len) -> jax.Array:
    """[len(q_pos), block_k] bool: key k_start + c is visible to the query at q_pos[i]."""
    k_pos = k_start + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
    return (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < kv_len)


def _n_key_blocks(q_pos: jax.Array, kv_len, block_k: int):
    """Key tiles holding a key visible to some of these queries: cdiv(min(kv_len, max pos + 1), block_k)."""
    limit = jnp.maximum(jnp.minimum(kv_len, jnp.max(q_pos) + 1), 0)
    return lax.div(limit + block_k - 1, block_k)


def _fwd_kernel(kv_len_ref, pos_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, block_k):
    kv_len = kv_len_ref[pl.program_id(2)]
    q = q_ref[...]  # [block_q, h]
    q_pos = pos_ref[...]  # [block_q]
    block_q, h = q.shape

    def body(j, carry):
        ks = pl.ds(j * block_k, block_k)
        z = _dot(q, k_ref[ks, :], 1, 1) * (scale * LOG2E)  # [block_q, block_k]
        z = jnp.where(_visible(q_pos, j * block_k, block_k, kv_len), z, -jnp.inf)
        return softmax_step(carry, z, v_ref[ks, :])

    init = softmax_init(block_q, h)
    o, m, denom = lax.fori_loop(0, _n_key_blocks(q_pos, kv_len, block_k), body, init)
    has_keys = denom > 0
    o_ref[...] = (o / jnp.where(has_keys, denom, 1.0)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(has_keys, m + jnp.log2(jnp.where(has_keys, denom, 1.0)), 0.0)


def _common_specs(s, h, r, block_q):
    """Specs for the kernels gridded over (query heads, query tiles, batch)."""
    q_spec = pl.BlockSpec((None, block_q, None, h), lambda i, qi, b: (b, qi, i, 0))
    kv_spec = pl.BlockSpec((None, s, None, h), lambda i, qi, b: (b, 0, i // r, 0))
    row_spec = pl.BlockSpec((None, None, block_q), lambda i, qi, b: (b, i, qi))  # [b, n, t] stats
    pos_spec = pl.BlockSpec((None, block_q), lambda i, qi, b: (b, qi))
    return q_spec, kv_spec, row_spec, pos_spec


@jit_kernel("scale", "block_q", "block_k")
def flash_forward(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    *,
    scale: float,
    block_q: int,
    block_k: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> tuple[jax.Array, jax.Array]:
    """Returns (o [b, t, n, h] in q's dtype, lse2 [b, n, t] f32). Needs t % block_q == 0, s % block_k == 0."""
    b, t, n, h = q_btnh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    q_spec, kv_spec, row_spec, pos_spec = _common_specs(s, h, n // g, block_q)
    return triton_call(
        functools.partial(_fwd_kernel, scale=scale, block_k=block_k),
        grid=(n, t // block_q, b),
        in_specs=[pl.BlockSpec((b,), lambda i, qi, bb: (0,)), pos_spec, q_spec, kv_spec, kv_spec],
        out_specs=[q_spec, row_spec],
        out_shape=[
            jax.ShapeDtypeStruct(q_btnh.shape, q_btnh.dtype),
            jax.ShapeDtypeStruct((b, n, t), _F32),
        ],
        name="flash_forward",
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interpret,
    )(kv_len_b, q_pos_bt, q_btnh, k_bsgh, v_bsgh)


def _dq_kernel(
    kv_len_ref, pos_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, block_k
):
    kv_len = kv_len_ref[pl.program_id(2)]
    q = q_ref[...]
    do = do_ref[...]
    q_pos = pos_ref[...]
    lse = lse_ref[...]
    delta = delta_ref[...]

    def body(j, dq):
        ks = pl.ds(j * block_k, block_k)
        k = k_ref[ks, :]
        z = _dot(q, k, 1, 1) * (scale * LOG2E)
        visible = _visible(q_pos, j * block_k, block_k, kv_len)
        p = jnp.where(visible, jnp.exp2(z - lse[:, None]), 0.0)
        dp = _dot(do, v_ref[ks, :], 1, 1)
        ds = p * (dp - delta[:, None])
        return dq + _dot(ds.astype(k.dtype), k, 1, 0)

    dq = lax.fori_loop(0, _n_key_blocks(q_pos, kv_len, block_k), body, jnp.zeros(q.shape, _F32))
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(
    kv_len_ref,
    pos_ref,
    block_max_pos_ref,
    q_ref,
    k_ref,
    v_ref,
    do_ref,
    lse_ref,
    delta_ref,
    dk_ref,
    dv_ref,
    *,
    scale,
    block_q,
    r,
):
    k_tile = pl.program_id(0)
    kv_len = kv_len_ref[pl.program_id(2)]
    k = k_ref[...]  # [block_k, h]
    v = v_ref[...]
    block_k = k.shape[0]
    k_start = k_tile * block_k
    n_q_tiles = block_max_pos_ref.shape[0]

    def q_tile(i, head, carry):
        dk, dv = carry
        qs = pl.ds(i * block_q, block_q)
        q = q_ref[qs, head, :]  # [block_q, h]
        do = do_ref[qs, head, :]
        q_pos = pos_ref[qs]
        z = _dot(q, k, 1, 1) * (scale * LOG2E)  # [block_q, block_k]
        visible = _visible(q_pos, k_start, block_k, kv_len)
        p = jnp.where(visible, jnp.exp2(z - lse_ref[head, qs][:, None]), 0.0)
        dv = dv + _dot(p.astype(do.dtype), do, 0, 0)
        dp = _dot(do, v, 1, 1)
        ds = p * (dp - delta_ref[head, qs][:, None])
        dk = dk + _dot(ds.astype(q.dtype), q, 0, 0)
        return dk, dv

    def head_body(head, carry):
        def tile_body(i, carry):
            # a query tile whose largest position is below this key tile sees none of its keys
            return lax.cond(block_max_pos_ref[i] >= k_start, lambda c: q_tile(i, head, c), lambda c: c, carry)

        return lax.fori_loop(0, n_q_tiles, tile_body, carry)

    zeros = jnp.zeros(k.shape, _F32)
    n_heads = r * (k_start < kv_len).astype(jnp.int32)  # key tiles past the row's length get no gradient
    dk, dv = lax.fori_loop(0, n_heads, head_body, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


@jit_kernel("scale", "block_q", "block_k", "block_q_bwd", "block_k_bwd")
def flash_backward(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    o_btnh: jax.Array,
    lse_bnt: jax.Array,
    do_btnh: jax.Array,
    *,
    scale: float,
    block_q: int,
    block_k: int,
    block_q_bwd: int,
    block_k_bwd: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Returns (dq, dk, dv) in the dtypes of q, k, v."""
    b, t, n, h = q_btnh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    r = n // g
    delta_bnt = jnp.einsum("btnh,btnh->bnt", o_btnh.astype(_F32), do_btnh.astype(_F32))
    launch = dict(num_warps=num_warps, num_stages=num_stages, interpret=interpret)
    kv_len_spec = pl.BlockSpec((b,), lambda *_: (0,))

    q_spec, kv_spec, row_spec, pos_spec = _common_specs(s, h, r, block_q)
    dq = triton_call(
        functools.partial(_dq_kernel, scale=scale, block_k=block_k),
        grid=(n, t // block_q, b),
        in_specs=[kv_len_spec, pos_spec, q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec],
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q_btnh.shape, q_btnh.dtype),
        name="flash_dq",
        **launch,
    )(kv_len_b, q_pos_bt, q_btnh, k_bsgh, v_bsgh, do_btnh, lse_bnt, delta_bnt)

    n_q_tiles = t // block_q_bwd
    block_max_pos = jnp.max(q_pos_bt.reshape(b, n_q_tiles, block_q_bwd), axis=2)  # [b, t tiles]
    group_q_spec = pl.BlockSpec((None, t, r, h), lambda kt, gi, bb: (bb, 0, gi, 0))
    group_row_spec = pl.BlockSpec((None, r, t), lambda kt, gi, bb: (bb, gi, 0))
    kv_tile_spec = pl.BlockSpec((None, block_k_bwd, None, h), lambda kt, gi, bb: (bb, kt, gi, 0))
    dk, dv = triton_call(
        functools.partial(_dkv_kernel, scale=scale, block_q=block_q_bwd, r=r),
        grid=(s // block_k_bwd, g, b),
        in_specs=[
            kv_len_spec,
            pl.BlockSpec((None, t), lambda kt, gi, bb: (bb, 0)),
            pl.BlockSpec((None, n_q_tiles), lambda kt, gi, bb: (bb, 0)),
            group_q_spec,
            kv_tile_spec,
            kv_tile_spec,
            group_q_spec,
            group_row_spec,
            group_row_spec,
        ],
        out_specs=[kv_tile_spec, kv_tile_spec],
        out_shape=[
            jax.ShapeDtypeStruct(k_bsgh.shape, k_bsgh.dtype),
            jax.ShapeDtypeStruct(v_bsgh.shape, v_bsgh.dtype),
        ],
        name="flash_dkv",
        **launch,
    )(kv_len_b, q_pos_bt, block_max_pos, q_btnh, k_bsgh, v_bsgh, do_btnh, lse_bnt, delta_bnt)
    return dq, dk, dv
