"""The MoE layer against a naive per-token loop in numpy, for every dispatch path; aux losses; dropping."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer import model, moe
from composer.model_config import ModelConfig

M_TOKENS = (2, 12)  # b, t
MOE_LAYER = jax.jit(moe.moe_layer, static_argnums=3)
CFG = ModelConfig()  # the defaults: d 64, 4 experts top-2, f 64 (the shapes other test files use too)


@functools.cache
def _init(shared_expert_d_ff: int) -> dict:
    return model.init(jax.random.key(0), dataclasses.replace(CFG, shared_expert_d_ff=shared_expert_d_ff))


def _layer_params(cfg: ModelConfig) -> dict:
    """The MoE weights of the first MoE layer of a model with cfg's shapes (dispatch choices aside)."""
    return jax.tree.map(lambda w: w[0], _init(cfg.shared_expert_d_ff)["moe_layers"]["moe"])


def _inputs(cfg: ModelConfig, seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (*M_TOKENS, cfg.d_model), jnp.float32)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _swiglu_np(x_d, w_gate, w_up, w_down):
    return (_silu(x_d @ w_gate) * (x_d @ w_up)) @ w_down


def _routing_np(x_md, router, cfg):
    """Router in float64: (probs [m, e], logits [m, e], top-k experts [m, k] best first, weights [m, k])."""
    logits = x_md @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    experts = np.argsort(-probs, axis=-1, kind="stable")[:, : cfg.top_k]
    weights = np.take_along_axis(probs, experts, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    return probs, logits, experts, weights


def _kept_np(experts, valid, cfg):
    """Which assignments (i, j) fit in their expert's capacity under k-major priority (first choices,
    in token order, before second choices); padding tokens take no slot."""
    m, k = experts.shape
    cap = moe.capacity(m, cfg)
    used = np.zeros(cfg.n_experts, int)
    kept = np.zeros((m, k), bool)
    for j in range(k):
        for i in range(m):
            if valid[i] and used[experts[i, j]] < cap:
                kept[i, j] = True
                used[experts[i, j]] += 1
    return kept


def _moe_np(p, x_btd, valid_bt, cfg, drop: bool):
    """y = sum over selected (and kept) experts of weight * SwiGLU_e(x), + the shared expert: a loop."""
    p = jax.tree.map(lambda w: np.asarray(w, np.float64), p)
    x_md = np.asarray(x_btd, np.float64).reshape(-1, cfg.d_model)
    valid = np.asarray(valid_bt).reshape(-1)
    _, _, experts, weights = _routing_np(x_md, p["router"], cfg)
    kept = _kept_np(experts, valid, cfg) if drop else np.ones_like(experts, bool)
    y = np.zeros_like(x_md)
    for i in range(x_md.shape[0]):
        for j in range(cfg.top_k):
            e = experts[i, j]
            if valid[i] and kept[i, j]:
                y[i] += weights[i, j] * _swiglu_np(x_md[i], p["w_gate"][e], p["w_up"][e], p["w_down"][e])
        if cfg.shared_expert_d_ff:
            s = p["shared"]
            y[i] += _swiglu_np(x_md[i], s["w_gate"], s["w_up"], s["w_down"])
    n_valid_slots = valid.sum() * cfg.top_k
    dropped = (valid[:, None] & ~kept).sum() / n_valid_slots
    return y.reshape(x_btd.shape), dropped


@pytest.mark.parametrize("dispatch", ["capacity", "dense", "ragged_dot"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("shared_expert_d_ff", [0, 32])
def test_moe_layer_equals_naive_loop(dispatch, norm_topk_prob, shared_expert_d_ff):
    # capacity_factor = E / k makes the capacity equal to the token count: nothing can be dropped.
    cfg = dataclasses.replace(
        CFG,
        dispatch=dispatch,
        norm_topk_prob=norm_topk_prob,
        shared_expert_d_ff=shared_expert_d_ff,
        capacity_factor=CFG.n_experts / CFG.top_k,
    )
    p = _layer_params(cfg)
    x = _inputs(cfg)
    valid = jnp.ones(M_TOKENS, bool)
    y, aux = MOE_LAYER(p, x, valid, cfg)
    y_ref, _ = _moe_np(p, x, valid, cfg, drop=False)
    np.testing.assert_allclose(y, y_ref, atol=2e-5, rtol=1e-5)
    assert float(aux["dropped_fraction"]) == 0.0


@pytest.mark.parametrize("dispatch", ["capacity", "dense", "ragged_dot"])
def test_padding_gets_no_routed_output(dispatch):
    cfg = dataclasses.replace(CFG, dispatch=dispatch, capacity_factor=CFG.n_experts / CFG.top_k)
    p = _layer_params(cfg)
    x = _inputs(cfg)
    valid = jnp.arange(M_TOKENS[1])[None, :] < jnp.array([[9], [4]])
    y, _ = MOE_LAYER(p, x, valid, cfg)
    y_ref, _ = _moe_np(p, x, valid, cfg, drop=False)
    np.testing.assert_allclose(y, y_ref, atol=2e-5, rtol=1e-5)
    assert np.all(np.asarray(y)[~np.asarray(valid)] == 0)


@pytest.mark.parametrize("capacity_factor", [0.5, 0.75])
def test_capacity_drops_overflow_and_counts_it(capacity_factor):
    cfg = dataclasses.replace(CFG, dispatch="capacity", capacity_factor=capacity_factor)
    p = _layer_params(cfg)
    x = _inputs(cfg)
    valid = jnp.arange(M_TOKENS[1])[None, :] < jnp.array([[12], [7]])
    y, aux = MOE_LAYER(p, x, valid, cfg)
    y_ref, dropped_ref = _moe_np(p, x, valid, cfg, drop=True)

    # An independent count: each expert keeps at most `capacity` of the valid assignments routed to it.
    x_md = np.asarray(x, np.float64).reshape(-1, cfg.d_model)
    _, _, experts, _ = _routing_np(x_md, np.asarray(p["router"], np.float64), cfg)
    routed = np.bincount(experts[np.asarray(valid).reshape(-1)].ravel(), minlength=cfg.n_experts)
    cap = math.ceil(capacity_factor * x_md.shape[0] * cfg.top_k / cfg.n_experts)
    count_ref = np.maximum(routed - cap, 0).sum() / routed.sum()

    assert count_ref > 0, "the test needs a capacity that drops something"
    np.testing.assert_allclose(float(aux["dropped_fraction"]), count_ref, rtol=1e-6)
    np.testing.assert_allclose(dropped_ref, count_ref, rtol=1e-12)
    np.testing.assert_allclose(y, y_ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dispatch", ["capacity", "dense", "ragged_dot"])
def test_aux_losses_equal_numpy(dispatch):
    cfg = dataclasses.replace(CFG, dispatch=dispatch)
    p = _layer_params(cfg)
    x = 3.0 * _inputs(cfg)  # larger logits, so the z-loss is far from 0
    valid = jnp.arange(M_TOKENS[1])[None, :] < jnp.array([[10], [6]])
    _, aux = MOE_LAYER(p, x, valid, cfg)

    x_md = np.asarray(x, np.float64).reshape(-1, cfg.d_model)
    probs, logits, experts, _ = _routing_np(x_md, np.asarray(p["router"], np.float64), cfg)
    v = np.asarray(valid).reshape(-1)
    n = v.sum()
    f = np.bincount(experts[v].ravel(), minlength=cfg.n_experts) / (n * cfg.top_k)
    mean_p = probs[v].mean(0)
    lb = cfg.n_experts * np.sum(f * mean_p)
    lse = np.log(np.exp(logits).sum(-1))
    z = np.mean(lse[v] ** 2)
    np.testing.assert_allclose(float(aux["load_balance_loss"]), lb, rtol=1e-5)
    np.testing.assert_allclose(float(aux["router_z_loss"]), z, rtol=1e-5)


def test_dispatch_gradients_agree():
    """Dropless and capacity (nothing dropped) give the same gradients for every MoE weight."""
    grads = {}
    for dispatch in ("capacity", "dense", "ragged_dot"):
        cfg = dataclasses.replace(CFG, dispatch=dispatch, capacity_factor=CFG.n_experts / CFG.top_k)
        p = _layer_params(cfg)
        x = _inputs(cfg)
        valid = jnp.ones(M_TOKENS, bool)

        def loss(p, x, cfg=cfg, valid=valid):
            y, aux = MOE_LAYER(p, x, valid, cfg)
            return jnp.sum(jnp.sin(y)) + aux["load_balance_loss"] + aux["router_z_loss"]

        grads[dispatch] = jax.grad(loss, argnums=(0, 1))(p, x)
    for dispatch in ("capacity", "dense"):
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads[dispatch], grads["ragged_dot"]
        )


@pytest.mark.parametrize("dispatch", ["capacity", "dense"])
@pytest.mark.parametrize("capacity_factor", [0.75, CFG.n_experts / CFG.top_k])
def test_one_buffer_per_expert_equals_stacked(dispatch, capacity_factor):
    """The sampler's layout (p['experts'], one dict of weights per expert) computes what the stacks do,
    drops included."""
    cfg = dataclasses.replace(CFG, dispatch=dispatch, capacity_factor=capacity_factor)
    p = _layer_params(cfg)
    split = moe.split_experts(p)
    assert len(split["experts"]) == cfg.n_experts and not set(moe.EXPERT_WEIGHTS) & set(split)
    x = _inputs(cfg)
    valid = jnp.arange(M_TOKENS[1])[None, :] < jnp.array([[12], [7]])
    y, aux = MOE_LAYER(p, x, valid, cfg)
    y_split, aux_split = MOE_LAYER(split, x, valid, cfg)
    np.testing.assert_allclose(y_split, y, atol=1e-6, rtol=1e-6)
    assert float(aux_split["dropped_fraction"]) == float(aux["dropped_fraction"])
    assert (float(aux["dropped_fraction"]) > 0) == (capacity_factor < 1 and dispatch == "capacity")


def test_unknown_dispatch_names_the_choices():
    cfg = dataclasses.replace(CFG, dispatch="nope")
    with pytest.raises(ValueError, match="ragged_dot"):
        moe.moe_layer(_layer_params(CFG), _inputs(CFG), jnp.ones(M_TOKENS, bool), cfg)
