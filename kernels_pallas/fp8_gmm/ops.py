"""Public fp8 grouped matmul: ``gmm_fp8(lhs_md, rhs_edf, group_sizes_e) -> out_mf``.

Forward: lhs quantised per row and rhs per (expert, column) to float8_e4m3fn (clipped to +-448 before the
cast, quantize.py), fp8 x fp8 products accumulated in f32 by the Pallas kernel (kernel.py, Triton backend),
scales applied in the epilogue; output in lhs's dtype, rows past sum(group_sizes) zero.

Error against the exact f32 product (bound tested in tests/kernels_pallas/test_fp8_gmm_kernel.py): with
delta(x) = 2^-4 |x| + 2^-10 amax(channel)/448 for each operand,
    |gmm_fp8 - gmm_f32| <= (|x| + delta(x)) @ (|w| + delta(w)) - |x| @ |w|   (per group),
i.e. at most ~13% of |x| @ |w| in the worst case; on Gaussian data the relative error is about 3-4%.

Backward: straight-through. Quantisation is treated as the identity, so the gradients are those of the
unquantised gmm, computed by the bf16/f32 kernels of kernels_pallas/gmm (d lhs = gmm(d out, rhs^T),
d rhs = tgmm(lhs, d out)) on the unquantised operands kept as residuals.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from kernels_pallas.block_sizes import matmul_tiles
from kernels_pallas.fp8_gmm.kernel import fp8_gmm_pallas
from kernels_pallas.fp8_gmm.quantize import quantize_channels
from kernels_pallas.gmm.ops import GmmConfig, gmm_backward
from kernels_pallas.gmm.reference import group_offsets
from kernels_pallas.pallas_call import jit_op, launch_args, op_config


@dataclasses.dataclass(frozen=True)
class Fp8GmmConfig:
    """Tiles of the fp8 forward (twice as deep in k as bf16 for the same bytes) and the bf16 backward."""

    block_m: int = 128
    block_k: int = 128
    block_n: int = 128
    num_warps: int | None = 8
    num_stages: int | None = 3
    backward: GmmConfig = GmmConfig()
    interpret: bool = False


def _forward(lhs_mk, rhs_ekn, offsets, config):
    m, k = lhs_mk.shape
    n = rhs_ekn.shape[2]
    tiles = matmul_tiles(config.interpret, m, k, n, config.block_m, config.block_k, config.block_n)
    lhs_q, row_scale = quantize_channels(lhs_mk, axis=1)
    # quantise over k and write [e, n, k]: K-major for Hopper's fp8 MMA (one fused XLA pass over rhs)
    rhs_q, col_scale = quantize_channels(jnp.swapaxes(rhs_ekn, 1, 2), axis=2)
    return fp8_gmm_pallas(
        lhs_q,
        row_scale[:, 0],
        rhs_q,
        col_scale[:, :, 0],
        offsets,
        out_dtype=lhs_mk.dtype,
        **tiles,
        **launch_args(config),
    )


def _gmm_fp8_fwd(lhs_mk, rhs_ekn, group_sizes_e, config):
    offsets = group_offsets(group_sizes_e, lhs_mk.shape[0])
    return _forward(lhs_mk, rhs_ekn, offsets, config), (lhs_mk, rhs_ekn, offsets)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm_fp8(lhs_mk, rhs_ekn, group_sizes_e, config):
    return _gmm_fp8_fwd(lhs_mk, rhs_ekn, group_sizes_e, config)[0]


def _gmm_fp8_bwd(config, residuals, dy_mn):
    bwd = dataclasses.replace(config.backward, interpret=config.interpret)
    return *gmm_backward(residuals, dy_mn, bwd), None


_gmm_fp8.defvjp(_gmm_fp8_fwd, _gmm_fp8_bwd)


@jit_op
def gmm_fp8(
    lhs_md: jax.Array,
    rhs_edf: jax.Array,
    group_sizes_e: jax.Array,
    *,
    config: Fp8GmmConfig | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """fp8 grouped matmul with ragged_dot semantics: lhs [m, d] sorted by group, rhs [e, d, f] -> [m, f].

    interpret: None picks Pallas interpret mode on CPU only.
    """
    return _gmm_fp8(lhs_md, rhs_edf, group_sizes_e, op_config(config, Fp8GmmConfig, interpret))
