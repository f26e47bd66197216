"""Train steps: `sft_step` and `rl_step` as pure functions `(state, batch, key) -> (state, metrics)`.

Both scan over micro-batches (`lax.scan`), accumulate gradients as sums with token counts so the result
equals one big batch exactly, clip by global norm and apply AdamW with linear warmup and cosine decay.
`jit_step` jits a step with shardings derived from the state and the batch rules, and donates the state.

Batch layout (host side builds it, see composer/batching.py), all arrays `[m, b, t]` with m micro-batches:
  tokens int32, positions int32 (-1 on padding), loss_mask float32 (1 where the token is a *target* the
  policy generated). RL batches add sampler_logprobs float32 [m, b, t] (behaviour log-probs, aligned with
  the target tokens), advantages float32 [m, b] (per sequence; or [m, b, t] per token), truncated bool
  [m, b] and, where one rollout batch takes several updates, old_logprobs float32 [m, b, t]
  (`batch_logprobs` of the params before the first).
PPO (`ppo_step`, rl.algorithm='gae') instead has per-token advantages [m, b, t] plus returns and old_values
[m, b, t] from `ppo_targets`, which computes them under the critic (cfg.value_head) before the update.

Everything that runs the model takes `line_tokens` beside cfg (a static copy_head.LineTokens): the chat
template's tokens that the copy head's line keys need (model.forward); None where cfg has no line keys.
"""

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from composer import copy_head, model, sharding
from composer.rl import advantages as adv_lib
from composer.rl import losses

PyTree = Any


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: PyTree
    opt_state: PyTree
    # An f32 copy of params stored narrower (bf16), which the optimizer updates; params are its rounding.
    # An AdamW step of 1e-6 on a bf16 weight of 0.02 (spacing 1.2e-4) would round to no change at all.
    # None where every parameter is f32 already.
    master: PyTree = None


def make_optimizer(optim: ml_collections.ConfigDict, learning_rate: float, total_steps: int):
    """AdamW with linear warmup then cosine decay to 10%, after global-norm clipping.

    The warmup starts at peak / (warmup + 1), not 0: a first step at rate 0 would be an update that does
    nothing (in a short RL phase, with a batch that may carry the only reward signal of the run).
    """
    warmup = min(optim.warmup_steps, max(total_steps - 1, 0))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=learning_rate / (warmup + 1),
        peak_value=learning_rate,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=0.1 * learning_rate,
    )
    return optax.chain(
        optax.clip_by_global_norm(optim.grad_clip),
        optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay),
    )


def master_copy(params: PyTree) -> PyTree:
    """An f32 copy of `params` when a floating leaf is narrower than f32, else None (no copy needed)."""
    floats = [x for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)]
    if all(x.dtype == jnp.float32 for x in floats):
        return None
    return jax.tree.map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )


def init_state(params: PyTree, optimizer: optax.GradientTransformation) -> TrainState:
    """Step 0, the optimizer's state over the f32 weights (the master copy where params are narrower)."""
    master = master_copy(params)
    opt_state = optimizer.init(params if master is None else master)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state, master=master)


def token_logprobs(
    params: PyTree,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cfg: model.ModelConfig,
    temperature: float = 1.0,
    *,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[jax.Array, jax.Array, dict]:
    """Log-probs of each next token: out[b, i] = log p(tokens[b, i] | tokens[b, :i]) for i >= 1 (0 at i=0).

    p = softmax(logits / temperature): the policy the sampler draws from at that (static) temperature, so
    RL at a temperature below 1 optimises the policy it samples and the sampler's log-probs match the
    learner's (composer/sampling.py). Returns (logprobs_bt, entropy_bt, aux). Target-aligned: index i
    scores token i, so masks and sampler log-probs are indexed by the position of the token they describe.
    """
    if temperature <= 0:
        raise ValueError(f"learner log-probs need a temperature > 0, got {temperature}")
    return model.token_scores(params, tokens_bt, positions_bt, cfg, temperature, line_tokens=line_tokens)


def _aux_loss(aux: dict, cfg: model.ModelConfig) -> jax.Array:
    return cfg.aux_loss_coef * aux["load_balance_loss"] + cfg.z_loss_coef * aux["router_z_loss"]


def sft_loss(
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    hp: None = None,
    *,
    line_tokens: copy_head.LineTokens | None = None,
):
    """Next-token cross-entropy over loss_mask, as (sum, count); MoE aux losses weighted by the count.

    Returns (differentiable total, {name: MaskedSum}); 'loss' holds the count that grads are divided by.
    """
    del hp
    # The data's own next tokens only: no [b, t, v] distribution (`model.next_token_logprobs`).
    logp, aux = model.next_token_logprobs(
        params, batch["tokens"], batch["positions"], cfg, line_tokens=line_tokens
    )
    mask = batch["loss_mask"].astype(jnp.float32)
    count = mask.sum()
    nll = losses.MaskedSum(-(logp * mask).sum(), count)
    total = nll.total + _aux_loss(aux, cfg) * count
    sums = {
        "loss": nll,
        "load_balance_loss": losses.MaskedSum(aux["load_balance_loss"] * count, count),
        "dropped_fraction": losses.MaskedSum(aux["dropped_fraction"] * count, count),
    }
    if cfg.copy_loss_coef > 0 and cfg.copy_head_dim > 0:
        pointer = losses.MaskedSum(*copy_head.pointer_loss(aux["pointer_logp"], aux["pointer_ok"], mask))
        # Weighted per copyable token, normalised by the same count as the NLL.
        total = total + cfg.copy_loss_coef * pointer.total
        sums["pointer_loss"] = pointer
    return total, sums


class RLHParams(NamedTuple):
    """The static knobs of the RL loss (hashable: part of the jitted step's closure)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    mask_truncated: bool = True
    aggregation: str = "token_mean"
    norm_len: int | None = None
    temperature: float = 1.0  # the sampler's: the learner scores softmax(logits / temperature)

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "RLHParams":
        rl = config.rl
        temperature = config.sampling.temperature
        if temperature <= 0:
            raise ValueError(f"RL samples its rollouts: sampling.temperature must be > 0, got {temperature}")
        return cls(
            clip_low=rl.clip_low,
            clip_high=rl.clip_high,
            tis_cap=rl.tis_cap,
            kl_coef=rl.kl_coef,
            mask_truncated=rl.mask_truncated,
            aggregation=losses.DEFAULT_AGGREGATION[rl.algorithm],
            norm_len=config.env.max_episode_tokens,
            temperature=temperature,
        )


def rl_loss(
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    hp: RLHParams,
    *,
    line_tokens: copy_head.LineTokens | None = None,
):
    """The clipped policy-gradient loss of composer.rl.losses on one micro-batch (see policy_loss).

    The 'old' policy is the batch's `old_logprobs` where it has them (several updates per rollout batch,
    rl.epochs x rl.minibatches: the learner's log-probs before the first), else the current parameters
    (one update: ratio 1, gradient of log p); truncated importance sampling corrects for the gap between
    the old policy and the sampler's (possibly stale) log-probs.
    """
    logp, entropy, aux = token_logprobs(
        params, batch["tokens"], batch["positions"], cfg, hp.temperature, line_tokens=line_tokens
    )
    return _policy_loss(logp, entropy, aux, batch, cfg, hp)


def batch_logprobs(
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    temperature: float = 1.0,
    *,
    line_tokens: copy_head.LineTokens | None = None,
):
    """A model's token log-probs for a [m, b, t] batch, one micro-batch at a time, at the sampler's
    temperature like the policy's: the reference model's for the KL term (`ref_logprobs`), or the learner's
    own before the first of several updates on one batch (`old_logprobs`, the PPO ratio's denominator)."""

    def micro(mb):
        return token_logprobs(
            params, mb["tokens"], mb["positions"], cfg, temperature, line_tokens=line_tokens
        )[0]

    return jax.lax.map(micro, {"tokens": batch["tokens"], "positions": batch["positions"]})


def _policy_loss(logp, entropy, aux: dict, batch: dict, cfg: model.ModelConfig, hp: RLHParams):
    mask = batch["loss_mask"].astype(jnp.float32)
    sampler_logprobs, old_logprobs = batch["sampler_logprobs"], batch.get("old_logprobs")
    if "off_policy" in batch:
        # Sequences the sampler never drew (the expert's guide, composer/pipeline/expert_members.py) have
        # no behaviour log-probs: scored as if sampled from the old policy (IS weight 1), their gradient is
        # advantage x grad log p (x the PPO ratio after a first update), a weighted likelihood step.
        off = batch["off_policy"][:, None] > 0
        behaviour = jax.lax.stop_gradient(logp) if old_logprobs is None else old_logprobs
        sampler_logprobs = jnp.where(off, behaviour, sampler_logprobs)
    loss, sums = losses.policy_loss(
        logp,
        batch["advantages"],
        mask,
        clip_low=hp.clip_low,
        clip_high=hp.clip_high,
        old_logprobs=old_logprobs,
        sampler_logprobs=sampler_logprobs,
        tis_cap=hp.tis_cap,
        ref_logprobs=batch["ref_logprobs"] if hp.kl_coef > 0 else None,
        kl_coef=hp.kl_coef,
        truncated=batch["truncated"] if hp.mask_truncated else None,
        entropy=entropy,
        aggregation=hp.aggregation,
        norm_len=hp.norm_len,
    )
    count = mask.sum()
    total = loss.total + _aux_loss(aux, cfg) * loss.count
    sums = dict(sums, loss=loss, load_balance_loss=losses.MaskedSum(aux["load_balance_loss"] * count, count))
    return total, sums


def _state_values(aux: dict) -> jax.Array:
    """The critic's V(s_i) for the state before token i: out[b, i] = values[b, i - 1] (0 at i = 0), so it is
    target-aligned like token_logprobs (the hidden state at i - 1 has seen tokens[:i])."""
    values = aux["values"]
    return jnp.concatenate([jnp.zeros_like(values[:, :1]), values[:, :-1]], axis=1)


class PPOHParams(NamedTuple):
    """The policy loss's knobs plus the critic's (static, hashable)."""

    policy: RLHParams = RLHParams()
    value_coef: float = 0.5
    value_clip: float | None = None
    gamma: float = 1.0
    lam: float = 0.95

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "PPOHParams":
        rl = config.rl
        return cls(
            policy=RLHParams.from_config(config),
            value_coef=rl.value_coef,
            value_clip=rl.value_clip or None,
            gamma=rl.gamma,
            lam=rl.gae_lambda,
        )


def ppo_targets(
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    hp: PPOHParams,
    *,
    line_tokens: copy_head.LineTokens | None = None,
) -> dict:
    """GAE advantages and value targets of a rollout batch under the current critic (before the update).

    batch: [m, b, t] arrays with per-sequence 'rewards' [m, b] (the outcome, placed on the last generated
    token) and loss_mask marking the generated tokens (the time steps). Returns {'advantages' (whitened over
    the batch's valid tokens), 'returns', 'old_values'}, each [m, b, t] float32.
    """

    def micro(mb):
        _, _, aux = model.forward(params, mb["tokens"], mb["positions"], cfg, line_tokens=line_tokens)
        values = _state_values(aux)
        mask = mb["loss_mask"].astype(jnp.float32)
        token_rewards = adv_lib.outcome_token_rewards(mb["rewards"], mask)
        est = adv_lib.gae(token_rewards, values, mask, gamma=hp.gamma, lam=hp.lam)
        return est.advantages, est.returns, values * mask

    adv, returns, values = jax.lax.map(micro, batch)
    adv = adv_lib.masked_whiten(adv, batch["loss_mask"])
    return {"advantages": adv, "returns": returns, "old_values": values}


def ppo_loss(
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    hp: PPOHParams,
    *,
    line_tokens: copy_head.LineTokens | None = None,
):
    """PPO: the clipped policy loss on per-token GAE advantages plus value_coef times the value loss."""
    temperature = hp.policy.temperature
    logp, entropy, aux = token_logprobs(
        params, batch["tokens"], batch["positions"], cfg, temperature, line_tokens=line_tokens
    )
    policy_total, sums = _policy_loss(logp, entropy, aux, batch, cfg, hp.policy)
    vloss, vmetrics = losses.value_loss(
        _state_values(aux),
        batch["returns"],
        batch["loss_mask"],
        old_values=batch["old_values"],
        value_clip=hp.value_clip,
        truncated=batch["truncated"] if hp.policy.mask_truncated else None,
    )
    # Scale the value loss's mean onto the policy loss's count, so grads / count weight it by value_coef.
    scale = sums["loss"].count / jnp.maximum(vloss.count, 1.0)
    total = policy_total + hp.value_coef * vloss.total * scale
    return total, dict(sums, value_loss=vloss, **vmetrics)


# loss_fn(params, micro_batch, cfg, hp, *, line_tokens) -> (differentiable total, {name: MaskedSum})
LossFn = Callable[..., tuple[jax.Array, dict]]


def accumulate_grads(
    loss_fn: LossFn,
    params: PyTree,
    batch: dict,
    cfg: model.ModelConfig,
    hp: Any,
    line_tokens: copy_head.LineTokens | None = None,
):
    """Scans micro-batches (leading axis of every batch array), summing grads (in f32 whatever the params'
    dtype: bf16 sums of many micro-batches would round away the small ones) and MaskedSums."""
    loss_fn = functools.partial(loss_fn, line_tokens=line_tokens)
    grad_fn = jax.grad(loss_fn, has_aux=True)

    def body(carry, micro):
        grads, sums = carry
        g, m = grad_fn(params, micro, cfg, hp)
        grads = jax.tree.map(lambda acc, x: acc + x.astype(acc.dtype), grads, g)
        return (grads, jax.tree.map(jnp.add, sums, m)), None

    first = jax.tree.map(lambda x: x[0], batch)
    sum_shapes = jax.eval_shape(lambda: loss_fn(params, first, cfg, hp)[1])
    zero_sums = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sum_shapes)
    zero_grads = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)  # params are all floats
    (grads, sums), _ = jax.lax.scan(body, (zero_grads, zero_sums), batch)
    return grads, sums


def apply_grads(
    state: TrainState, grads: PyTree, count: jax.Array, optimizer: optax.GradientTransformation
) -> tuple[TrainState, dict]:
    """Turns summed grads into the mean over `count` and takes one optimizer step: on the f32 master copy
    where there is one (the grads in f32 too), params then its rounding to their own dtype."""
    weights = state.params if state.master is None else state.master
    grads = jax.tree.map(lambda g, w: g.astype(w.dtype) / jnp.maximum(count, 1e-12), grads, weights)
    updates, opt_state = optimizer.update(grads, state.opt_state, weights)
    weights = optax.apply_updates(weights, updates)
    if state.master is None:
        params, master = weights, None
    else:
        params, master = jax.tree.map(lambda w, p: w.astype(p.dtype), weights, state.params), weights
    new = TrainState(step=state.step + 1, params=params, opt_state=opt_state, master=master)
    return new, {"grad_norm": optax.tree.norm(grads), "update_norm": optax.tree.norm(updates)}


def _step(loss_fn, state, batch, cfg, optimizer, hp, line_tokens):
    grads, sums = accumulate_grads(loss_fn, state.params, batch, cfg, hp, line_tokens)
    state, metrics = apply_grads(state, grads, sums["loss"].count, optimizer)
    metrics.update(losses.finish_all(sums))
    metrics["tokens"] = sums["loss"].count
    return state, metrics


def sft_step(
    state: TrainState,
    batch: dict,
    key: jax.Array,
    *,
    cfg,
    optimizer,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[TrainState, dict]:
    """One SFT update on `batch` ([m, b, t] arrays). `key` is unused (no dropout); kept for the API."""
    del key
    return _step(sft_loss, state, batch, cfg, optimizer, None, line_tokens)


def rl_step(
    state: TrainState,
    batch: dict,
    key: jax.Array,
    *,
    cfg,
    optimizer,
    hp: RLHParams,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[TrainState, dict]:
    """One GRPO-family update on `batch` ([m, b, t] arrays plus advantages, per sequence or per token, and
    truncated)."""
    del key
    return _step(rl_loss, state, batch, cfg, optimizer, hp, line_tokens)


def ppo_step(
    state: TrainState,
    batch: dict,
    key: jax.Array,
    *,
    cfg,
    optimizer,
    hp: PPOHParams,
    line_tokens: copy_head.LineTokens | None = None,
) -> tuple[TrainState, dict]:
    """One PPO update: batch as rl_step's with per-token advantages, 'returns' and 'old_values'."""
    del key
    return _step(ppo_loss, state, batch, cfg, optimizer, hp, line_tokens)


def jit_step(step_fn: Callable, state: TrainState, batch_example: dict, mesh, rules, **static) -> Callable:
    """Jits `step_fn` with the state's own shardings (in and out), batch sharded along 'batch', and the
    state donated. `state` must already be placed (e.g. params born sharded via sharding.init_sharded)."""
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    batch_shardings = sharding.batch_shardings(batch_example, mesh, rules)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    fn = functools.partial(step_fn, **static)
    return jax.jit(
        fn,
        in_shardings=(state_shardings, batch_shardings, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )
