"""Pure-jnp grouped matmul, the reference the Pallas kernels are tested against.

Semantics are those of ``jax.lax.ragged_dot``: ``lhs [m, k]`` rows sorted by group, ``rhs [e, k, n]``,
``group_sizes [e]``; ``out[r] = lhs[r] @ rhs[e(r)]``, and rows past ``sum(group_sizes)`` are zero.
"""

import jax
import jax.numpy as jnp


def group_offsets(group_sizes_e: jax.Array, m: int) -> jax.Array:
    """[e + 1] int32 offsets [0, cumsum(group_sizes)], clipped to m (rows past m do not exist)."""
    ends = jnp.cumsum(group_sizes_e.astype(jnp.int32))
    return jnp.minimum(jnp.concatenate([jnp.zeros((1,), jnp.int32), ends]), m)


def gmm_reference(
    lhs_mk: jax.Array, rhs_ekn: jax.Array, group_sizes_e: jax.Array, precision=jax.lax.Precision.HIGHEST
) -> jax.Array:
    """out[m, n] = lhs[r] @ rhs[e(r)], f32 accumulation, output in lhs's dtype (XLA's ragged_dot).

    HIGHEST precision by default, so that f32 inputs are not rounded to TF32 on GPUs; None gives XLA's
    default (what benchmarks compare against).
    """
    out = jax.lax.ragged_dot(
        lhs_mk, rhs_ekn, group_sizes_e, precision=precision, preferred_element_type=jnp.float32
    )
    return out.astype(lhs_mk.dtype)


def group_one_hot(group_sizes_e: jax.Array, m: int) -> jax.Array:
    """[m, e] f32: 1 where row r belongs to group e; rows past sum(group_sizes) are all zero."""
    offsets = group_offsets(group_sizes_e, m)
    rows = jnp.arange(m)[:, None]
    return ((rows >= offsets[None, :-1]) & (rows < offsets[None, 1:])).astype(jnp.float32)


def gmm_loop_reference(lhs_mk: jax.Array, rhs_ekn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
    """The same product as a sum over groups of masked dense matmuls (independent of ragged_dot)."""
    one_hot = group_one_hot(group_sizes_e, lhs_mk.shape[0])
    x = lhs_mk.astype(jnp.float32)
    w = rhs_ekn.astype(jnp.float32)
    out = jnp.einsum("me,mk,ekn->mn", one_hot, x, w, precision="highest")
    return out.astype(lhs_mk.dtype)


def tgmm_reference(lhs_mk: jax.Array, dy_mn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
    """out[e, k, n] = sum over rows r of group e of lhs[r, k] dy[r, n] (the gradient of gmm wrt rhs)."""
    one_hot = group_one_hot(group_sizes_e, lhs_mk.shape[0])
    x = lhs_mk.astype(jnp.float32)
    dy = dy_mn.astype(jnp.float32)
    return jnp.einsum("me,mk,mn->ekn", one_hot, x, dy, precision="highest")
