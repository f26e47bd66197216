"""Policy and value losses for GRPO / PPO, reduced as (sum, count) pairs so micro-batching stays exact.

Every loss and metric is a `MaskedSum(total, count)`; sum the pairs over micro-batches, then `finish` divides
once. Because the count does not depend on the parameters, the gradient of `total` summed over micro-batches
and divided by the summed count equals the gradient of the full-batch mean.

Log-prob arrays are target-aligned `[b, t]`: entry (i, j) is the log-prob of token j of sequence i. Three
policies meet here:
  - the sampler (behaviour) policy that generated the tokens: `sampler_logprobs`, recorded while sampling;
  - the learner's old policy, the parameters before this update, recomputed by the learner:
    `old_logprobs` (None: the current parameters, i.e. `stop_gradient(logprobs)`, one update per batch);
  - the learner's current policy being optimised: `logprobs` (gradients flow through it).
The PPO ratio compares current with old; truncated importance sampling corrects for the gap between old and
sampler (different numerics, or a policy some versions stale).
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer import registry


class MaskedSum(NamedTuple):
    total: jax.Array  # scalar: the masked sum (differentiable for a loss)
    count: jax.Array  # scalar: what the sum is divided by (tokens, sequences, ...)


def finish(s: MaskedSum) -> jax.Array:
    """total / count, and 0 where nothing was counted."""
    return jnp.where(s.count > 0, s.total / jnp.maximum(s.count, 1e-12), 0.0)


def finish_all(sums: dict[str, MaskedSum]) -> dict[str, jax.Array]:
    """`finish` of each entry of a dict of MaskedSums (e.g. metrics accumulated over micro-batches)."""
    return {k: finish(v) for k, v in sums.items()}


def masked_token_sum(x: jax.Array, mask: jax.Array) -> MaskedSum:
    """(sum_bt m * x, sum_bt m): the pieces of the masked token mean."""
    return MaskedSum(jnp.sum(x * mask), jnp.sum(mask))


# ---------------------------------------------------------------------------------------- aggregation


def token_mean(loss: jax.Array, mask: jax.Array, norm_len: int | None = None) -> MaskedSum:
    """Every valid token weighs the same (DAPO, Yu et al. 2025): sum_bt m l / sum_bt m."""
    del norm_len
    return masked_token_sum(loss, mask)


def seq_mean_token_mean(loss: jax.Array, mask: jax.Array, norm_len: int | None = None) -> MaskedSum:
    """Original GRPO: the mean over tokens within each sequence, then over sequences.

    sum_b [ (sum_t m l) / (sum_t m) ] / #{b : sum_t m > 0}. Long sequences' tokens weigh less (the
    per-sequence length normalisation that Dr. GRPO removes).
    """
    del norm_len
    n_b = mask.sum(axis=-1)
    per_seq = jnp.where(n_b > 0, (loss * mask).sum(axis=-1) / jnp.maximum(n_b, 1.0), 0.0)
    return MaskedSum(per_seq.sum(), (n_b > 0).sum().astype(jnp.float32))


def seq_mean_token_sum_norm(loss: jax.Array, mask: jax.Array, norm_len: int | None = None) -> MaskedSum:
    """Dr. GRPO (Liu et al. 2025): token sums per sequence divided by one constant length L, then averaged.

    sum_bt m l / (#{b : sum_t m > 0} * L), L = `norm_len` (the generation budget; default: t, the padded
    length, which is exact across micro-batches only if they share it).
    """
    length = loss.shape[-1] if norm_len is None else norm_len
    n_seq = (mask.sum(axis=-1) > 0).sum().astype(jnp.float32)
    return MaskedSum(jnp.sum(loss * mask), n_seq * length)


AGGREGATIONS: dict[str, Callable[..., MaskedSum]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}
# The aggregation each advantage estimator comes with (config.rl.algorithm -> aggregation name).
DEFAULT_AGGREGATION = {
    "grpo": "token_mean",
    "drgrpo": "seq_mean_token_sum_norm",
    "rloo": "token_mean",
    "gae": "token_mean",
}


# ---------------------------------------------------------------------------------------- policy loss


def k3_kl(logprobs: jax.Array, ref_logprobs: jax.Array) -> jax.Array:
    """The k3 estimator of KL(pi || pi_ref) per token (Schulman 2020): exp(d) - d - 1, d = ref - logp.

    Unbiased for samples of pi and never negative (e^d >= 1 + d).
    """
    d = ref_logprobs - logprobs
    return jnp.exp(d) - d - 1.0


def entropy_from_logits(logits: jax.Array) -> jax.Array:
    """Entropy of the next-token distribution: logits [b, t, v] -> [b, t], H = -sum_v p log p."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def policy_loss(
    logprobs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float,
    clip_high: float,
    old_logprobs: jax.Array | None = None,
    sampler_logprobs: jax.Array | None = None,
    tis_cap: float | None = None,
    ref_logprobs: jax.Array | None = None,
    kl_coef: float = 0.0,
    truncated: jax.Array | None = None,
    entropy: jax.Array | None = None,
    aggregation: str = "token_mean",
    norm_len: int | None = None,
) -> tuple[MaskedSum, dict[str, MaskedSum]]:
    """The PPO clipped surrogate (Schulman et al. 2017) with asymmetric clipping (DAPO's clip-higher).

    logprobs, old_logprobs, sampler_logprobs, ref_logprobs, mask, entropy: [b, t]; advantages: [b] (one per
    sequence) or [b, t]; truncated: [b] bool. Per valid token:

        rho   = exp(logp - logp_old)
        pg    = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)
        w     = stop_gradient(min(exp(logp_old - logp_sampler), tis_cap))     (truncated IS; 1 if absent)
        loss  = w * pg + kl_coef * k3(logp, logp_ref)                          (KL term only with a reference)

    Where the clipped branch is taken the token's gradient is zero: for A > 0 once rho > 1 + clip_high, for
    A < 0 once rho < 1 - clip_low. A sequence flagged `truncated` (hit a turn/token/time limit, so its
    reward says little) has its mask zeroed. The loss is reduced by `aggregation` (AGGREGATIONS).

    Returns (loss MaskedSum, metrics): metrics are token means as MaskedSums: pg_loss, ratio, clip_frac
    (tokens whose gradient the clip removed), clip_frac_low, clip_frac_high, approx_kl (k3 of old vs current),
    and, when their inputs are given, tis_weight, tis_capped_frac, kl_ref, entropy.
    """
    mask = mask.astype(jnp.float32)
    if truncated is not None:
        mask = mask * (1.0 - truncated.astype(jnp.float32))[:, None]
    valid = mask > 0
    logprobs = logprobs.astype(jnp.float32)
    old = jax.lax.stop_gradient(logprobs if old_logprobs is None else old_logprobs.astype(jnp.float32))
    adv = advantages.astype(jnp.float32)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logprobs.shape)

    # Masked positions may hold anything (padding, -inf): keep them out of exp().
    log_ratio = jnp.where(valid, logprobs - old, 0.0)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = jnp.maximum(-ratio * adv, -clipped_ratio * adv)

    metrics: dict[str, MaskedSum] = {}
    if sampler_logprobs is not None:
        gap = jnp.where(valid, old - sampler_logprobs.astype(jnp.float32), 0.0)
        raw_weight = jnp.exp(gap)
        weight = raw_weight if tis_cap is None else jnp.minimum(raw_weight, tis_cap)
        weight = jax.lax.stop_gradient(weight)
        pg = pg * weight
        metrics["tis_weight"] = masked_token_sum(weight, mask)
        if tis_cap is not None:
            metrics["tis_capped_frac"] = masked_token_sum((raw_weight > tis_cap).astype(jnp.float32), mask)

    loss = pg
    if ref_logprobs is not None:
        kl = k3_kl(jnp.where(valid, logprobs, 0.0), jnp.where(valid, ref_logprobs.astype(jnp.float32), 0.0))
        loss = loss + kl_coef * kl
        metrics["kl_ref"] = masked_token_sum(jax.lax.stop_gradient(kl), mask)

    sg = jax.lax.stop_gradient
    clip_high_on = (adv > 0) & (sg(ratio) > 1.0 + clip_high)
    clip_low_on = (adv < 0) & (sg(ratio) < 1.0 - clip_low)
    metrics["pg_loss"] = masked_token_sum(sg(pg), mask)
    metrics["ratio"] = masked_token_sum(sg(ratio), mask)
    metrics["clip_frac"] = masked_token_sum((clip_high_on | clip_low_on).astype(jnp.float32), mask)
    metrics["clip_frac_high"] = masked_token_sum(clip_high_on.astype(jnp.float32), mask)
    metrics["clip_frac_low"] = masked_token_sum(clip_low_on.astype(jnp.float32), mask)
    metrics["approx_kl"] = masked_token_sum(sg((ratio - 1.0) - log_ratio), mask)
    if entropy is not None:
        metrics["entropy"] = masked_token_sum(sg(entropy.astype(jnp.float32)), mask)

    aggregate = registry.resolve(AGGREGATIONS, aggregation, "loss aggregation")
    return aggregate(loss, mask, norm_len), metrics


# ---------------------------------------------------------------------------------------- value loss


def value_loss(
    values: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    old_values: jax.Array | None = None,
    value_clip: float | None = None,
    truncated: jax.Array | None = None,
) -> tuple[MaskedSum, dict[str, MaskedSum]]:
    """PPO's value loss, a token mean; clipped around the old values when `value_clip` is given.

    values, returns, old_values, mask: [b, t]; truncated: [b] bool (zeroes those sequences' masks).

        unclipped:  L = 1/2 (V - R)^2
        clipped:    V_c = V_old + clip(V - V_old, -value_clip, value_clip)
                    L = 1/2 max((V - R)^2, (V_c - R)^2)

    Returns (loss MaskedSum, metrics): value_error (mean squared error (V - R)^2) and, when clipping,
    value_clip_frac (tokens where the clipped term is the larger, so V gets no gradient).
    """
    mask = mask.astype(jnp.float32)
    if truncated is not None:
        mask = mask * (1.0 - truncated.astype(jnp.float32))[:, None]
    values, returns = values.astype(jnp.float32), jax.lax.stop_gradient(returns.astype(jnp.float32))
    err = (values - returns) ** 2
    metrics = {"value_error": masked_token_sum(jax.lax.stop_gradient(err), mask)}
    if value_clip is None:
        return masked_token_sum(0.5 * err, mask), metrics
    if old_values is None:
        raise ValueError("a clipped value loss needs old_values")
    old_values = jax.lax.stop_gradient(old_values.astype(jnp.float32))
    v_clipped = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    err_clipped = (v_clipped - returns) ** 2
    metrics["value_clip_frac"] = masked_token_sum(
        jax.lax.stop_gradient(err_clipped > err).astype(jnp.float32), mask
    )
    return masked_token_sum(0.5 * jnp.maximum(err, err_clipped), mask), metrics
