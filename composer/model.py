"""The decoder-only MoE transformer as pure functions over a params pytree.

    init(key, cfg) -> params
    forward(params, tokens_bt, positions_bt, cfg, cache=None) -> (logits_btv float32, cache, aux)

A layer is pre-norm: x += Attn(RMSNorm(x)); x += FFN(RMSNorm(x)), with FFN a dense SwiGLU in the first
cfg.n_dense_layers layers and the MoE layer (composer/moe.py) in the rest. Each kind of layer is one stack
of weights with a leading layer axis, run with lax.scan, so compile time does not grow with depth.

With cfg.copy_head_dim > 0 the "logits" are the log-probs of the copy head's mixture (composer/copy_head.py):
the vocabulary softmax mixed with a pointer that copies a token out of the context.

Positions: a token with position < 0 is padding (attends nothing useful, is never attended to, takes no
expert capacity, is excluded from the aux losses, is not written to the cache). A row's real tokens are a
contiguous prefix of the row. Without a cache, each row's real tokens sit at positions 0, 1, ...; with a
cache they continue the row at any position (see composer/kv_cache.py).
"""

import math

import jax
import jax.numpy as jnp
from absl import logging

from composer import attention, copy_head, kv_cache, layers, moe, params
from composer.kv_cache import KVCache
from composer.model_config import ModelConfig

__all__ = ["KVCache", "ModelConfig", "forward", "init", "param_counts"]

_AUX_KEYS = ("load_balance_loss", "router_z_loss", "dropped_fraction")


def init(key: jax.Array, cfg: ModelConfig) -> dict:
    """Random parameters, in cfg.param_dtype, with the structure of composer.params.declarations(cfg)."""
    return params.initialize(key, params.declarations(cfg), cfg.param_jnp_dtype)


def _dense_ffn(p: dict, x_btd: jax.Array, valid_bt: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, dict]:
    del valid_bt, cfg
    mlp = p["mlp"]
    return layers.swiglu(x_btd, mlp["w_gate"], mlp["w_up"], mlp["w_down"]), {}


def _moe_ffn(p: dict, x_btd: jax.Array, valid_bt: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, dict]:
    return moe.moe_layer(p["moe"], x_btd, valid_bt, cfg)


def _run_stack(
    stack: dict,
    x_btd: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: KVCache | None,
    plan: kv_cache.WritePlan | None,
    first_layer: int,
    ffn,
) -> tuple[jax.Array, KVCache | None, dict]:
    """Runs a stack of layers with lax.scan; the cache buffer is carried (written in place), not output.

    `first_layer` is the stack's offset in the cache's layer axis. Returns (x, cache, per-layer aux [L]).
    """
    valid_bt = positions_bt >= 0

    def layer(carry, xs):
        x, cache = carry
        p, index = xs
        h = layers.rms_norm(x, p["attn_norm"], cfg.rms_eps)
        a, cache = attention.attention_layer(p["attn"], h, positions_bt, cfg, index, cache, plan)
        x = x + a
        y, aux = ffn(p, layers.rms_norm(x, p["mlp_norm"], cfg.rms_eps), valid_bt, cfg)
        return (x + y, cache), aux

    n = jax.tree.leaves(stack)[0].shape[0]
    indices = first_layer + jnp.arange(n, dtype=jnp.int32)
    (x_btd, cache), aux = jax.lax.scan(layer, (x_btd, cache), (stack, indices))
    return x_btd, cache, aux


def forward(
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    cache: KVCache | None = None,
) -> tuple[jax.Array, KVCache | None, dict[str, jax.Array]]:
    """Logits of every token.

    tokens_bt, positions_bt: int [b, t]. cache: None, or a KVCache to extend (rows may sit at different
    positions; the new tokens are written at their positions and lengths become last position + 1).
    Returns (logits [b, t, v] float32, the updated cache (None without one), aux), where aux holds
    load_balance_loss and router_z_loss (means over the MoE layers, not multiplied by their
    coefficients) and dropped_fraction (mean over MoE layers; 0 for dropless dispatch); with
    cfg.value_head also values [b, t] float32 (the critic's estimate at every position); with
    cfg.copy_loss_coef > 0 also pointer_logp and pointer_ok [b, t] (copy_head.pointer_logprob of the
    token after each position).
    """
    x_btd, logits_btv, cache, aux = _trunk(params, tokens_bt, positions_bt, cfg, cache)
    positions_bt = positions_bt.astype(jnp.int32)
    if cfg.copy_head_dim > 0:
        if cache is not None:
            # The sampler (composer/sampler_device.py) keeps the head's keys and tokens in its own cache.
            raise ValueError("model.forward runs the copy head without a cache only")
        out = copy_head.mix_uncached(
            params["copy"],
            x_btd,
            logits_btv,
            tokens_bt,
            positions_bt,
            cfg.copy_head_lines,
            with_pointer=cfg.copy_loss_coef > 0,
        )
        if cfg.copy_loss_coef > 0:
            logits_btv, (aux["pointer_logp"], aux["pointer_ok"]) = out
        else:
            logits_btv = out
    return logits_btv, cache, aux


def next_token_logprobs(
    params: dict, tokens_bt: jax.Array, positions_bt: jax.Array, cfg: ModelConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """log p(tokens[b, i] | tokens[b, :i]) [b, t] (0 at i = 0) at temperature 1, and `forward`'s aux.

    Equal to gathering `forward`'s log-softmax at each next token, without the [b, t, v] distribution
    where the copy head would build it (`copy_head.next_token_logprob_uncached`): what a loss on the data's
    own tokens (SFT) needs. No cache.
    """
    x_btd, logits_btv, _, aux = _trunk(params, tokens_bt, positions_bt, cfg, None)
    if cfg.copy_head_dim > 0:
        logp_bt, pointer = copy_head.next_token_logprob_uncached(
            params["copy"], x_btd, logits_btv, tokens_bt, positions_bt.astype(jnp.int32), cfg.copy_head_lines
        )
        if cfg.copy_loss_coef > 0:
            aux["pointer_logp"], aux["pointer_ok"] = pointer
    else:
        logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
        logp_bt = jnp.take_along_axis(logp_btv[:, :-1], tokens_bt[:, 1:, None], axis=-1)[..., 0]
        logp_bt = jnp.concatenate([logp_bt, jnp.zeros_like(logp_bt[:, :1])], axis=1)
    # Query-aligned (index i scores token i + 1) -> target-aligned (index i scores token i).
    return jnp.concatenate([jnp.zeros_like(logp_bt[:, :1]), logp_bt[:, :-1]], axis=1), aux


def _trunk(
    params: dict, tokens_bt: jax.Array, positions_bt: jax.Array, cfg: ModelConfig, cache: KVCache | None
) -> tuple[jax.Array, jax.Array, KVCache | None, dict[str, jax.Array]]:
    """Everything before the copy head: (final normed hidden states, vocabulary logits float32, cache,
    aux with the MoE losses and, with cfg.value_head, values)."""
    dtype = cfg.compute_jnp_dtype
    positions_bt = positions_bt.astype(jnp.int32)
    # mode='clip': an out-of-range id (e.g. -1 used as padding) must not become a NaN row (jnp.take's
    # default fill), which would reach real tokens through 0 * NaN in the attention weights.
    x_btd = jnp.take(params["embed"], tokens_bt, axis=0, mode="clip").astype(dtype)
    plan = None
    if cache is not None:
        plan = kv_cache.plan_write(cache.lengths, positions_bt, cache.k.shape[2])

    if cfg.n_dense_layers > 0:
        x_btd, cache, _ = _run_stack(
            params["dense_layers"], x_btd, positions_bt, cfg, cache, plan, 0, _dense_ffn
        )
    aux = {key: jnp.zeros((), jnp.float32) for key in _AUX_KEYS}
    if cfg.n_moe_layers > 0:
        x_btd, cache, aux_l = _run_stack(
            params["moe_layers"], x_btd, positions_bt, cfg, cache, plan, cfg.n_dense_layers, _moe_ffn
        )
        aux = {key: jnp.mean(value) for key, value in aux_l.items()}

    x_btd = layers.rms_norm(x_btd, params["final_norm"], cfg.rms_eps)
    w_dv = params["embed"].T if cfg.tie_embeddings else params["unembed"]
    logits_btv = jnp.einsum("btd,dv->btv", x_btd, w_dv.astype(dtype), preferred_element_type=jnp.float32)
    if cfg.value_head:
        head = params["value_head"]
        values = jnp.einsum("btd,d->bt", x_btd, head["w"].astype(dtype), preferred_element_type=jnp.float32)
        aux["values"] = values + head["b"].astype(jnp.float32)
    return x_btd, logits_btv, cache, aux


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
