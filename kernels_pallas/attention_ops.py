"""Attention for the model and the sampler: ``attend(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)``.

GQA (n % g == 0, scale 1/sqrt(h)); key j is visible to the query at position p iff j <= p and j < kv_len[b];
a query with position < 0 is padding and gets output 0. One query per row (t == 1, decoding against the KV
cache) goes to the split-cache decode kernel; anything longer (training, prefill) to flash attention, which
is differentiable. Semantics are those of kernels_pallas/flash_attention/reference.py.
"""

import jax

from kernels_pallas.decode_attention.ops import DecodeConfig, decode_attention
from kernels_pallas.flash_attention.ops import FlashConfig, flash_attention


def attend(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    *,
    flash_config: FlashConfig | None = None,
    decode_config: DecodeConfig | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """o [b, t, n, h] in q's dtype. interpret: None picks Pallas interpret mode on CPU only."""
    if q_btnh.shape[2] % k_bsgh.shape[2]:
        raise ValueError(f"query heads {q_btnh.shape[2]} must be a multiple of kv heads {k_bsgh.shape[2]}")
    if q_btnh.shape[1] == 1:
        return decode_attention(
            q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b, config=decode_config, interpret=interpret
        )
    return flash_attention(
        q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b, config=flash_config, interpret=interpret
    )
