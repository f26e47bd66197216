"""The preallocated key/value cache of the decoder, with one length per batch row.

The cache index of a token is its position, so the rows of one batch can sit at different positions
(continuous batching). A forward pass with a cache writes its new keys/values in place: per layer, one
`lax.dynamic_update_slice` per row (vmapped) into the buffer carried through the layer scan, or, for one
token per row (a decode step), one scatter of those entries. The buffer is
never a scan output (that copies it every step; measured 3-5x slower), so callers can donate it.

Padding: a token with position < 0 is not written and does not count towards the row's length. Each
row's real tokens in a forward call are a contiguous prefix of the row with consecutive positions.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer.model_config import ModelConfig

# Logical axes of k and v, for composer.sharding.
CACHE_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")


class KVCache(NamedTuple):
    """k, v: [L, b, s, g, h] in the compute dtype; lengths: [b] int32, valid entries per row."""

    k: jax.Array
    v: jax.Array
    lengths: jax.Array


class LayerCaches(NamedTuple):
    """The KV cache as one buffer per layer (the sampler's layout, beside unstacked layer weights):
    k[i], v[i]: [1, b, s, g, h] (layer i), lengths: [b] int32.

    extra: the copy head's own cache (composer/copy_head.py, `init_cache`), () without one; its buffers
    are indexed by position like k and v.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array
    extra: tuple[jax.Array, ...] = ()

    def map(self, fn, lengths: jax.Array | None = None) -> "LayerCaches":
        """Every buffer (k, v and extra) through fn; lengths replaced when given."""
        return LayerCaches(
            k=tuple(fn(x) for x in self.k),
            v=tuple(fn(x) for x in self.v),
            lengths=self.lengths if lengths is None else lengths,
            extra=tuple(fn(x) for x in self.extra),
        )

    def layer(self, i: int) -> KVCache:
        """Layer i as a one-layer KVCache (write it at layer index 0)."""
        return KVCache(k=self.k[i], v=self.v[i], lengths=self.lengths)


class WritePlan(NamedTuple):
    """Where one forward call writes its t new tokens in every layer (computed once, shared by layers).

    Each row writes a window of t cache entries starting at start_b (clamped so that the window fits in
    the cache: dynamic_update_slice would otherwise shift it). Window slot i takes new token src_bt[i]
    where keep_bt[i], and keeps the old entry elsewhere (padding, rows with no new token, and the part of a
    clamped window before the row's first new token).
    """

    start_b: jax.Array  # [b] int32
    src_bt: jax.Array  # [b, t] int32
    keep_bt: jax.Array  # [b, t] bool
    lengths_b: jax.Array  # [b] int32, the lengths after this write


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    """An empty cache for `batch` rows of up to `max_len` tokens."""
    shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    # Two separate buffers: one array as both k and v could not be donated.
    k, v = (jnp.zeros(shape, cfg.compute_jnp_dtype) for _ in range(2))
    return KVCache(k=k, v=v, lengths=jnp.zeros((batch,), jnp.int32))


def plan_write(lengths_b: jax.Array, positions_bt: jax.Array, max_len: int) -> WritePlan:
    """The write window of each row for new tokens at `positions_bt` (< 0: padding).

    The new length of a row is (its last valid position + 1); a row without valid tokens keeps its length.
    """
    b, t = positions_bt.shape
    if t > max_len:
        raise ValueError(f"{t} new tokens do not fit in a cache of length {max_len}")
    valid_bt = positions_bt >= 0
    has_new_b = valid_bt.any(axis=1)
    start_b = jnp.where(has_new_b, positions_bt[:, 0], 0).astype(jnp.int32)
    clamped_b = jnp.clip(start_b, 0, max_len - t)
    offset_b = start_b - clamped_b  # > 0 only when the window's tail (padding) would run past the end
    slot_t = jnp.arange(t, dtype=jnp.int32)
    src_bt = jnp.clip(slot_t - offset_b[:, None], 0, t - 1)
    keep_bt = (slot_t >= offset_b[:, None]) & jnp.take_along_axis(valid_bt, src_bt, axis=1)
    last_b = jnp.max(jnp.where(valid_bt, positions_bt, -1), axis=1)
    new_lengths_b = jnp.where(has_new_b, last_b + 1, lengths_b).astype(jnp.int32)
    return WritePlan(start_b=clamped_b, src_bt=src_bt, keep_bt=keep_bt, lengths_b=new_lengths_b)


def write_layer(
    buf_lbsgh: jax.Array, layer: jax.Array, new_btgh: jax.Array, plan: WritePlan
) -> tuple[jax.Array, jax.Array]:
    """Writes one layer's new keys (or values) into the cache buffer.

    Returns (the whole buffer, updated in place; that layer's updated entries [b, s, g, h] for attention).
    """
    b, t, g, h = new_btgh.shape
    if t == 1:
        # One token per row (a decode step): a scatter of b entries. The vmapped window update below
        # slices the layer out of the buffer, rewrites it and puts it back, and XLA:CPU copies the
        # whole layer for that: at a 1024-entry window, a third of a decode step of the default model.
        pos_b = jnp.where(plan.keep_bt[:, 0], plan.start_b, buf_lbsgh.shape[2])  # out of range: dropped
        new_bgh = new_btgh[:, 0].astype(buf_lbsgh.dtype)
        buf_lbsgh = buf_lbsgh.at[layer, jnp.arange(b), pos_b].set(new_bgh, mode="drop")
        return buf_lbsgh, jax.lax.dynamic_index_in_dim(buf_lbsgh, layer, axis=0, keepdims=False)

    def write_row(row_sgh, new_tgh, start, src_t, keep_t):
        t = new_tgh.shape[0]
        old_tgh = jax.lax.dynamic_slice(row_sgh, (start, 0, 0), (t, g, h))
        window_tgh = jnp.where(keep_t[:, None, None], new_tgh[src_t].astype(row_sgh.dtype), old_tgh)
        return jax.lax.dynamic_update_slice(row_sgh, window_tgh, (start, 0, 0))

    layer_bsgh = jax.lax.dynamic_index_in_dim(buf_lbsgh, layer, axis=0, keepdims=False)
    # vmap over the leading (batch) axis of the layer slice: no transpose of the buffer is needed.
    layer_bsgh = jax.vmap(write_row)(layer_bsgh, new_btgh, plan.start_b, plan.src_bt, plan.keep_bt)
    return jax.lax.dynamic_update_index_in_dim(buf_lbsgh, layer_bsgh, layer, axis=0), layer_bsgh
