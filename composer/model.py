"""The decoder-only MoE transformer as pure functions over a params pytree.

    init(key, cfg) -> params
    forward(params, tokens_bt, positions_bt, cfg, cache=None, *, line_tokens=None)
        -> (logits_btv float32, cache, aux)

A layer (`block`) is pre-norm: x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x)), with FFN a dense SwiGLU in the
first cfg.n_dense_layers layers and the MoE layer (composer/moe.py) in the rest. The learner and the sampler
run the same `forward`; the params' layout picks how the layers run:

    stacked (`init`): each kind of layer is one stack of weights with a leading layer axis, run with
        lax.scan (compile time does not grow with depth), over a KVCache [L, ...] or no cache;
    unstacked (composer/sampler_device.py, `unstack_layers`): params['layers'], one dict per layer, run by
        a Python loop over a kv_cache.LayerCaches (one buffer per layer), so that no layer's weights or
        cache are sliced out of a stack (XLA:CPU copies such slices every layer of every decode step).

`moe_ffn` replaces the MoE layer's function (the sampler's dropless dispatch), and `logits_at_b` keeps one
query per row for the head (a prefill needs the last position's logits only).

With cfg.copy_head_dim > 0 the "logits" are the log-probs of the copy head's mixture (composer/copy_head.py):
the vocabulary softmax mixed with a pointer that copies a token out of the context. With its line keys
(cfg.copy_head_lines) the caller passes the chat template's tokens, `line_tokens` (a copy_head.LineTokens,
static like cfg): they come from the tokenizer, not the config.

Positions: a token with position < 0 is padding (attends nothing useful, is never attended to, takes no
expert capacity, is excluded from the aux losses, is not written to the cache). A row's real tokens are a
contiguous prefix of the row. Without a cache, each row's real tokens sit at positions 0, 1, ...; with a
cache they continue the row at any position (see composer/kv_cache.py).
"""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from absl import logging

from composer import attention, chunked_logprobs, copy_head, kv_cache, layers, moe, params
from composer.kv_cache import KVCache, LayerCaches
from composer.model_config import ModelConfig

__all__ = ["KVCache", "LayerCaches", "ModelConfig", "block", "forward", "init", "param_counts"]

# The MoE layer's losses, averaged over MoE layers; other outputs of a moe_ffn are summed over them.
_AUX_KEYS = ("load_balance_loss", "router_z_loss", "dropped_fraction")

# cfg.remat -> the jax.checkpoint policy of a scanned layer in training (absent: no remat).
REMAT_POLICIES = {
    "full": None,  # save nothing but the layer's input
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # projections, not attention
}

# moe_ffn(p_moe, x_btd, valid_bt, cfg) -> (y_btd, aux): the MoE layer (moe.moe_layer by default).
MoeFn = Callable[[dict, jax.Array, jax.Array, ModelConfig], tuple[jax.Array, dict]]


def init(key: jax.Array, cfg: ModelConfig) -> dict:
    """Random parameters, in cfg.param_dtype, with the structure of composer.params.declarations(cfg)."""
    return params.initialize(key, params.declarations(cfg), cfg.param_jnp_dtype)


def block(
    p: dict,
    x_btd: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: KVCache | None,
    layer: jax.Array,
    plan: kv_cache.WritePlan | None,
    moe_ffn: MoeFn = moe.moe_layer,
) -> tuple[jax.Array, KVCache | None, dict]:
    """One pre-norm layer: x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x)). FFN: the MoE layer (moe_ffn) when p
    has 'moe', else the dense SwiGLU. The layer's keys/values go to index `layer` of the cache's layer
    axis. Returns (x, cache, the FFN's aux: {} for a dense layer)."""
    h_btd = layers.rms_norm(x_btd, p["attn_norm"], cfg.rms_eps)
    a_btd, cache = attention.attention_layer(p["attn"], h_btd, positions_bt, cfg, layer, cache, plan)
    x_btd = x_btd + a_btd
    h_btd = layers.rms_norm(x_btd, p["mlp_norm"], cfg.rms_eps)
    if "moe" in p:
        y_btd, aux = moe_ffn(p["moe"], h_btd, positions_bt >= 0, cfg)
    else:
        y_btd, aux = layers.swiglu(h_btd, p["mlp"]["w_gate"], p["mlp"]["w_up"], p["mlp"]["w_down"]), {}
    return x_btd + y_btd, cache, aux


def _scan_layers(
    params: dict, x_btd, positions_bt, cfg: ModelConfig, cache: KVCache | None, plan, moe_ffn: MoeFn
) -> tuple[jax.Array, KVCache | None, dict]:
    """The stacked layout: each stack through lax.scan; the cache buffer is carried (written in place), not
    output. Returns (x, cache, the MoE stack's aux, each [n_moe_layers])."""
    aux_l, first = {}, 0
    for name in ("dense_layers", "moe_layers"):
        if name not in params:
            continue

        def layer(carry, xs):
            x, cache = carry
            p, index = xs
            x, cache, aux = block(p, x, positions_bt, cfg, cache, index, plan, moe_ffn)
            return (x, cache), aux

        if cache is None and cfg.remat != "none":
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[cfg.remat])
        n = jax.tree.leaves(params[name])[0].shape[0]
        indices = first + jnp.arange(n, dtype=jnp.int32)
        (x_btd, cache), aux = jax.lax.scan(layer, (x_btd, cache), (params[name], indices))
        aux_l = aux or aux_l
        first += n
    return x_btd, cache, aux_l


def _loop_layers(
    params: dict, x_btd, positions_bt, cfg: ModelConfig, cache: LayerCaches | None, plan, moe_ffn: MoeFn
) -> tuple[jax.Array, LayerCaches | None, dict]:
    """The unstacked layout: params['layers'] in a Python loop, layer i over cache buffer i (written in
    place). Returns (x, cache with the new lengths, the MoE layers' aux, each [n_moe_layers])."""
    k_out, v_out, auxes = [], [], []
    for i, p in enumerate(params["layers"]):
        one = None if cache is None else cache.layer(i)
        x_btd, one, aux = block(p, x_btd, positions_bt, cfg, one, jnp.int32(0), plan, moe_ffn)
        if aux:
            auxes.append(aux)
        if one is not None:
            k_out.append(one.k)
            v_out.append(one.v)
    if cache is not None:
        cache = cache._replace(k=tuple(k_out), v=tuple(v_out), lengths=plan.lengths_b)
    return x_btd, cache, jax.tree.map(lambda *a: jnp.stack(a), *auxes) if auxes else {}


def _trunk(
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: KVCache | LayerCaches | None,
    moe_ffn: MoeFn,
) -> tuple[jax.Array, KVCache | LayerCaches | None, kv_cache.WritePlan | None, dict[str, jax.Array]]:
    """Everything before the heads: (final normed hidden states, cache, its write plan, aux with the MoE
    outputs reduced over layers: _AUX_KEYS averaged, any other key of moe_ffn's summed)."""
    # mode='clip': an out-of-range id (e.g. -1 used as padding) must not become a NaN row (jnp.take's
    # default fill), which would reach real tokens through 0 * NaN in the attention weights.
    x_btd = jnp.take(params["embed"], tokens_bt, axis=0, mode="clip").astype(cfg.compute_jnp_dtype)
    plan = None
    if cache is not None:
        max_len = (cache.k[0] if isinstance(cache, LayerCaches) else cache.k).shape[2]
        plan = kv_cache.plan_write(cache.lengths, positions_bt, max_len)
    run = _loop_layers if "layers" in params else _scan_layers
    x_btd, cache, aux_l = run(params, x_btd, positions_bt, cfg, cache, plan, moe_ffn)
    aux = {key: jnp.zeros((), jnp.float32) for key in _AUX_KEYS}
    for key, value in aux_l.items():
        aux[key] = jnp.mean(value) if key in _AUX_KEYS else jnp.sum(value)
    return layers.rms_norm(x_btd, params["final_norm"], cfg.rms_eps), cache, plan, aux


def _unembed(params: dict, x_btd: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Vocabulary logits [b, t, v] float32 of final normed hidden states."""
    w_dv = params["embed"].T if cfg.tie_embeddings else params["unembed"]
    return jnp.einsum("btd,dv->btv", x_btd, w_dv.astype(x_btd.dtype), preferred_element_type=jnp.float32)


def _values(params: dict, x_btd: jax.Array) -> jax.Array:
    """The value head's estimate [b, t] float32 at every position."""
    head = params["value_head"]
    values = jnp.einsum("btd,d->bt", x_btd, head["w"].astype(x_btd.dtype), preferred_element_type=jnp.float32)
    return values + head["b"].astype(jnp.float32)


def forward(
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: KVCache | LayerCaches | None = None,
    *,
    moe_ffn: MoeFn = moe.moe_layer,
    logits_at_b: jax.Array | None = None,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[jax.Array, KVCache | LayerCaches | None, dict[str, jax.Array]]:
    """Logits of every token (of one per row with logits_at_b).

    params: stacked (`init`) or unstacked (with params['layers'], over a LayerCaches); see the module
    docstring. tokens_bt, positions_bt: int [b, t]. cache: None, or a cache to extend (rows may sit at
    different positions; the new tokens are written at their positions and lengths become last position
    + 1). moe_ffn: the MoE layer's function. logits_at_b: [b] int32, keep only query logits_at_b[i] of
    each row (needs a cache). line_tokens: the copy head's line tokens, needed where cfg has line keys
    and unused elsewhere.
    Returns (logits [b, t, v] float32 ([b, 1, v] with logits_at_b), the updated cache (None without one),
    aux), where aux holds load_balance_loss and router_z_loss (means over the MoE layers, not multiplied
    by their coefficients), dropped_fraction (mean over MoE layers; 0 for dropless dispatch) and the sums
    over MoE layers of moe_ffn's other outputs; with cfg.value_head also values [b, t] float32 (the
    critic's estimate at every position); with cfg.copy_loss_coef > 0 and no cache also pointer_logp and
    pointer_ok [b, t] (copy_head.pointer_logprob of the token after each position).
    """
    positions_bt = positions_bt.astype(jnp.int32)
    x_btd, cache, plan, aux = _trunk(params, tokens_bt, positions_bt, cfg, cache, moe_ffn)
    if cfg.value_head:
        aux["values"] = _values(params, x_btd)
    if cfg.copy_head_dim == 0:
        if logits_at_b is not None:
            x_btd = jnp.take_along_axis(x_btd, logits_at_b[:, None, None], axis=1)
        return _unembed(params, x_btd, cfg), cache, aux
    if cache is not None and not isinstance(cache, LayerCaches):
        raise ValueError("the copy head keeps its cache in a kv_cache.LayerCaches (the unstacked layout)")
    logits_btv, extra, pointer = copy_head.logits(
        params["copy"],
        x_btd,
        tokens_bt,
        positions_bt,
        copy_head.active_line_tokens(cfg, line_tokens),
        lambda x: _unembed(params, x, cfg),
        extra=None if cache is None else cache.extra,
        plan=plan,
        logits_at_b=logits_at_b,
        with_pointer=cfg.copy_loss_coef > 0 and cache is None,
    )
    if cache is not None:
        cache = cache._replace(extra=extra)
    if pointer is not None:
        aux["pointer_logp"], aux["pointer_ok"] = pointer
    return logits_btv, cache, aux


def next_token_logprobs(
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    *,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """log p(tokens[b, i] | tokens[b, :i]) [b, t] (0 at i = 0) at temperature 1, and `forward`'s aux.

    Equal to gathering `forward`'s log-softmax at each next token, without the [b, t, v] distribution
    where the copy head would build it (`copy_head.next_token_logprob_uncached`), and without a copy head
    cfg.logits_chunk positions at a time: what a loss on the data's own tokens (SFT) needs. No cache.
    line_tokens as in `forward`.
    """
    positions_bt = positions_bt.astype(jnp.int32)
    x_btd, _, _, aux = _trunk(params, tokens_bt, positions_bt, cfg, None, moe.moe_layer)
    if cfg.value_head:
        aux["values"] = _values(params, x_btd)
    if cfg.copy_head_dim > 0:
        logp_bt, pointer = copy_head.next_token_logprob_uncached(
            params["copy"],
            x_btd,
            _unembed(params, x_btd, cfg),
            tokens_bt,
            positions_bt,
            copy_head.active_line_tokens(cfg, line_tokens),
        )
        if cfg.copy_loss_coef > 0:
            aux["pointer_logp"], aux["pointer_ok"] = pointer
        # Query-aligned (index i scores token i + 1) -> target-aligned (index i scores token i).
        return jnp.concatenate([jnp.zeros_like(logp_bt[:, :1]), logp_bt[:, :-1]], axis=1), aux
    logp_bt, _ = _vocab_scores(params, x_btd, tokens_bt, cfg, 1.0)
    return logp_bt, aux


def _vocab_scores(params: dict, x_btd, tokens_bt, cfg: ModelConfig, temperature: float):
    """Target-aligned (log-prob, entropy) [b, t] of the vocabulary softmax at `temperature`, in chunks of
    cfg.logits_chunk positions (composer/chunked_logprobs.py); 0 at i = 0."""
    w_dv = params["embed"].T if cfg.tie_embeddings else params["unembed"]
    logp, entropy = chunked_logprobs.scores(
        x_btd[:, :-1], w_dv, tokens_bt[:, 1:], temperature=temperature, chunk=cfg.logits_chunk
    )
    pad = jnp.zeros_like(logp[:, :1])
    return jnp.concatenate([pad, logp], 1), jnp.concatenate([pad, entropy], 1)


def token_scores(
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    temperature: float = 1.0,
    *,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """(log p(tokens[b, i] | tokens[b, :i]), the entropy of that next-token distribution, `forward`'s aux),
    the first two [b, t] target-aligned (0 at i = 0), for p = softmax(logits / temperature): the learner's
    view of the policy. Without a copy head a chunk of cfg.logits_chunk positions at a time; with one from
    the mixture's full [b, t, V] (the copy head is for small models). No cache.
    """
    positions_bt = positions_bt.astype(jnp.int32)
    if cfg.copy_head_dim == 0:
        x_btd, _, _, aux = _trunk(params, tokens_bt, positions_bt, cfg, None, moe.moe_layer)
        if cfg.value_head:
            aux["values"] = _values(params, x_btd)
        logp, entropy = _vocab_scores(params, x_btd, tokens_bt, cfg, temperature)
        return logp, entropy, aux
    logits_btv, _, aux = forward(params, tokens_bt, positions_bt, cfg, line_tokens=line_tokens)
    logits_btv = logits_btv[:, :-1].astype(jnp.float32)
    if temperature != 1.0:
        logits_btv = logits_btv / temperature
    logp_btv = jax.nn.log_softmax(logits_btv, axis=-1)
    target = jnp.take_along_axis(logp_btv, tokens_bt[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
    pad = jnp.zeros_like(target[:, :1])
    return jnp.concatenate([pad, target], 1), jnp.concatenate([pad, entropy], 1), aux


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(total parameters, parameters active per token), from shapes only (jax.eval_shape, no memory).

    Active = total minus the routed experts a token does not use: each MoE layer's expert weights count
    top_k / n_experts of their size. Embeddings and shared experts count in full.
    """
    shapes = jax.eval_shape(lambda key: init(key, cfg), jax.random.key(0))
    total = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
    routed = 0
    if cfg.n_moe_layers > 0:
        experts = shapes["moe_layers"]["moe"]
        routed = sum(math.prod(experts[name].shape) for name in ("w_gate", "w_up", "w_down"))
    active = total - routed + routed * cfg.top_k // cfg.n_experts
    logging.info("parameters: total %d, active per token %d", total, active)
    return total, active
