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

from kernels_pallas.block_sizes import check_triton_tiles, fit_block, row_block
from kernels_pallas.gmm.kernel import gmm_pallas, tgmm_pallas
from kernels_pallas.gmm.reference import group_offsets
from kernels_pallas.gpu_backend import resolve_interpret


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
    block_k, block_n = fit_block(k, config.block_k), fit_block(n, config.block_n)
    check_triton_tiles(config.interpret, block_k=block_k, block_n=block_n)
    return gmm_pallas(
        lhs_mk,
        rhs.astype(lhs_mk.dtype),  # Triton dots need one operand dtype
        offsets_e1,
        transpose_rhs=transpose_rhs,
        block_m=row_block(m, config.block_m),
        block_k=block_k,
        block_n=block_n,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        interpret=config.interpret,
    )


def transposed_grouped_matmul(
    lhs_mk: jax.Array, dy_mn: jax.Array, offsets_e1: jax.Array, out_dtype, config: GmmConfig
) -> jax.Array:
    """[e, k, n] per-group lhs^T @ dy with tiles fitted to the shapes."""
    k, n = lhs_mk.shape[1], dy_mn.shape[1]
    # the output tile is [block_k, block_n]: both sides take the (larger) n tile size
    block_k, block_n = fit_block(k, config.block_n), fit_block(n, config.block_n)
    check_triton_tiles(config.interpret, block_k=block_k, block_n=block_n)
    return tgmm_pallas(
        lhs_mk,
        dy_mn.astype(lhs_mk.dtype),
        offsets_e1,
        num_groups=offsets_e1.shape[0] - 1,
        out_dtype=jnp.dtype(out_dtype),
        block_m=row_block(lhs_mk.shape[0], config.block_m),
        block_k=block_k,
        block_n=block_n,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        interpret=config.interpret,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm(lhs_mk, rhs_ekn, group_sizes_e, config):
    offsets = group_offsets(group_sizes_e, lhs_mk.shape[0])
    return grouped_matmul(lhs_mk, rhs_ekn, offsets, config)


def _gmm_fwd(lhs_mk, rhs_ekn, group_sizes_e, config):
    offsets = group_offsets(group_sizes_e, lhs_mk.shape[0])
    return grouped_matmul(lhs_mk, rhs_ekn, offsets, config), (lhs_mk, rhs_ekn, offsets)


def _gmm_bwd(config, residuals, dy_mn):
    lhs_mk, rhs_ekn, offsets = residuals
    d_lhs = grouped_matmul(dy_mn.astype(lhs_mk.dtype), rhs_ekn, offsets, config, transpose_rhs=True)
    d_rhs = transposed_grouped_matmul(lhs_mk, dy_mn, offsets, rhs_ekn.dtype, config)
    return d_lhs, d_rhs, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


@functools.partial(jax.jit, static_argnames=("config", "interpret"))
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
    config = config or GmmConfig()
    config = dataclasses.replace(config, interpret=resolve_interpret(interpret))
    return _gmm(lhs_md, rhs_edf, group_sizes_e, config)
