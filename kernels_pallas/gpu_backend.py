"""Which Pallas GPU backend the kernels target, and when they run in interpret mode.

Backend: Triton. In jax 0.10 a ``pl.pallas_call`` without compiler params lowers through Mosaic GPU
(``jax_pallas_use_mosaic_gpu`` defaults to True), whose programming model (warpgroups, explicit TMA copies
and barriers, ``plgpu.kernel``) is a different kernel language from the block-level ``pallas_call`` style.
Passing Triton compiler params selects the Triton backend explicitly, which:

- lowers on a CPU-only machine (``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` emits a
  ``__gpu$xla.gpu.triton`` custom call holding the Triton IR; the PTX is built when XLA compiles for a GPU),
  so the GPU path is tested here without a GPU;
- handles masked loads at arbitrary (unaligned, data-dependent) row offsets, which the grouped matmuls need
  because group boundaries are not multiples of the tile size;
- runs fp8 (e4m3) x fp8 dots with f32 accumulation on Hopper (sm_90) through ``tl.dot``.

Triton constraints the kernels respect: every block is a power of two and matmul operands are at least 16 in
each dimension (the wrappers choose block sizes accordingly), the grid has at most three dimensions, and
there is no scalar prefetch (group metadata is passed as ordinary int32 inputs and read inside the kernel).
"""

import jax
from jax.experimental.pallas import triton as pl_triton

# jax 0.10 / 0.11 call it CompilerParams; releases before 0.6 called it TritonCompilerParams.
_TritonParams = getattr(pl_triton, "CompilerParams", None) or pl_triton.TritonCompilerParams


def triton_params(num_warps: int | None = None, num_stages: int | None = None):
    """Compiler params that select the Triton backend for a ``pl.pallas_call`` on GPU."""
    return _TritonParams(num_warps=num_warps, num_stages=num_stages)


def resolve_interpret(interpret: bool | None) -> bool:
    """None means: interpret on CPU (the only way Pallas runs there), compile natively elsewhere."""
    if interpret is None:
        return jax.default_backend() == "cpu"
    return bool(interpret)
