"""The Pallas grouped matmul (interpret mode) against ragged_dot: forward, gradients, group layouts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.gmm.kernel import tile_group_ranges
from kernels_pallas.gmm.ops import GmmConfig, gmm, transposed_grouped_matmul
from kernels_pallas.gmm.reference import gmm_loop_reference, gmm_reference, group_offsets, tgmm_reference

M, K, N = 100, 64, 32  # m is not a multiple of the row tile: the last tile is masked
# Small tiles so that every path runs: several row tiles, tiles cut by group boundaries, k and n loops.
CONFIG = GmmConfig(block_m=32, block_k=32, block_n=16)

GROUPS = {
    "uneven_with_empty": [37, 0, 50, 13, 0],  # sums to m; empty groups inside and at the end
    "empty_first": [0, 64, 1, 35],
    "one_group": [0, 0, M, 0],  # everything in one group
    "sum_below_m": [20, 0, 33, 7],  # rows 60.. belong to no group and must come out zero
}


def _operands(n_groups: int, dtype, seed: int = 0):
    kx, kw = jax.random.split(jax.random.key(seed))
    lhs = jax.random.normal(kx, (M, K), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(kw, (n_groups, K, N), jnp.float32) / np.sqrt(K)).astype(dtype)
    return lhs, rhs


def _value_and_vjp(f):
    """jit of (f(x, w), its vjp applied to dy)."""

    def run(x, w, dy):
        out, vjp = jax.vjp(f, x, w)
        return out, vjp(dy)

    return jax.jit(run)


def _close(actual, expected, rel: float):
    actual = np.asarray(actual, np.float32)
    expected = np.asarray(expected, np.float32)
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * scale)


def test_reference_is_ragged_dot_semantics():
    """The reference equals an independent masked-loop product, including zero rows past sum(sizes)."""
    lhs, rhs = _operands(4, jnp.float32)
    sizes = jnp.array(GROUPS["sum_below_m"], jnp.int32)
    out = gmm_reference(lhs, rhs, sizes)
    _close(out, gmm_loop_reference(lhs, rhs, sizes), 1e-5)
    assert np.all(np.asarray(out[60:]) == 0)


def test_tile_group_ranges():
    offsets = group_offsets(jnp.array([37, 0, 50, 13, 0], jnp.int32), M)  # [0, 37, 37, 87, 100, 100]
    lo, hi = tile_group_ranges(offsets, M, 32)
    # tile 0 rows 0-31: group 0; tile 1 rows 32-63: groups 0..2 (1 empty); tile 2: 2..3; tile 3 (96-99): 3
    assert lo.tolist() == [0, 0, 2, 3]
    assert hi.tolist() == [1, 3, 4, 4]


@pytest.mark.parametrize("case", sorted(GROUPS))
def test_forward_and_grads_f32(case):
    sizes = jnp.array(GROUPS[case], jnp.int32)
    lhs, rhs = _operands(len(GROUPS[case]), jnp.float32)
    dy = jax.random.normal(jax.random.key(7), (M, N), jnp.float32)

    out, (d_lhs, d_rhs) = _value_and_vjp(lambda x, w: gmm(x, w, sizes, config=CONFIG))(lhs, rhs, dy)
    ref, (d_lhs_ref, d_rhs_ref) = _value_and_vjp(lambda x, w: gmm_reference(x, w, sizes))(lhs, rhs, dy)
    assert out.dtype == jnp.float32
    _close(out, ref, 1e-5)
    total = int(sum(GROUPS[case]))
    assert np.all(np.asarray(out[total:]) == 0)
    _close(d_lhs, d_lhs_ref, 1e-5)
    _close(d_rhs, d_rhs_ref, 1e-5)
    assert np.all(np.asarray(d_lhs[total:]) == 0)
    for e, size in enumerate(GROUPS[case]):
        if size == 0:  # an empty group gets an exactly zero weight gradient
            assert np.all(np.asarray(d_rhs[e]) == 0)


def test_forward_and_grads_bf16():
    sizes = jnp.array(GROUPS["uneven_with_empty"], jnp.int32)
    lhs, rhs = _operands(5, jnp.bfloat16)
    dy = jax.random.normal(jax.random.key(7), (M, N), jnp.float32).astype(jnp.bfloat16)
    out, grads = _value_and_vjp(lambda x, w: gmm(x, w, sizes, config=CONFIG))(lhs, rhs, dy)
    ref, grads_ref = _value_and_vjp(lambda x, w: gmm_reference(x, w, sizes))(lhs, rhs, dy)
    assert out.dtype == jnp.bfloat16
    _close(out, ref, 2e-2)
    for got, want in zip(grads, grads_ref):
        assert got.dtype == jnp.bfloat16
        _close(got, want, 2e-2)


def test_tgmm_matches_reference():
    sizes = jnp.array(GROUPS["sum_below_m"], jnp.int32)
    lhs, _ = _operands(4, jnp.float32)
    dy = jax.random.normal(jax.random.key(3), (M, N), jnp.float32)
    config = dataclasses.replace(CONFIG, interpret=True)  # the op wrapper sets it; the helper does not
    out = transposed_grouped_matmul(lhs, dy, group_offsets(sizes, M), jnp.float32, config)
    _close(out, tgmm_reference(lhs, dy, sizes), 1e-5)


def test_default_config_and_jit():
    """Default tiles shrink to tiny shapes; the op traces under jit with traced group sizes."""
    sizes = jnp.array(GROUPS["uneven_with_empty"], jnp.int32)
    lhs, rhs = _operands(5, jnp.float32)
    out = jax.jit(gmm)(lhs, rhs, sizes)
    _close(out, gmm_reference(lhs, rhs, sizes), 1e-5)
