"""Public grouped matmul for the MoE experts: ``gmm(lhs_md, rhs_edf, group_sizes_e) -> out_mf``.

Same semantics as ``jax.lax.ragged_dot`` (see reference.py), computed by the Pallas kernels in kernel.py
(Triton backend), differentiable through a custom_vjp:

    d lhs = gmm(d out, rhs^T)          (each row against its own expert, rhs read transposed)
    d rhs[e] = lhs[rows of e]^T @ d out[rows of e]   ("tgmm")

f32 accumulation; the output has lhs's dtype, d rhs has rhs's dtype. On CPU the kernels run in Pallas
interpret mode (selected automatically); pass ``interpret=False`` to lower for a GPU.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from kernels_pallas.block_sizes import matmul_tiles
from kernels_pallas.gmm.kernel import gmm_pallas, tgmm_pallas
from kernels_pallas.gmm.reference import group_offsets
from kernels_pallas.pallas_call import jit_op, launch_args, op_config


@dataclasses.dataclass(frozen=True)
class GmmConfig:
    """Tile sizes (upper bounds: shrunk to fit the shapes) and Triton launch parameters."""

    block_m: int = 128
    block_k: int = 64
    block_n: int = 128
    num_warps: int | None = 8
    num_stages: int | None = 3
    interpret: bool = False


def grouped_matmul(
    lhs_mk: jax.Array, rhs: jax.Array, offsets_e1: jax.Array, config: GmmConfig, transpose_rhs: bool = False
) -> jax.Array:
    """Forward kernel call with tiles fitted to the shapes; rhs [e, k, n] (or [e, n, k] if transpose_rhs)."""
    m, k = lhs_mk.shape
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    tiles = matmul_tiles(config.interpret, m, k, n, config.block_m, config.block_k, config.block_n)
    # Triton dots need one operand dtype
    rhs = rhs.astype(lhs_mk.dtype)
    return gmm_pallas(lhs_mk, rhs, offsets_e1, transpose_rhs=transpose_rhs, **tiles, **launch_args(config))


def transposed_grouped_matmul(
    lhs_mk: jax.Array, dy_mn: jax.Array, offsets_e1: jax.Array, out_dtype, config: GmmConfig
) -> jax.Array:
    """[e, k, n] per-group lhs^T @ dy with tiles fitted to the shapes."""
    m, k = lhs_mk.shape
    n = dy_mn.shape[1]
    # the output tile is [block_k, block_n]: both sides take the (larger) n tile size
    tiles = matmul_tiles(config.interpret, m, k, n, config.block_m, config.block_n, config.block_n)
    return tgmm_pallas(
        lhs_mk,
        dy_mn.astype(lhs_mk.dtype),
        offsets_e1,
        num_groups=offsets_e1.shape[0] - 1,
        out_dtype=jnp.dtype(out_dtype),
        **tiles,
        **launch_args(config),
    )


def gmm_backward(residuals: tuple, dy_mn: jax.Array, config: GmmConfig) -> tuple[jax.Array, jax.Array]:
    """(d lhs, d rhs) of out = gmm(lhs, rhs) from residuals (lhs [m, k], rhs [e, k, n], offsets) and d out."""
    lhs_mk, rhs_ekn, offsets = residuals
    d_lhs = grouped_matmul(dy_mn.astype(lhs_mk.dtype), rhs_ekn, offsets, config, transpose_rhs=True)
    d_rhs = transposed_grouped_matmul(lhs_mk, dy_mn, offsets, rhs_ekn.dtype, config)
    return d_lhs, d_rhs


def _gmm_fwd(lhs_mk, rhs_ekn, group_sizes_e, config):
    offsets = group_offsets(group_sizes_e, lhs_mk.shape[0])
    return grouped_matmul(lhs_mk, rhs_ekn, offsets, config), (lhs_mk, rhs_ekn, offsets)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm(lhs_mk, rhs_ekn, group_sizes_e, config):
    return _gmm_fwd(lhs_mk, rhs_ekn, group_sizes_e, config)[0]


def _gmm_bwd(config, residuals, dy_mn):
    return *gmm_backward(residuals, dy_mn, config), None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@jit_op
def gmm(
    lhs_md: jax.Array,
    rhs_edf: jax.Array,
    group_sizes_e: jax.Array,
    *,
    config: GmmConfig | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Grouped matmul with ragged_dot semantics.

    lhs_md: [m, d] rows sorted by group; rhs_edf: [e, d, f]; group_sizes_e: [e] int. Returns [m, f] in
    lhs's dtype; rows past sum(group_sizes) are zero. interpret: None picks interpret mode on CPU only.
    """
    return _gmm(lhs_md, rhs_edf, group_sizes_e, op_config(config, GmmConfig, interpret))
