"""The mixture-of-experts feed-forward layer: router, auxiliary losses and expert dispatch.

Routing (per token x, in float32): logits = x W_r [e], p = softmax(logits) over all experts, the top_k
experts by p, with weights w = p[topk], renormalised to sum to 1 iff cfg.norm_topk_prob. The output is
    y = sum_{j < k} w_j SwiGLU_{e_j}(x)  (+ SwiGLU_shared(x) when cfg.shared_expert_d_ff > 0).

Auxiliary losses over the N valid (non-padding) tokens of the batch, returned unscaled:
    load balance (Switch / GShard):  L_lb = E * sum_e f_e P_e,
        f_e = (1 / (N k)) sum_i sum_j [e_ij = e]    (fraction of routed token-slots sent to e)
        P_e = (1 / N) sum_i p_ie                     (mean router probability of e)
    L_lb = 1 when routing is uniform; only P carries gradient.
    router z-loss (ST-MoE, Zoph et al. 2022):  L_z = (1 / N) sum_i (logsumexp_e logits_ie)^2.

The expert FFN is run by ONE function chosen by cfg.dispatch in DISPATCH_IMPLS, with the signature
    experts(x_md, expert_mk, weight_mk, valid_m, p, cfg) -> (y_md, dropped_fraction)
'capacity' pads each expert's tokens to a fixed capacity and drops overflow; 'dense' runs every expert
on every token (exact, for calls of a few tokens); 'ragged_dot', 'gmm' and 'gmm_fp8' are the dropless path
over a grouped matmul with jax.lax.ragged_dot semantics (a new kernel is one more entry); the 'ep_*'
entries run those two across the mesh's 'expert' axis (expert parallelism); 'twin' is a grouped matmul's
memory for the memory plan (composer/memory_twins.py). The config value 'auto' is 'gmm' on a GPU and
'ragged_dot' elsewhere (composer/model_config.py).

Expert weights are stacked, w_gate / w_up [e, d, f] and w_down [e, f, d], or (the sampler's layout,
composer/sampler_device.py; 'capacity' and 'dense' only) one buffer per expert: p['experts'], a tuple of
{w_gate [d, f], w_up [d, f], w_down [f, d]}.
"""

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer import layers, registry
from composer.model_config import ModelConfig


def route(
    x_md: jax.Array, w_router_de: jax.Array, top_k: int, norm_topk_prob: bool
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Router in float32. Returns (expert_mk int32, weight_mk float32, logits_me float32)."""
    logits_me = jnp.einsum(
        "md,de->me",
        x_md.astype(jnp.float32),
        w_router_de.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,  # no TF32 / bf16 passes: routing must not depend on backend
    )
    probs_me = jax.nn.softmax(logits_me, axis=-1)
    weight_mk, expert_mk = jax.lax.top_k(probs_me, top_k)
    if norm_topk_prob:
        weight_mk = weight_mk / jnp.sum(weight_mk, axis=-1, keepdims=True)
    return expert_mk.astype(jnp.int32), weight_mk, logits_me


def aux_losses(logits_me: jax.Array, expert_mk: jax.Array, valid_m: jax.Array) -> dict[str, jax.Array]:
    """Load-balancing loss and router z-loss (equations in the module docstring), padding excluded."""
    n_experts = logits_me.shape[-1]
    top_k = expert_mk.shape[-1]
    n_valid = jnp.maximum(jnp.sum(valid_m), 1).astype(jnp.float32)
    probs_me = jax.nn.softmax(logits_me, axis=-1)
    # jnp.where, not a multiplication by the mask: padding rows may hold anything, even inf.
    routed_e = jnp.sum(
        jnp.where(valid_m[:, None, None], jax.nn.one_hot(expert_mk, n_experts), 0), axis=(0, 1)
    )
    f_e = routed_e / (n_valid * top_k)
    p_e = jnp.sum(jnp.where(valid_m[:, None], probs_me, 0), axis=0) / n_valid
    z_m = jnp.square(jax.nn.logsumexp(logits_me, axis=-1))
    return {
        "load_balance_loss": n_experts * jnp.sum(f_e * p_e),
        "router_z_loss": jnp.sum(jnp.where(valid_m, z_m, 0)) / n_valid,
    }


EXPERT_WEIGHTS = ("w_gate", "w_up", "w_down")


def split_experts(p: dict) -> dict:
    """One MoE layer's params with the stacked expert weights replaced by one buffer per expert:
    p['experts'][e] = {w_gate, w_up, w_down} of expert e (the layout in the module docstring)."""
    out = {k: v for k, v in p.items() if k not in EXPERT_WEIGHTS}
    out["experts"] = tuple({k: p[k][e] for k in EXPERT_WEIGHTS} for e in range(p["w_gate"].shape[0]))
    return out


def expert_swiglu(x_ecd: jax.Array, p: dict) -> jax.Array:
    """SwiGLU of every expert on its own rows: [e, c, d] -> [e, c, d], one batched einsum per weight, or
    with one buffer per expert (p['experts']) three plain matmuls per expert. Those are independent, so
    XLA:CPU with composer/xla_flags.py's flags runs them side by side on its cores; a batched einsum runs
    its experts one after another."""
    dtype = x_ecd.dtype
    if "experts" in p:
        return jnp.stack(
            [
                layers.swiglu(x_ecd[i], q["w_gate"], q["w_up"], q["w_down"]).astype(dtype)
                for i, q in enumerate(p["experts"])
            ]
        )
    gate = jnp.einsum("ecd,edf->ecf", x_ecd, p["w_gate"].astype(dtype))
    up = jnp.einsum("ecd,edf->ecf", x_ecd, p["w_up"].astype(dtype))
    return jnp.einsum("ecf,efd->ecd", jax.nn.silu(gate) * up, p["w_down"].astype(dtype))


def capacity(n_tokens: int, cfg: ModelConfig) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * top_k / n_experts), at most the token count."""
    return max(1, min(n_tokens, math.ceil(cfg.capacity_factor * n_tokens * cfg.top_k / cfg.n_experts)))


class CapacityPlan(NamedTuple):
    """Where each token-slot assignment a = j * m + i (k-major) sits in the [e, c] dispatch buffer."""

    slot_a: jax.Array  # int32 [m k]: flat slot e * c + rank (clipped; meaningful where kept)
    kept_a: jax.Array  # bool [m k]: a real assignment that fit in its expert's capacity
    real_a: jax.Array  # bool [m k]: the assignment of a valid (non-padding) token


def capacity_dispatch(
    x_md: jax.Array, expert_mk: jax.Array, valid_m: jax.Array, n_experts: int, c: int
) -> tuple[jax.Array, CapacityPlan]:
    """Sorts token-slots by expert into a zero-padded buffer x_ecd [e, c, d] and returns where each went.

    Priority within an expert is k-major (all first choices, in token order, before any second choice),
    as in GShard, so overflow drops the least preferred assignments. Padding tokens take no slot.
    """
    m, k = expert_mk.shape
    # Assignment a = j * m + i (k-major); padding goes to a virtual expert E that owns no slot.
    expert_a = jnp.where(valid_m[None, :], expert_mk.T, n_experts).reshape(-1)
    token_a = jnp.tile(jnp.arange(m, dtype=jnp.int32), k)
    order_a = jnp.argsort(expert_a, stable=True)
    counts_e = jnp.bincount(expert_a, length=n_experts + 1)[:n_experts]
    starts_e = jnp.cumsum(counts_e) - counts_e

    # DISPATCH: slot (e, i) holds the i-th assignment of expert e, if it has one.
    slot_c = jnp.arange(c, dtype=jnp.int32)
    sorted_ec = jnp.clip(starts_e[:, None] + slot_c, 0, m * k - 1)
    filled_ec = slot_c < counts_e[:, None]
    x_ecd = jnp.where(filled_ec[..., None], x_md[token_a[order_a[sorted_ec]]], 0)

    # Assignment a reads slot (e_a, rank of a within e_a) if that rank is below the capacity.
    expert_sorted = expert_a[order_a]
    rank_sorted = jnp.arange(m * k, dtype=jnp.int32) - jnp.append(starts_e, 0)[expert_sorted]
    rank_a = jnp.zeros_like(rank_sorted).at[order_a].set(rank_sorted)
    real_a = expert_a < n_experts
    kept_a = real_a & (rank_a < c)
    slot_a = jnp.minimum(expert_a, n_experts - 1) * c + jnp.minimum(rank_a, c - 1)
    return x_ecd, CapacityPlan(slot_a=slot_a, kept_a=kept_a, real_a=real_a)


def capacity_combine(out_ecd: jax.Array, plan: CapacityPlan, weight_mk: jax.Array) -> jax.Array:
    """COMBINE: y_i = sum_j w_ij out[slot of (i, j)] over kept assignments. Returns y_md float32."""
    m, k = weight_mk.shape
    out_ad = out_ecd.reshape(-1, out_ecd.shape[-1])[plan.slot_a].astype(jnp.float32)
    weight_a = weight_mk.T.reshape(-1) * plan.kept_a
    return jnp.sum((out_ad * weight_a[:, None]).reshape(k, m, -1), axis=0)


def experts_capacity(
    x_md: jax.Array, expert_mk: jax.Array, weight_mk: jax.Array, valid_m: jax.Array, p: dict, cfg: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    """Capacity dispatch: sort token-slots by expert, pad each expert to c slots, one batched einsum.

    Priority and padding as in capacity_dispatch. Dropped assignments contribute nothing (the residual
    stream carries the token). Returns (y_md, dropped_fraction = dropped valid / valid assignments).
    """
    x_ecd, plan = capacity_dispatch(x_md, expert_mk, valid_m, cfg.n_experts, capacity(x_md.shape[0], cfg))
    y_md = capacity_combine(expert_swiglu(x_ecd, p), plan, weight_mk)
    dropped = jnp.sum(plan.real_a & ~plan.kept_a) / jnp.maximum(jnp.sum(plan.real_a), 1)
    return y_md.astype(x_md.dtype), dropped.astype(jnp.float32)


def experts_dense(
    x_md: jax.Array, expert_mk: jax.Array, weight_mk: jax.Array, valid_m: jax.Array, p: dict, cfg: ModelConfig
) -> tuple[jax.Array, jax.Array]:
    """Every expert on every token, weighted by the token's routing weight for it (0 unless chosen):
    y_i = sum_e w_ie SwiGLU_e(x_i). Exact and dropless, with no sort, gather or scatter; it computes E / k
    times the rows of a dropless dispatch, which costs little when a call has a few tokens (a decode step
    has one per slot): there an expert's matmuls cost the read of its weights, not their rows. Padding
    tokens are computed but weighted by 0. Returns (y_md, 0)."""
    m, d = x_md.shape
    chosen_mke = expert_mk[..., None] == jnp.arange(cfg.n_experts, dtype=expert_mk.dtype)
    weight_me = jnp.sum(jnp.where(chosen_mke, weight_mk[..., None], 0), axis=1)
    weight_me = jnp.where(valid_m[:, None], weight_me, 0)
    out_emd = expert_swiglu(jnp.broadcast_to(x_md, (cfg.n_experts, m, d)), p)
    # A sum, not a dot over e: a float32 dot may run in reduced precision on GPU (TF32).
    y_md = jnp.sum(out_emd.astype(jnp.float32) * weight_me.T[..., None], axis=0)
    return y_md.astype(x_md.dtype), jnp.zeros((), jnp.float32)


def experts_dropless(
    x_md: jax.Array,
    expert_mk: jax.Array,
    weight_mk: jax.Array,
    valid_m: jax.Array,
    p: dict,
    cfg: ModelConfig,
    *,
    gmm: str | Callable,
) -> tuple[jax.Array, jax.Array]:
    """Dropless dispatch: sort token-slots by expert, grouped matmuls, unsort, weighted sum.

    `gmm(lhs_md, rhs_edf, group_sizes_e) -> out_mf` multiplies the i-th contiguous group of rows of lhs
    by rhs[i] (jax.lax.ragged_dot semantics); an import path is resolved when traced. Padding tokens
    are computed but weighted by 0. Returns (y_md, 0).
    """
    gmm = registry.load(gmm, f"the grouped matmul of dispatch {cfg.dispatch!r}")
    m, k = expert_mk.shape
    expert_a = expert_mk.reshape(-1)  # a = i * k + j
    order_a = jnp.argsort(expert_a)
    group_sizes_e = jnp.bincount(expert_a, length=cfg.n_experts).astype(jnp.int32)
    x_ad = x_md[order_a // k]  # sorted by expert
    dtype = x_md.dtype
    gate = gmm(x_ad, p["w_gate"].astype(dtype), group_sizes_e)
    up = gmm(x_ad, p["w_up"].astype(dtype), group_sizes_e)
    out_sorted = gmm((jax.nn.silu(gate) * up).astype(dtype), p["w_down"].astype(dtype), group_sizes_e)
    inverse_a = jnp.zeros_like(order_a).at[order_a].set(jnp.arange(m * k, dtype=order_a.dtype))
    out_mkd = out_sorted[inverse_a].reshape(m, k, -1).astype(jnp.float32)
    y_md = jnp.einsum("mkd,mk->md", out_mkd, jnp.where(valid_m[:, None], weight_mk, 0))
    return y_md.astype(dtype), jnp.zeros((), jnp.float32)


DISPATCH_IMPLS: dict[str, str | Callable] = {
    "capacity": experts_capacity,
    "dense": experts_dense,
    "ragged_dot": functools.partial(experts_dropless, gmm=jax.lax.ragged_dot),
    "gmm": functools.partial(experts_dropless, gmm="kernels_pallas.gmm.ops:gmm"),
    "gmm_fp8": functools.partial(experts_dropless, gmm="kernels_pallas.fp8_gmm.ops:gmm_fp8"),
    # Expert parallelism over the context mesh's 'expert' axis (composer/expert_parallel.py): a dense
    # all_to_all with per-expert capacity (any backend), or ragged_all_to_all + ragged_dot (GPU / TPU).
    "ep_capacity": "composer.expert_parallel:experts_ep_capacity",
    "ep_ragged_dot": "composer.expert_parallel:experts_ep_ragged",
    # A grouped matmul's memory without its arithmetic: what the memory plan compiles (never run).
    "twin": functools.partial(experts_dropless, gmm="composer.memory_twins:grouped_matmul"),
}


def moe_layer(
    p: dict, x_btd: jax.Array, valid_bt: jax.Array, cfg: ModelConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The MoE feed-forward of one layer.

    p: router [d, e], w_gate / w_up [e, d, f], w_down [e, f, d] and, with a shared expert, shared:
    {w_gate, w_up [d, f_s], w_down [f_s, d]}. valid_bt marks real tokens (padding is excluded from the
    losses and the capacity, and gets no routed output). Returns (y [b, t, d], aux) with aux
    load_balance_loss, router_z_loss, dropped_fraction (scalars, float32).
    """
    b, t, d = x_btd.shape
    x_md = x_btd.reshape(b * t, d)
    valid_m = valid_bt.reshape(b * t)
    expert_mk, weight_mk, logits_me = route(x_md, p["router"], cfg.top_k, cfg.norm_topk_prob)
    aux = aux_losses(logits_me, expert_mk, valid_m)
    experts = registry.resolve(DISPATCH_IMPLS, cfg.dispatch, "dispatch")
    y_md, aux["dropped_fraction"] = experts(x_md, expert_mk, weight_mk, valid_m, p, cfg)
    if cfg.shared_expert_d_ff > 0:
        s = p["shared"]
        y_md = y_md + layers.swiglu(x_md, s["w_gate"], s["w_up"], s["w_down"])
    return y_md.reshape(b, t, d), aux
