"""Stand-ins with the memory of the GPU kernels, to plan a run's memory on the CPU (composer/memory_plan.py).

The memory plan compiles the real train step with XLA:CPU and reads its memory analysis. Two kernels have
no faithful CPU form: XLA:CPU lowers `ragged_dot` densely over every expert (n_experts times the output),
and the Pallas flash attention kernel keeps O(t) per row where any XLA attention keeps O(t^2) scores. Each
twin here has the kernel's signature, output and saved residuals, and none of its arithmetic: the plan
selects them (attention_impl='twin', dispatch='twin'); nothing runs them.

    attend          the flash kernel (kernels_pallas/flash_attention/ops.py): saves q, k, v, o and the
                    log-sum-exp per query; its backward makes dq, dk, dv.
    grouped_matmul  the grouped matmul (kernels_pallas/gmm/ops.py, jax.lax.ragged_dot): out [m, n] from
                    lhs [m, k] and rhs [e, k, n]; its backward makes d lhs and d rhs [e, k, n].
"""

import jax
import jax.numpy as jnp


def _repeat_heads(x_bsgh: jax.Array, n: int) -> jax.Array:
    return jnp.repeat(x_bsgh, n // x_bsgh.shape[2], axis=2)


@jax.custom_vjp
def _flash_like(q_btnh, k_bsgh, v_bsgh):
    return _flash_fwd(q_btnh, k_bsgh, v_bsgh)[0]


def _flash_fwd(q_btnh, k_bsgh, v_bsgh):
    t, n = q_btnh.shape[1], q_btnh.shape[2]
    # The output's shape and dtype from the inputs, at O(t) memory (the keys of the last t positions).
    o = q_btnh + _repeat_heads(v_bsgh[:, -t:], n) * _repeat_heads(k_bsgh[:, -t:], n)
    lse_bnt = jnp.sum(q_btnh.astype(jnp.float32), axis=-1).swapaxes(1, 2)
    return o, (q_btnh, k_bsgh, v_bsgh, o, lse_bnt)


def _flash_bwd(residuals, do_btnh):
    q, k, v, o, lse_bnt = residuals
    g = k.shape[2]
    delta = (do_btnh * o).astype(jnp.float32).sum(-1).swapaxes(1, 2) + lse_bnt  # [b, n, t], as flash's
    dq = do_btnh * delta.swapaxes(1, 2)[..., None].astype(q.dtype)
    folded = dq.reshape(*dq.shape[:2], g, -1, dq.shape[-1]).sum(3)  # [b, t, g, h]
    pad = [(0, 0), (k.shape[1] - folded.shape[1], 0), (0, 0), (0, 0)]
    dk = jnp.pad(folded, pad).astype(k.dtype)
    return dq, dk, (dk * v).astype(v.dtype)


_flash_like.defvjp(_flash_fwd, _flash_bwd)


def attend(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b, *, self_keys: bool = False):
    """The flash kernel's memory: o like q; saved q, k, v, o and an f32 log-sum-exp per query and head."""
    del q_pos_bt, kv_len_b, self_keys
    return _flash_like(q_btnh, k_bsgh, v_bsgh)


def grouped_matmul(lhs_mk: jax.Array, rhs_ekn: jax.Array, group_sizes_e: jax.Array) -> jax.Array:
    """A grouped matmul's memory: out [m, n] in lhs's dtype; its gradient w.r.t. rhs is a full [e, k, n]."""
    del group_sizes_e
    return _first_expert(lhs_mk, rhs_ekn)


@jax.custom_vjp
def _first_expert(lhs_mk, rhs_ekn):
    return lhs_mk @ rhs_ekn[0]


def _first_fwd(lhs_mk, rhs_ekn):
    return lhs_mk @ rhs_ekn[0], (lhs_mk, rhs_ekn)


def _first_bwd(residuals, dy_mn):
    lhs, rhs = residuals
    d_rhs = jnp.zeros_like(rhs).at[0].set((lhs.T @ dy_mn).astype(rhs.dtype))
    return (dy_mn @ rhs[0].T).astype(lhs.dtype), d_rhs


_first_expert.defvjp(_first_fwd, _first_bwd)
