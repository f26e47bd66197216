"""Every kernel lowers for CUDA on this CPU-only machine, through the Triton backend, forward and backward.

``jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`` runs the Pallas -> Triton IR lowering of each
kernel and wraps it in an XLA custom call: with jaxlib 0.10 a ``__gpu$xla.gpu.triton`` call holding the
Triton IR (PTX is produced when XLA compiles for a real GPU); later jaxlibs compile the kernel to PTX during
lowering and emit ``triton_kernel_call_ffi``. Shapes are realistic-sized tiles in bf16, default tiles.

Pallas 0.10 does not verify the Triton module it builds (a malformed one would only fail in the GPU
compile), so the `verified` fixture wraps the module builder and runs the MLIR verifier on every kernel
lowered here (where the builder has that name; later versions compile, which verifies, during lowering).
"""

import jax
import jax.numpy as jnp
import pytest
from jax._src.pallas.triton import pallas_call_registration

from kernels_pallas.attention_ops import attend
from kernels_pallas.fp8_gmm.ops import gmm_fp8
from kernels_pallas.gmm.ops import gmm

TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")
BF16 = jnp.bfloat16


@pytest.fixture
def verified(monkeypatch):
    """Runs the MLIR verifier on each Triton module lowered in the test; yields the list of kernel names."""
    build = getattr(pallas_call_registration.lowering, "lower_jaxpr_to_triton_module", None)
    if build is None:
        assert jax.__version_info__ >= (0, 11), "jax 0.10 builds Triton modules with this function"
        return None
    names = []

    def build_and_verify(jaxpr, *args, **kwargs):
        result = build(jaxpr, *args, **kwargs)
        assert result.module.operation.verify()  # raises MLIRError naming the bad op
        names.append(jaxpr.debug_info.func_name)
        return result

    monkeypatch.setattr(pallas_call_registration.lowering, "lower_jaxpr_to_triton_module", build_and_verify)
    return names


def _spec(shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _lower(f, *args) -> str:
    """The StableHLO text of f lowered for CUDA."""
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _triton_calls(text: str) -> int:
    return sum(text.count(target) for target in TRITON_CALLS)


def _value_and_vjp(f):
    def run(*args):
        *primals, cotangent = args
        out, vjp = jax.vjp(f, *primals)
        return out, vjp(cotangent)

    return run


def test_gmm_forward_and_backward_lower_to_triton(verified):
    m, k, n, e = 1000, 256, 384, 8
    f = lambda x, w, sizes: gmm(x, w, sizes, interpret=False)
    assert _triton_calls(_lower(f, _spec((m, k)), _spec((e, k, n)), _spec((e,), jnp.int32))) == 1
    sizes = jnp.array([100, 0, 300, 50, 50, 0, 250, 200], jnp.int32)
    f = _value_and_vjp(lambda x, w: gmm(x, w, sizes, interpret=False))
    assert _triton_calls(_lower(f, _spec((m, k)), _spec((e, k, n)), _spec((m, n)))) == 3
    # the forward-only lowering, then forward, gmm against rhs^T and tgmm
    assert verified in (None, ["gmm", "gmm", "gmm", "tgmm"])


def test_fp8_gmm_lowers_to_triton(verified):
    m, k, n, e = 1000, 256, 384, 8
    sizes = jnp.full((e,), m // e, jnp.int32)
    f = _value_and_vjp(lambda x, w: gmm_fp8(x, w, sizes, interpret=False))
    text = _lower(f, _spec((m, k)), _spec((e, k, n)), _spec((m, n)))
    assert "f8E4M3FN" in text  # quantised operands are handed to the kernel
    assert _triton_calls(text) == 3  # fp8 forward, bf16 backward pair
    assert verified in (None, ["fp8_gmm", "gmm", "tgmm"])


def test_flash_attention_forward_and_backward_lower_to_triton(verified):
    b, t, n, g, h = 2, 512, 8, 2, 128
    q_pos = jnp.tile(jnp.arange(t, dtype=jnp.int32), (b, 1))
    kv_len = jnp.array([t, 300], jnp.int32)
    f = _value_and_vjp(lambda q, k, v: attend(q, k, v, q_pos, kv_len, interpret=False))
    text = _lower(f, _spec((b, t, n, h)), _spec((b, t, g, h)), _spec((b, t, g, h)), _spec((b, t, n, h)))
    assert _triton_calls(text) == 3  # forward, dq, dk/dv
    assert verified in (None, ["flash_forward", "flash_dq", "flash_dkv"])


def test_decode_attention_lowers_to_triton(verified):
    b, s, n, g, h = 8, 4096, 32, 4, 128
    f = lambda q, k, v, pos, kv_len: attend(q, k, v, pos, kv_len, interpret=False)
    args = (_spec((b, 1, n, h)), _spec((b, s, g, h)), _spec((b, s, g, h)), _spec((b, 1), jnp.int32))
    assert _triton_calls(_lower(f, *args, _spec((b,), jnp.int32))) == 1
    assert verified in (None, ["decode_attention"])
