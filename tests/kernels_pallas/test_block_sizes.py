"""Tile choices: fitted tiles divide their dimension; invalid Triton tiles fail early with a clear error."""

import jax
import jax.numpy as jnp
import pytest

from kernels_pallas.block_sizes import check_triton_tiles, fit_block, matmul_tiles, row_block
from kernels_pallas.gmm.ops import gmm


def test_fit_block_divides():
    assert fit_block(768, 128) == 128
    assert fit_block(96, 64) == 32
    assert fit_block(64, 128) == 64
    assert fit_block(24, 64) == 8
    assert fit_block(7, 64) == 1


def test_row_block_shrinks_towards_the_dimension_not_below_16():
    assert row_block(1000, 128) == 128
    assert row_block(64, 128) == 64
    assert row_block(40, 128) == 64  # masked rows: the tile may exceed the dimension
    assert row_block(3, 128) == 16


def test_check_triton_tiles():
    check_triton_tiles(False, block_k=16, head_dim=128)
    check_triton_tiles(True, block_k=8)  # interpret mode has no limit
    with pytest.raises(ValueError, match="divisible by 16"):
        check_triton_tiles(False, block_k=8)
    with pytest.raises(ValueError, match="head_dim"):
        check_triton_tiles(False, head_dim=48)


def test_compiled_gmm_rejects_a_k_not_divisible_by_16():
    spec = jax.ShapeDtypeStruct
    f = lambda x, w, sizes: gmm(x, w, sizes, interpret=False)
    with pytest.raises(ValueError, match="block_k"):
        jax.jit(f).trace(spec((64, 24), jnp.bfloat16), spec((4, 24, 32), jnp.bfloat16), spec((4,), jnp.int32))


def test_matmul_tiles_shrink_the_row_tile_and_fit_k_and_n():
    assert matmul_tiles(False, 40, 96, 48, 128, 64, 128) == dict(block_m=64, block_k=32, block_n=16)
    assert matmul_tiles(True, 40, 24, 48, 128, 64, 128)["block_k"] == 8  # interpret mode takes any tile
    with pytest.raises(ValueError, match="Triton tiles"):
        matmul_tiles(False, 40, 24, 48, 128, 64, 128)
