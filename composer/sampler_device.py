"""The sampler's device side: jitted PREFILL, EXTEND and DECODE over a per-layer slot KV cache.

composer/sampler.py schedules requests onto slots and calls these; everything here is traced.

Expert capacity: capacity dispatch drops tokens depending on the rest of the batch, which would make a
request's tokens depend on its batch-mates. The sampler runs the model with `sampling_config(cfg)`: for
dispatch 'capacity' the capacity factor is n_experts / top_k, so every expert has room for every token of
the call (nothing is ever dropped); other dispatches are dropless already. That room costs E / k times
the expert FLOPs of a dropless kernel, so each MoE layer first runs with a smaller factor
(PREFILL_CAPACITY, DECODE_CAPACITY) and runs again with E / k only if that pass dropped an assignment
(`moe_dropless`; `stats()['moe_redo_rate']`): the output is the dropless one either way. A call of at
most DENSE_MAX_TOKENS tokens (a decode step of up to that many slots) runs every expert on every token
instead (dispatch 'dense', exact): no sort, no capacity, no second pass.

Layers: the sampler runs model.forward over its unstacked layout (`unstack_layers`: one weight buffer per
layer, and a kv_cache.LayerCaches, one cache buffer per layer), which model.forward unrolls: the layer scan
slices every layer's weights out of the stacked arrays and its keys/values out of the [L, ...] cache, and
XLA:CPU materialises those slices (copies of all the expert weights and of the cache, every layer of every
decode step: about 40% of a decode step of the peer-shape model); per-layer buffers need no slice, and each
layer's cache is written in place. With dispatch 'capacity' each expert's weights are their own buffers
too, so its matmuls run beside the other experts' on all cores (composer/moe.py, `expert_swiglu`).
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer import copy_head, model, moe, sampling
from composer.kv_cache import LayerCaches
from composer.model_config import ModelConfig

# Expert capacity factors of the first pass of each MoE layer (see `moe_dropless`); the second pass, run
# only when the first dropped an assignment, uses E / k, which never drops. A prefill has many tokens, so
# its expert loads sit close to the mean; a decode step has one token per slot, so they vary more (with
# more slots than DENSE_MAX_TOKENS: fewer run dense).
PREFILL_CAPACITY = 1.5
DECODE_CAPACITY = 3.0
# A call of at most this many tokens runs its MoE layers with dispatch 'dense' (every expert on every
# token). At a few tokens the expert matmuls cost the reads of the expert weights, whatever their row
# count: at the peer shape of benchmarks/decode.py (8 slots, 8 experts) a layer's expert matmuls took the
# same time with 2, 4, 6 or 8 rows per expert, and dense decode steps made decode 1.23x faster than
# capacity 6 per expert with its sort, gather and scatter (1497 against 1221 tokens/s).
DENSE_MAX_TOKENS = 32


def sampling_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with an expert capacity that never drops a token (dispatch 'capacity': factor E / k, so an
    expert's capacity equals the call's token count); dropless dispatches are returned unchanged."""
    if cfg.dispatch != "capacity":
        return cfg
    return dataclasses.replace(cfg, capacity_factor=cfg.n_experts / cfg.top_k)


def per_expert_buffers(cfg: ModelConfig) -> bool:
    """Whether the sampler keeps each expert's weights in buffers of their own (the dispatches that take
    that layout, composer/moe.py; the grouped-matmul ones need the [e, ...] stacks)."""
    return cfg.dispatch == "capacity"


def unstack_layers(params: dict, per_expert: bool = False) -> dict:
    """The model's params with the layer stacks replaced by `layers`: one dict per layer, in order (the
    dense layers, then the MoE layers), each weight its own buffer. With per_expert, each MoE layer's
    w_gate, w_up and w_down [e, ...] become `experts`: a tuple of one dict of the three per expert.
    Params already in this layout (a sampler's of the same config) are returned as they are: a second
    sampler shares the first's buffers.
    """
    if "layers" in params:
        return params
    return _unstack(params, per_expert)


@functools.partial(jax.jit, static_argnames=("per_expert",))
def _unstack(params: dict, per_expert: bool) -> dict:
    out = {k: v for k, v in params.items() if k not in ("dense_layers", "moe_layers")}
    out["layers"] = tuple(
        jax.tree.map(lambda x, i=i: x[i], params[name])
        for name in ("dense_layers", "moe_layers")
        if name in params
        for i in range(jax.tree.leaves(params[name])[0].shape[0])
    )
    if per_expert:
        out["layers"] = tuple(
            {**p, "moe": moe.split_experts(p["moe"])} if "moe" in p else p for p in out["layers"]
        )
    return out


def init_layer_caches(cfg: ModelConfig, batch: int, max_len: int) -> LayerCaches:
    """An empty per-layer cache for `batch` rows of up to `max_len` tokens (with the copy head's part)."""
    shape = (1, batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    k, v = ([jnp.zeros(shape, cfg.compute_jnp_dtype) for _ in range(cfg.n_layers)] for _ in range(2))
    extra = copy_head.init_cache(cfg, batch, max_len)
    return LayerCaches(k=tuple(k), v=tuple(v), lengths=jnp.zeros((batch,), jnp.int32), extra=extra)


def cache_bytes_per_slot(cfg: ModelConfig, max_len: int) -> int:
    """Bytes of `init_layer_caches` for one slot of `max_len` tokens (shapes only, nothing allocated)."""
    shapes = jax.eval_shape(lambda: init_layer_caches(sampling_config(cfg), 1, max_len))
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def _zip_buffers(fn, a: LayerCaches, b: LayerCaches, lengths: jax.Array) -> LayerCaches:
    """fn(buffer of a, same buffer of b) for every buffer; lengths as given."""
    return LayerCaches(
        k=tuple(fn(x, y) for x, y in zip(a.k, b.k, strict=True)),
        v=tuple(fn(x, y) for x, y in zip(a.v, b.v, strict=True)),
        lengths=lengths,
        extra=tuple(fn(x, y) for x, y in zip(a.extra, b.extra, strict=True)),
    )


def moe_dropless(
    p: dict, x_btd: jax.Array, valid_bt: jax.Array, cfg: ModelConfig, first_capacity: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The MoE layer with no dropped assignment, trying a smaller expert capacity first (the sampler's
    `moe_ffn` of model.forward).

    With capacity dispatch: a call of at most DENSE_MAX_TOKENS tokens runs dispatch 'dense'. Otherwise,
    with first_capacity below cfg.capacity_factor (which must never drop), the layer runs with factor
    first_capacity and, only if that dropped an assignment, again with cfg.capacity_factor: the output is
    the dropless one either way, and most calls pay for the smaller capacity only. Returns
    (y [b, t, d], {'moe_redone': 1 if the second pass ran, else 0 (int32)}).
    """
    no_redo = {"moe_redone": jnp.zeros((), jnp.int32)}
    if cfg.dispatch == "capacity" and x_btd.shape[0] * x_btd.shape[1] <= DENSE_MAX_TOKENS:
        return moe.moe_layer(p, x_btd, valid_bt, dataclasses.replace(cfg, dispatch="dense"))[0], no_redo
    if cfg.dispatch != "capacity" or first_capacity >= cfg.capacity_factor:
        return moe.moe_layer(p, x_btd, valid_bt, cfg)[0], no_redo
    y_btd, aux = moe.moe_layer(p, x_btd, valid_bt, dataclasses.replace(cfg, capacity_factor=first_capacity))
    redo = aux["dropped_fraction"] > 0
    y_btd = jax.lax.cond(redo, lambda: moe.moe_layer(p, x_btd, valid_bt, cfg)[0], lambda: y_btd)
    return y_btd, {"moe_redone": redo.astype(jnp.int32)}


def forward_unstacked(
    params_u: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: LayerCaches,
    first_capacity: float,
    logits_at_b: jax.Array | None = None,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[jax.Array, LayerCaches, jax.Array]:
    """model.forward over `unstack_layers(params)` and per-layer caches (layers unrolled), its MoE layers
    through `moe_dropless` with first_capacity. With logits_at_b ([b] int32) only the logits of token
    logits_at_b[i] of each row are computed (a prefill needs its last position's only). line_tokens: the
    copy head's, as model.forward takes them. Returns (logits
    [b, t, v] float32, or [b, 1, v] with logits_at_b; the cache; the number of MoE layers that needed
    their second pass)."""
    moe_ffn = functools.partial(moe_dropless, first_capacity=first_capacity)
    logits_btv, cache, aux = model.forward(
        params_u,
        tokens_bt,
        positions_bt,
        cfg,
        cache,
        moe_ffn=moe_ffn,
        logits_at_b=logits_at_b,
        line_tokens=line_tokens,
    )
    return logits_btv, cache, aux.get("moe_redone", jnp.zeros((), jnp.int32))


class SlotState(NamedTuple):
    """The decode state of every slot, [b] int32 each."""

    token_b: jax.Array  # the last drawn token, fed at the next step
    position_b: jax.Array  # its position (= its cache index); -1: the slot is idle
    index_b: jax.Array  # index in the turn of the next token to draw (its key's index)
    max_new_b: jax.Array  # the turn ends once index reaches this
    seed_b: jax.Array  # sampling.request_seed of the slot's request


class DecodeOut(NamedTuple):
    tokens_nb: jax.Array  # [n, b] int32, token drawn at step j by slot b
    logprobs_nb: jax.Array  # [n, b] float32
    kept_nb: jax.Array  # [n, b] bool: slot b was active at step j (the token belongs to its turn)
    moe_redone: jax.Array  # int32 scalar: MoE layer passes redone with full capacity, over all steps
    steps: jax.Array  # int32 scalar: steps run (< n when every slot went idle early)


def _run_rows(
    params: dict,
    rows: LayerCaches,
    tokens_rt: jax.Array,
    offsets_r: jax.Array,
    lengths_r: jax.Array,
    cfg: ModelConfig,
    line_tokens: copy_head.LineTokens | None,
) -> tuple[LayerCaches, jax.Array, jax.Array]:
    """Row i's lengths_r[i] tokens at positions offsets_r[i] + j over `rows` (which hold positions
    [0, offsets_r[i])). Returns (rows, the logits at each row's last new position [r, v] float32, MoE
    layers that ran a second pass)."""
    t = tokens_rt.shape[1]
    t_idx = jnp.arange(t, dtype=jnp.int32)
    positions_rt = jnp.where(t_idx[None, :] < lengths_r[:, None], offsets_r[:, None] + t_idx[None, :], -1)
    last_r = jnp.maximum(lengths_r - 1, 0)
    logits_r1v, rows, redone = forward_unstacked(
        params, tokens_rt, positions_rt, cfg, rows, PREFILL_CAPACITY, last_r, line_tokens
    )
    return rows, logits_r1v[:, 0], redone


def _write_rows(
    cache: LayerCaches, rows: LayerCaches, slots_r: jax.Array, lengths_r: jax.Array
) -> LayerCaches:
    """`cache` with rows[i] written to slot slots_r[i] (its first rows.k[0].shape[2] positions) and that
    slot's length set to lengths_r[i]: a scatter along the batch axis into the donated buffers, where an
    out-of-range slot (a padding row) is dropped."""
    w = rows.k[0].shape[2]
    return _zip_buffers(
        lambda big, new: big.at[:, slots_r, :w].set(new, mode="drop"),
        cache,
        rows,
        cache.lengths.at[slots_r].set(lengths_r, mode="drop"),
    )


@functools.partial(jax.jit, static_argnames=("cfg", "line_tokens"), donate_argnames=("cache",))
def prefill(
    params: dict,
    cache: LayerCaches,
    tokens_rt: jax.Array,
    lengths_r: jax.Array,
    slots_r: jax.Array,
    *,
    cfg: ModelConfig,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[LayerCaches, jax.Array, jax.Array]:
    """Prefills r prompts into slots `slots_r` of the slot cache.

    tokens_rt: int32 [r, t], row i's prompt in its first lengths_r[i] entries; rows with slot index >= the
    cache's batch (padding rows, lengths 0) are computed but not written. Returns (cache with the rows'
    keys/values at positions [0, t) and lengths set, the logits of each prompt's next token [r, v] float32
    (`draw` samples them), the number of MoE layers that ran a second, full-capacity pass).
    """
    r, t = tokens_rt.shape
    small, logits_rv, redone = _run_rows(
        params,
        init_layer_caches(cfg, r, t),
        tokens_rt,
        jnp.zeros_like(lengths_r),
        lengths_r,
        cfg,
        line_tokens,
    )
    return _write_rows(cache, small, slots_r, lengths_r), logits_rv, redone


@functools.partial(jax.jit, static_argnames=("cfg", "line_tokens"), donate_argnames=("cache",))
def extend(
    params: dict,
    cache: LayerCaches,
    tokens_rt: jax.Array,
    offsets_r: jax.Array,
    lengths_r: jax.Array,
    slots_r: jax.Array,
    *,
    cfg: ModelConfig,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[LayerCaches, jax.Array, jax.Array]:
    """Appends r suffixes to slots that hold their prefixes.

    Slot slots_r[i] holds keys/values of positions [0, offsets_r[i]); row i's lengths_r[i] tokens
    (tokens_rt[i, :lengths_r[i]]) go to positions offsets_r[i] + j, attending to that prefix and to each
    other causally. Padding rows (slot index >= the cache's batch, length 0) are computed, not written.
    Returns as prefill: (cache, next-token logits [r, v], MoE layers that ran a second pass).
    """
    rows = cache.map(lambda x: jnp.take(x, slots_r, axis=1, mode="clip"), lengths=offsets_r)
    rows, logits_rv, redone = _run_rows(params, rows, tokens_rt, offsets_r, lengths_r, cfg, line_tokens)
    return _write_rows(cache, rows, slots_r, offsets_r + lengths_r), logits_rv, redone


@jax.jit
def draw(
    base_key: jax.Array, seeds_r: jax.Array, logits_rv: jax.Array, temperature: jax.Array, top_p: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The first token of r turns, drawn from their prompts' next-token logits [r, v] with the keys of
    index 0 of requests seeds_r. Returns (tokens [r] int32, log-probs [r] float32).

    Apart from prefill and extend, which then compile no sampling (a program per (rows, width); this one
    per row count), and so that turns with the same prompt draw from one prefill's logits (the sampler's
    shared prompts)."""
    keys_r = sampling.token_keys(base_key, seeds_r, jnp.zeros_like(seeds_r))
    return sampling.sample(keys_r, logits_rv, temperature, top_p)


@functools.partial(jax.jit, donate_argnames=("cache",))
def copy_rows(cache: LayerCaches, src_r: jax.Array, dst_r: jax.Array, lengths_r: jax.Array) -> LayerCaches:
    """`cache` with slot src_r[i]'s whole row (every buffer) copied to slot dst_r[i], whose length becomes
    lengths_r[i]; an out-of-range destination (a padding row) is dropped. Every row is read before any is
    written, so a destination may be another row's source. Turns with one prompt share its prefill so:
    the entries past the prompt's length that come along are never attended (each is written before a
    query reaches it)."""

    def copy(x):
        return x.at[:, dst_r].set(x[:, src_r], mode="drop")

    return cache.map(copy, lengths=cache.lengths.at[dst_r].set(lengths_r, mode="drop"))


@functools.partial(
    jax.jit,
    static_argnames=("cfg", "n_steps", "window", "line_tokens"),
    donate_argnames=("cache",),
)
def decode(
    params: dict,
    cache: LayerCaches,
    state: SlotState,
    base_key: jax.Array,
    eos_id: jax.Array,
    *,
    cfg: ModelConfig,
    n_steps: int,
    window: int,
    temperature: jax.Array,
    top_p: jax.Array,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[LayerCaches, SlotState, DecodeOut]:
    """Up to n_steps decode steps of every slot in one call (stops early once every slot is idle).

    Attention and cache writes use the first `window` cache positions only (the caller guarantees that
    every active slot stays below it: position + n_steps <= window). A slot's turn ends when it draws
    eos_id (-1: never) or when index reaches max_new; it then goes idle (position -1).
    Returns (cache, final state, outputs).
    """
    b = state.token_b.shape[0]
    full = cache.k[0].shape[2]
    if window < full:
        work = cache.map(lambda x: x[:, :, :window])
    else:
        work = cache
    out0 = (
        jnp.zeros((n_steps, b), jnp.int32),
        jnp.zeros((n_steps, b), jnp.float32),
        jnp.zeros((n_steps, b), bool),
        jnp.zeros((), jnp.int32),
    )

    def cond(carry):
        j, st, _, _ = carry
        return (j < n_steps) & jnp.any(st.position_b >= 0)

    def body(carry):
        j, st, work, (tokens_nb, logprobs_nb, kept_nb, redone_total) = carry
        logits_b1v, work, redone = forward_unstacked(
            params,
            st.token_b[:, None],
            st.position_b[:, None],
            cfg,
            work,
            DECODE_CAPACITY,
            line_tokens=line_tokens,
        )
        active_b = st.position_b >= 0
        keys_b = sampling.token_keys(base_key, st.seed_b, st.index_b)
        tok_b, logp_b = sampling.sample(keys_b, logits_b1v[:, 0], temperature, top_p)
        index_b = st.index_b + active_b.astype(jnp.int32)
        done_b = (tok_b == eos_id) | (index_b >= st.max_new_b)
        st = st._replace(
            token_b=jnp.where(active_b, tok_b, st.token_b),
            position_b=jnp.where(active_b & ~done_b, st.position_b + 1, -1),
            index_b=index_b,
        )
        outs = (
            tokens_nb.at[j].set(tok_b),
            logprobs_nb.at[j].set(logp_b),
            kept_nb.at[j].set(active_b),
            redone_total + redone,
        )
        return j + 1, st, work, outs

    steps, state, work, outs = jax.lax.while_loop(cond, body, (jnp.int32(0), state, work, out0))
    if window < full:
        origin = (0, 0, 0, 0, 0)
        work = _zip_buffers(
            lambda big, w: jax.lax.dynamic_update_slice(big, w, origin), cache, work, work.lengths
        )
    return work, state, DecodeOut(*outs, steps=steps)
