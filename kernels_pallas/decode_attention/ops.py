"""Public decode attention: ``decode_attention(q_b1nh, k_bsgh, v_bsgh, q_pos_b1, kv_len_b) -> o_b1nh``.

One new query per row against a KV cache with per-row lengths (rows at different positions), GQA; the
cache is split along its length into ``split``-entry chunks processed in parallel (kernel.py, Triton
backend) and merged with a log-sum-exp. Used by the sampler, so it has no gradient.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp

from kernels_pallas.block_sizes import check_triton_tiles, fit_block
from kernels_pallas.decode_attention.kernel import decode_partials
from kernels_pallas.pallas_call import jit_op, launch_args, op_config


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """split: cache entries per program (upper bound, fitted to divide s); block_k: entries per step."""

    split: int = 512
    block_k: int = 64
    num_warps: int | None = 4
    num_stages: int | None = 2
    interpret: bool = False


def combine_splits(o_bsgrh: jax.Array, lse_bsgr: jax.Array) -> jax.Array:
    """Merges per-split outputs by their log2-sum-exp weights: [b, splits, g, r, h] -> [b, g, r, h].

    Rows with no visible entry in any split (all lse = -inf) get 0.
    """
    lse_max = jnp.max(lse_bsgr, axis=1, keepdims=True)
    lse_max = jnp.where(jnp.isfinite(lse_max), lse_max, 0.0)
    weights = jnp.exp2(lse_bsgr - lse_max)  # -inf -> 0
    total = jnp.sum(weights, axis=1)
    o = jnp.einsum("bsgr,bsgrh->bgrh", weights, o_bsgrh)
    return o / jnp.where(total > 0, total, 1.0)[..., None]


@jit_op
def decode_attention(
    q_b1nh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_b1: jax.Array,
    kv_len_b: jax.Array,
    *,
    config: DecodeConfig | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """o [b, 1, n, h] in q's dtype. Key j is visible iff j <= q_pos[b, 0] and j < kv_len[b].

    interpret: None picks Pallas interpret mode on CPU only.
    """
    config = op_config(config, DecodeConfig, interpret)
    b, t, n, h = q_b1nh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    if t != 1:
        raise ValueError(f"decode attention takes one query per row, got t = {t}")
    r = n // g
    r_pad = max(16, 1 << (r - 1).bit_length())  # Triton dots need >= 16 rows
    q_bgrh = q_b1nh.astype(k_bsgh.dtype).reshape(b, g, r, h)  # one dot dtype; never copy the cache
    q_bgrh = jnp.pad(q_bgrh, ((0, 0), (0, 0), (0, r_pad - r), (0, 0)))
    limit = jnp.minimum(kv_len_b.astype(jnp.int32), q_pos_b1[:, 0].astype(jnp.int32) + 1)
    split = fit_block(s, config.split)
    block_k = fit_block(split, config.block_k)
    check_triton_tiles(config.interpret, head_dim=h, block_k=block_k)
    o_part, lse_part = decode_partials(
        q_bgrh,
        k_bsgh,
        v_bsgh,
        jnp.clip(limit, 0, s),
        scale=1.0 / math.sqrt(h),
        split=split,
        block_k=block_k,
        **launch_args(config),
    )
    o = combine_splits(o_part, lse_part)[:, :, :r]  # [b, g, r, h]
    return o.reshape(b, 1, n, h).astype(q_b1nh.dtype)
