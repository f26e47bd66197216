"""Pure-jnp causal GQA attention with per-row lengths, the reference for the attention kernels.

q [b, t, n, h], k/v [b, s, g, h] (n = g * r, query head i reads kv head i // r), q_pos [b, t], kv_len [b].
Key j is visible to the query at position p iff j <= p and j < kv_len[b]; softmax(q.k / sqrt(h)) over the
visible keys; a query with no visible key (p < 0 marks padding) gets output 0.
"""

import jax
import jax.numpy as jnp

_HIGHEST = jax.lax.Precision.HIGHEST  # no TF32 rounding of f32 inputs on GPUs


def visible_mask(q_pos_bt: jax.Array, kv_len_b: jax.Array, s: int) -> jax.Array:
    """[b, t, s] bool: key j visible to query (b, t)."""
    j = jnp.arange(s)
    return (j[None, None, :] <= q_pos_bt[:, :, None]) & (j[None, None, :] < kv_len_b[:, None, None])


def attention_reference(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    precision=_HIGHEST,
) -> jax.Array:
    """o [b, t, n, h] in q's dtype; logits and softmax in f32. precision=None: XLA's default (benchmarks)."""
    b, t, n, h = q_btnh.shape
    g = k_bsgh.shape[2]
    q = q_btnh.reshape(b, t, g, n // g, h)
    logits = jnp.einsum(
        "btgrh,bsgh->bgrts", q, k_bsgh, precision=precision, preferred_element_type=jnp.float32
    )
    logits = logits / jnp.sqrt(jnp.float32(h))
    visible = visible_mask(q_pos_bt, kv_len_b, k_bsgh.shape[1])[:, None, None]  # [b, 1, 1, t, s]
    logits = jnp.where(visible, logits, -jnp.inf)
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)
    weights = jnp.where(visible, jnp.exp(logits - row_max), 0.0)
    denom = jnp.sum(weights, axis=-1, keepdims=True)
    probs = weights / jnp.where(denom > 0, denom, 1.0)
    o = jnp.einsum(
        "bgrts,bsgh->btgrh", probs.astype(v_bsgh.dtype), v_bsgh, preferred_element_type=jnp.float32
    )
    return o.reshape(b, t, n, h).astype(q_btnh.dtype)
