"""How the kernels are called: what jit holds static, the Triton launch, and a public op's config.

A kernel entry point (kernel.py) takes its tile sizes and the launch arguments (num_warps, num_stages,
interpret) as static keywords and launches through `triton_call`. A public op (ops.py) takes `config` and
`interpret` static; `op_config` resolves interpret once (None: interpret on CPU only) into the config, whose
`launch_args` every kernel of the op then gets.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
from jax.experimental import pallas as pl

from kernels_pallas.gpu_backend import resolve_interpret, triton_params

LAUNCH_ARGS = ("num_warps", "num_stages", "interpret")

Config = TypeVar("Config")

# jax.jit for a public op: its config and interpret choice are static (configs are frozen dataclasses).
jit_op = functools.partial(jax.jit, static_argnames=("config", "interpret"))


def jit_kernel(*tile_args: str) -> Callable[[Callable], Callable]:
    """jax.jit for a kernel entry point, with its `tile_args` and the launch arguments static."""
    return functools.partial(jax.jit, static_argnames=(*tile_args, *LAUNCH_ARGS))


def triton_call(
    kernel: Callable, *, num_warps: int | None, num_stages: int | None, interpret: bool, **call: Any
) -> Callable:
    """pl.pallas_call on the Triton backend (gpu_backend.py); `call`: grid, specs, out_shape, name."""
    return pl.pallas_call(
        kernel, compiler_params=triton_params(num_warps, num_stages), interpret=interpret, **call
    )


def op_config(config: Config | None, default: Callable[[], Config], interpret: bool | None) -> Config:
    """A public op's config (`default()` when None) with interpret resolved: None means on CPU only."""
    return dataclasses.replace(config or default(), interpret=resolve_interpret(interpret))


def launch_args(config: Any) -> dict[str, Any]:
    """The launch arguments of a config (one with num_warps, num_stages and interpret) for a kernel."""
    return {name: getattr(config, name) for name in LAUNCH_ARGS}
