"""Pure-jnp decode attention: one query per row (t == 1), the reference for the decode kernel.

It is the general attention reference at t = 1: key j is visible to row b's query at position p iff
j <= p and j < kv_len[b]; GQA with n = g * r; scale 1/sqrt(h); a row with no visible key gets 0.
"""

import jax

from kernels_pallas.flash_attention.reference import attention_reference


def decode_attention_reference(
    q_b1nh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_b1: jax.Array,
    kv_len_b: jax.Array,
    precision=jax.lax.Precision.HIGHEST,
) -> jax.Array:
    """o [b, 1, n, h] in q's dtype (precision as in attention_reference)."""
    if q_b1nh.shape[1] != 1:
        raise ValueError(f"decode attention takes one query per row, got t = {q_b1nh.shape[1]}")
    return attention_reference(q_b1nh, k_bsgh, v_bsgh, q_pos_b1, kv_len_b, precision)
