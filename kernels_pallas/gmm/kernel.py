"""Grouped matmul kernels (Pallas, Triton backend; see kernels_pallas/gpu_backend.py).

Rows of ``lhs [m, k]`` are sorted by group: group ``e`` owns rows ``[offsets[e], offsets[e + 1])`` with
``offsets = [0, cumsum(group_sizes)]``. Rows past ``offsets[-1]`` belong to no group.

- ``gmm``:  ``out[r] = lhs[r] @ rhs[e(r)]`` (``rhs [e, k, n]``, or ``[e, n, k]`` read transposed), zero for
  rows of no group. Grid ``(m tiles, n tiles)``; a row tile loops over the groups that intersect it and
  accumulates ``(lhs * row_in_group) @ rhs[e]``, so each row collects exactly its own group's product and one
  unmasked store writes the tile. Tiles are only recomputed where a group boundary cuts them (at most
  ``e - 1`` extra tile passes in total), and empty groups inside a tile cost one masked pass.
- ``tgmm``: ``out[e] = lhs[rows of e]^T @ dy[rows of e]`` (``[e, k, n]``), the weight gradient. Grid
  ``(k tiles, n tiles, e)``; each program walks its group's rows in steps of ``block_m`` starting at the
  group's (unaligned) offset with masked loads; an empty group writes zeros.

Both accumulate in f32 and take group metadata as ordinary int32 inputs (Triton has no scalar prefetch).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kernels_pallas.pallas_call import jit_kernel, triton_call

_F32 = jnp.float32


def _dot(a: jax.Array, b: jax.Array, contract_a: int, contract_b: int) -> jax.Array:
    """2-D dot over one axis of each operand, accumulated in f32."""
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=_F32)


def tile_group_ranges(offsets_e1: jax.Array, m: int, block_m: int) -> tuple[jax.Array, jax.Array]:
    """Per row tile, the half-open range of groups whose rows intersect it.

    offsets_e1: [e + 1] int32 group offsets. Returns (lo, hi), each [cdiv(m, block_m)] int32: groups
    lo..hi-1 may own rows of the tile (empty groups inside the range are harmless, their mask is all false).
    """
    n_tiles = pl.cdiv(m, block_m)
    starts = jnp.arange(n_tiles, dtype=jnp.int32) * block_m
    ends = jnp.minimum(starts + block_m, m)
    # first group whose end lies past the tile start; one past the last group that starts before the tile end
    lo = jnp.searchsorted(offsets_e1[1:], starts, side="right").astype(jnp.int32)
    hi = jnp.searchsorted(offsets_e1[:-1], ends, side="left").astype(jnp.int32)
    return lo, hi


def row_tiling(offsets_e1: jax.Array, m: int, k: int, block_m: int) -> tuple[jax.Array, jax.Array, list]:
    """For a kernel on the (m tiles, n tiles) grid: each row tile's group range (lo, hi) and the specs of the
    kernel's first four inputs, lo, hi, the group offsets and lhs [m, k] (all whole in every program)."""
    lo, hi = tile_group_ranges(offsets_e1, m, block_m)
    tiles = pl.BlockSpec(lo.shape, lambda i, j: (0,))
    specs = [
        tiles,
        tiles,
        pl.BlockSpec(offsets_e1.shape, lambda i, j: (0,)),
        pl.BlockSpec((m, k), lambda i, j: (0, 0)),
    ]
    return lo, hi, specs


def _gmm_kernel(
    lo_ref, hi_ref, offsets_ref, lhs_ref, rhs_ref, out_ref, *, block_m, block_k, k, transpose_rhs
):
    i = pl.program_id(0)
    row0 = i * block_m
    rows = row0 + lax.broadcasted_iota(jnp.int32, (block_m,), 0)
    acc = jnp.zeros((block_m, out_ref.shape[1]), _F32)  # [block_m, block_n]

    def group_body(e, acc):
        in_group = (rows >= offsets_ref[e]) & (rows < offsets_ref[e + 1])

        def k_body(kb, acc):
            k_slice = pl.ds(kb * block_k, block_k)
            x = pl_triton.load(lhs_ref.at[pl.ds(row0, block_m), k_slice], mask=in_group[:, None], other=0.0)
            if transpose_rhs:  # rhs block [block_n, block_k]
                return acc + _dot(x, rhs_ref[e, :, k_slice], 1, 1)
            return acc + _dot(x, rhs_ref[e, k_slice, :], 1, 0)

        return lax.fori_loop(0, k // block_k, k_body, acc)

    acc = lax.fori_loop(lo_ref[i], hi_ref[i], group_body, acc)
    m = lhs_ref.shape[0]
    pl_triton.store(out_ref.at[pl.ds(row0, block_m), :], acc.astype(out_ref.dtype), mask=(rows < m)[:, None])


@jit_kernel("transpose_rhs", "block_m", "block_k", "block_n")
def gmm_pallas(
    lhs_mk: jax.Array,
    rhs: jax.Array,
    offsets_e1: jax.Array,
    *,
    transpose_rhs: bool,
    block_m: int,
    block_k: int,
    block_n: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> jax.Array:
    """out[m, n] with out[r] = lhs[r] @ rhs[e(r)] (rhs [e, k, n], or [e, n, k] if transpose_rhs).

    Requires k % block_k == 0 and n % block_n == 0; m is arbitrary (the last row tile is masked).
    """
    m, k = lhs_mk.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    e = rhs.shape[0]
    lo, hi, lead_specs = row_tiling(offsets_e1, m, k, block_m)
    kernel = functools.partial(
        _gmm_kernel, block_m=block_m, block_k=block_k, k=k, transpose_rhs=transpose_rhs
    )
    if transpose_rhs:
        rhs_spec = pl.BlockSpec((e, block_n, k), lambda i, j: (0, j, 0))
    else:
        rhs_spec = pl.BlockSpec((e, k, block_n), lambda i, j: (0, 0, j))
    return triton_call(
        kernel,
        grid=(pl.cdiv(m, block_m), n // block_n),
        in_specs=[*lead_specs, rhs_spec],
        out_specs=pl.BlockSpec((m, block_n), lambda i, j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), lhs_mk.dtype),
        name="gmm",
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interpret,
    )(lo, hi, offsets_e1, lhs_mk, rhs)


def _tgmm_kernel(offsets_ref, lhs_ref, dy_ref, out_ref, *, block_m):
    e = pl.program_id(2)
    start = offsets_ref[e]
    end = offsets_ref[e + 1]
    iota = lax.broadcasted_iota(jnp.int32, (block_m,), 0)

    def body(t, acc):
        row0 = start + t * block_m
        valid = (row0 + iota < end)[:, None]
        x = pl_triton.load(lhs_ref.at[pl.ds(row0, block_m), :], mask=valid, other=0.0)  # [block_m, block_k]
        dy = pl_triton.load(dy_ref.at[pl.ds(row0, block_m), :], mask=valid, other=0.0)  # [block_m, block_n]
        return acc + _dot(x, dy, 0, 0)

    n_steps = lax.div(end - start + block_m - 1, block_m)
    acc = lax.fori_loop(0, n_steps, body, jnp.zeros(out_ref.shape, _F32))
    out_ref[...] = acc.astype(out_ref.dtype)


@jit_kernel("num_groups", "out_dtype", "block_m", "block_k", "block_n")
def tgmm_pallas(
    lhs_mk: jax.Array,
    dy_mn: jax.Array,
    offsets_e1: jax.Array,
    *,
    num_groups: int,
    out_dtype: jnp.dtype,
    block_m: int,
    block_k: int,
    block_n: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> jax.Array:
    """out[e, k, n] = lhs[rows of e]^T @ dy[rows of e]; requires k % block_k == 0, n % block_n == 0."""
    m, k = lhs_mk.shape
    n = dy_mn.shape[1]
    kernel = functools.partial(_tgmm_kernel, block_m=block_m)
    return triton_call(
        kernel,
        grid=(k // block_k, n // block_n, num_groups),
        in_specs=[
            pl.BlockSpec((num_groups + 1,), lambda a, b, e: (0,)),
            pl.BlockSpec((m, block_k), lambda a, b, e: (0, a)),
            pl.BlockSpec((m, block_n), lambda a, b, e: (0, b)),
        ],
        out_specs=pl.BlockSpec((None, block_k, block_n), lambda a, b, e: (e, a, b)),
        out_shape=jax.ShapeDtypeStruct((num_groups, k, n), out_dtype),
        name="tgmm",
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interpret,
    )(offsets_e1, lhs_mk, dy_mn)
