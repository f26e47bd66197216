"""fp8 grouped matmul kernel (Pallas, Triton backend; see kernels_pallas/gpu_backend.py), aimed at Hopper.

Inputs are already quantised (quantize.py): lhs_q [m, k] e4m3 with one f32 scale per row, rhs_q [e, n, k]
e4m3 with one f32 scale per (expert, column), stored k-contiguous ("K-major") because Hopper's fp8 tensor
core instructions (wgmma) take both operands K-major; the quantisation pass writes that layout for free.

Per-channel scales factor out of the k sum, so the inner loop is a plain fp8 x fp8 -> f32 dot and scales are
applied once per group in the epilogue:
    out[r, c] = row_scale[r] * col_scale[e(r), c] * sum_k lhs_q[r, k] rhs_q[e(r), c, k].
Tiling and group handling are those of the bf16 gmm (kernels_pallas/gmm/kernel.py): grid (m tiles, n tiles),
a row tile loops over the groups intersecting it with row masks; rows of no group are zero.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from kernels_pallas.gmm.kernel import row_tiling
from kernels_pallas.pallas_call import jit_kernel, triton_call

_F32 = jnp.float32


def _fp8_gmm_kernel(
    lo_ref,
    hi_ref,
    offsets_ref,
    lhs_ref,
    row_scale_ref,
    rhs_ref,
    col_scale_ref,
    out_ref,
    *,
    block_m,
    block_k,
    k,
):
    i = pl.program_id(0)
    row0 = i * block_m
    rows = row0 + lax.broadcasted_iota(jnp.int32, (block_m,), 0)
    block_n = out_ref.shape[1]
    m = lhs_ref.shape[0]

    def group_body(e, acc):
        in_group = (rows >= offsets_ref[e]) & (rows < offsets_ref[e + 1])

        def k_body(kb, acc_e):
            k_slice = pl.ds(kb * block_k, block_k)
            x = pl_triton.load(lhs_ref.at[pl.ds(row0, block_m), k_slice], mask=in_group[:, None], other=0.0)
            w = rhs_ref[e, :, k_slice]  # [block_n, block_k]
            return acc_e + lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=_F32)

        acc_e = lax.fori_loop(0, k // block_k, k_body, jnp.zeros((block_m, block_n), _F32))
        return acc + acc_e * col_scale_ref[e, :][None, :]

    acc = lax.fori_loop(lo_ref[i], hi_ref[i], group_body, jnp.zeros((block_m, block_n), _F32))
    valid = rows < m
    row_scale = pl_triton.load(row_scale_ref.at[pl.ds(row0, block_m)], mask=valid, other=0.0)
    out = acc * row_scale[:, None]
    pl_triton.store(out_ref.at[pl.ds(row0, block_m), :], out.astype(out_ref.dtype), mask=valid[:, None])


@jit_kernel("out_dtype", "block_m", "block_k", "block_n")
def fp8_gmm_pallas(
    lhs_q_mk: jax.Array,
    row_scale_m: jax.Array,
    rhs_q_enk: jax.Array,
    col_scale_en: jax.Array,
    offsets_e1: jax.Array,
    *,
    out_dtype,
    block_m: int,
    block_k: int,
    block_n: int,
    num_warps: int | None,
    num_stages: int | None,
    interpret: bool,
) -> jax.Array:
    """out [m, n] in out_dtype; needs k % block_k == 0 and n % block_n == 0 (m is masked)."""
    m, k = lhs_q_mk.shape
    e, n, _ = rhs_q_enk.shape
    lo, hi, lead_specs = row_tiling(offsets_e1, m, k, block_m)
    kernel = functools.partial(_fp8_gmm_kernel, block_m=block_m, block_k=block_k, k=k)
    return triton_call(
        kernel,
        grid=(pl.cdiv(m, block_m), n // block_n),
        in_specs=[
            *lead_specs,
            pl.BlockSpec((m,), lambda i, j: (0,)),
            pl.BlockSpec((e, block_n, k), lambda i, j: (0, j, 0)),
            pl.BlockSpec((e, block_n), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((m, block_n), lambda i, j: (0, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        name="fp8_gmm",
        num_warps=num_warps,
        num_stages=num_stages,
        interpret=interpret,
    )(lo, hi, offsets_e1, lhs_q_mk, row_scale_m, rhs_q_enk, col_scale_en)
