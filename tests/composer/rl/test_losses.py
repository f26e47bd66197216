"""Policy and value losses against loop-by-loop numpy versions; gradients; exact micro-batching."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer.rl import losses

CLIP_LOW, CLIP_HIGH, TIS_CAP, KL_COEF = 0.2, 0.28, 2.0, 0.05


def _batch(seed: int = 0, b: int = 6, t: int = 9) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    old = -rng.uniform(0.1, 3.0, size=(b, t))
    mask = (rng.random((b, t)) > 0.3).astype(np.float32)
    mask[4] = 0.0  # a sequence with nothing to learn from
    # Ratios spread well past both clip bounds, so every branch is exercised.
    logp = old + rng.normal(0.0, 0.4, size=(b, t))
    logp[5] = -np.inf  # padding may hold anything where the mask is 0 ...
    mask[5] = 0.0
    sampler = old + rng.normal(0.0, 0.5, size=(b, t))
    return {
        "logprobs": logp.astype(np.float32),
        "old_logprobs": old.astype(np.float32),
        "sampler_logprobs": sampler.astype(np.float32),
        "ref_logprobs": (old + rng.normal(0.0, 0.3, size=(b, t))).astype(np.float32),
        "advantages": rng.normal(size=(b,)).astype(np.float32),
        "mask": mask,
        "truncated": np.array([False, True, False, False, False, False]),
        "entropy": rng.uniform(0.0, 2.0, size=(b, t)).astype(np.float32),
    }


def _np_policy(d, *, use_sampler, use_ref, use_truncated, aggregation, norm_len=None):
    """Per-token loop; returns (loss, per-token dict of metric lists)."""
    b, t = d["mask"].shape
    per_seq_sum, per_seq_n = [0.0] * b, [0.0] * b
    metrics = {k: [] for k in ("ratio", "clip_frac", "approx_kl", "tis_weight", "kl_ref", "entropy", "pg")}
    for i in range(b):
        if use_truncated and d["truncated"][i]:
            continue
        a = float(d["advantages"][i])
        for j in range(t):
            if d["mask"][i, j] == 0:
                continue
            lp, old = float(d["logprobs"][i, j]), float(d["old_logprobs"][i, j])
            ratio = math.exp(lp - old)
            clipped = min(max(ratio, 1 - CLIP_LOW), 1 + CLIP_HIGH)
            pg = -min(ratio * a, clipped * a)
            w = 1.0
            if use_sampler:
                w = min(math.exp(old - float(d["sampler_logprobs"][i, j])), TIS_CAP)
            loss = w * pg
            if use_ref:
                diff = float(d["ref_logprobs"][i, j]) - lp
                kl = math.exp(diff) - diff - 1
                loss += KL_COEF * kl
                metrics["kl_ref"].append(kl)
            per_seq_sum[i] += loss
            per_seq_n[i] += 1
            metrics["ratio"].append(ratio)
            metrics["clip_frac"].append(
                float((a > 0 and ratio > 1 + CLIP_HIGH) or (a < 0 and ratio < 1 - CLIP_LOW))
            )
            metrics["approx_kl"].append(ratio - 1 - math.log(ratio))
            metrics["tis_weight"].append(w)
            metrics["entropy"].append(float(d["entropy"][i, j]))
            metrics["pg"].append(w * pg)
    seqs = [i for i in range(b) if per_seq_n[i] > 0]
    if aggregation == "token_mean":
        value = sum(per_seq_sum) / sum(per_seq_n)
    elif aggregation == "seq_mean_token_mean":
        value = sum(per_seq_sum[i] / per_seq_n[i] for i in seqs) / len(seqs)
    else:
        value = sum(per_seq_sum) / (len(seqs) * (t if norm_len is None else norm_len))
    return value, metrics


def _call(d, *, use_sampler=True, use_ref=True, use_truncated=True, aggregation="token_mean", norm_len=None):
    j = {k: jnp.asarray(v) for k, v in d.items()}
    return losses.policy_loss(
        j["logprobs"],
        j["advantages"],
        j["mask"],
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        old_logprobs=j["old_logprobs"],
        sampler_logprobs=j["sampler_logprobs"] if use_sampler else None,
        tis_cap=TIS_CAP if use_sampler else None,
        ref_logprobs=j["ref_logprobs"] if use_ref else None,
        kl_coef=KL_COEF,
        truncated=j["truncated"] if use_truncated else None,
        entropy=j["entropy"],
        aggregation=aggregation,
        norm_len=norm_len,
    )


@pytest.mark.parametrize("aggregation", sorted(losses.AGGREGATIONS))
@pytest.mark.parametrize("use_sampler,use_ref,use_truncated", [(True, True, True), (False, False, False)])
def test_policy_loss_matches_numpy(aggregation, use_sampler, use_ref, use_truncated):
    d = _batch()
    flags = dict(
        use_sampler=use_sampler, use_ref=use_ref, use_truncated=use_truncated, aggregation=aggregation
    )
    loss, metrics = _call(d, **flags)
    expected, exp_metrics = _np_policy(d, **flags)
    assert np.isfinite(float(loss.total))
    np.testing.assert_allclose(losses.finish(loss), expected, rtol=1e-5, atol=1e-6)
    got = losses.finish_all(metrics)
    for name, key in [("ratio", "ratio"), ("clip_frac", "clip_frac"), ("approx_kl", "approx_kl"),
                      ("entropy", "entropy"), ("pg_loss", "pg")]:  # fmt: skip
        np.testing.assert_allclose(got[name], np.mean(exp_metrics[key]), rtol=1e-5, atol=1e-6)
    assert ("tis_weight" in got) == use_sampler and ("kl_ref" in got) == use_ref
    if use_sampler:
        np.testing.assert_allclose(got["tis_weight"], np.mean(exp_metrics["tis_weight"]), rtol=1e-5)
        assert 0.0 < float(got["tis_capped_frac"]) < 1.0
    if use_ref:
        np.testing.assert_allclose(got["kl_ref"], np.mean(exp_metrics["kl_ref"]), rtol=1e-5)
    # Both clip bounds are hit in this batch; the counts split into low and high.
    assert float(got["clip_frac_low"]) > 0 and float(got["clip_frac_high"]) > 0
    np.testing.assert_allclose(got["clip_frac"], got["clip_frac_low"] + got["clip_frac_high"], rtol=1e-6)


def test_token_advantages_broadcast_like_sequence_advantages():
    d = _batch(1)
    seq_loss, _ = _call(d)
    d_tok = dict(d, advantages=np.repeat(d["advantages"][:, None], d["mask"].shape[1], axis=1))
    tok_loss, _ = _call(d_tok)
    np.testing.assert_allclose(losses.finish(tok_loss), losses.finish(seq_loss), rtol=1e-6)


def test_gradient_is_zero_exactly_where_clipped():
    d = _batch(2, b=8, t=16)
    d["mask"][4:6] = 1.0
    d["logprobs"][5] = d["old_logprobs"][5] + 0.1
    d["truncated"] = np.zeros(8, bool)
    j = {k: jnp.asarray(v) for k, v in d.items()}

    def f(logp):
        loss, _ = losses.policy_loss(
            logp, j["advantages"], j["mask"], clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
            old_logprobs=j["old_logprobs"], sampler_logprobs=j["sampler_logprobs"], tis_cap=TIS_CAP,
        )  # fmt: skip
        return losses.finish(loss)

    grad = np.asarray(jax.grad(f)(j["logprobs"]))
    ratio = np.exp(d["logprobs"] - d["old_logprobs"])
    a = d["advantages"][:, None]
    clipped = ((a > 0) & (ratio > 1 + CLIP_HIGH)) | ((a < 0) & (ratio < 1 - CLIP_LOW))
    live = (d["mask"] > 0) & ~clipped
    assert clipped[d["mask"] > 0].sum() >= 5 and live.sum() >= 5
    assert np.all(grad[clipped] == 0.0) and np.all(grad[d["mask"] == 0] == 0.0)
    # Elsewhere the token contributes -w * rho * A / n, and d rho / d logp = rho.
    w = np.minimum(np.exp(d["old_logprobs"] - d["sampler_logprobs"]), TIS_CAP)
    expected = -w * ratio * a / d["mask"].sum()
    np.testing.assert_allclose(grad[live], expected[live], rtol=1e-4, atol=1e-7)


def test_on_policy_ratio_is_one_and_gradient_is_the_policy_gradient():
    # With no old log-probs the ratio is exp(logp - stop_gradient(logp)) = 1: a plain REINFORCE gradient.
    d = _batch(3)
    j = {k: jnp.asarray(v) for k, v in d.items()}
    m = j["mask"]

    def f(logp):
        loss, metrics = losses.policy_loss(logp, j["advantages"], m, clip_low=CLIP_LOW, clip_high=CLIP_HIGH)
        return losses.finish(loss), metrics

    grad, metrics = jax.grad(f, has_aux=True)(j["old_logprobs"])
    np.testing.assert_allclose(losses.finish(metrics["ratio"]), 1.0, rtol=1e-6)
    assert float(losses.finish(metrics["clip_frac"])) == 0.0
    np.testing.assert_allclose(
        grad, -d["advantages"][:, None] * d["mask"] / d["mask"].sum(), rtol=1e-5, atol=1e-8
    )


def test_k3_is_nonnegative_and_zero_at_equality():
    rng = np.random.default_rng(4)
    lp = jnp.asarray(-rng.uniform(0, 10, size=1000), jnp.float32)
    ref = jnp.asarray(-rng.uniform(0, 10, size=1000), jnp.float32)
    kl = np.asarray(losses.k3_kl(lp, ref))
    expected = np.array([math.exp(r - p) - (r - p) - 1 for p, r in zip(np.asarray(lp), np.asarray(ref))])
    np.testing.assert_allclose(kl, expected, rtol=1e-4, atol=1e-5)
    assert np.all(kl >= 0.0)
    np.testing.assert_array_equal(losses.k3_kl(lp, lp), np.zeros(1000))


@pytest.mark.parametrize("aggregation", sorted(losses.AGGREGATIONS))
def test_micro_batches_sum_to_the_full_batch(aggregation):
    d = _batch(5, b=8, t=12)
    d["truncated"] = np.array([False, True, False, False, False, False, False, True])
    j = {k: jnp.asarray(v) for k, v in d.items()}
    kw = dict(clip_low=CLIP_LOW, clip_high=CLIP_HIGH, tis_cap=TIS_CAP, kl_coef=KL_COEF)
    kw.update(aggregation=aggregation, norm_len=32)

    @jax.jit
    def sums_and_grad(logp, adv, mask, old, sampler, ref, truncated, entropy):
        def total(lp):
            loss, metrics = losses.policy_loss(
                lp, adv, mask, old_logprobs=old, sampler_logprobs=sampler, ref_logprobs=ref,
                truncated=truncated, entropy=entropy, **kw,
            )  # fmt: skip
            return loss.total, (loss, metrics)

        grad, (loss, metrics) = jax.grad(total, has_aux=True)(logp)
        return loss, metrics, grad

    def run(rows):
        keys = ("logprobs", "advantages", "mask", "old_logprobs", "sampler_logprobs", "ref_logprobs",
                "truncated", "entropy")  # fmt: skip
        return sums_and_grad(*[j[k][rows] for k in keys])

    full, full_metrics, full_grad = run(np.arange(8))
    parts = [run(rows) for rows in (np.arange(0, 3), np.arange(3, 8))]  # uneven micro-batches
    loss_acc, metrics_acc = jax.tree.map(lambda *xs: sum(xs), *[(p[0], p[1]) for p in parts])
    grad_acc = jnp.concatenate([p[2] for p in parts])  # each row's gradient comes from its own micro-batch
    np.testing.assert_allclose(loss_acc.count, full.count)
    np.testing.assert_allclose(losses.finish(loss_acc), losses.finish(full), rtol=1e-5)
    np.testing.assert_allclose(grad_acc / loss_acc.count, full_grad / full.count, rtol=1e-5, atol=1e-8)
    for k in full_metrics:
        np.testing.assert_allclose(losses.finish(metrics_acc[k]), losses.finish(full_metrics[k]), rtol=1e-5)


def test_truncated_sequences_carry_no_loss():
    d = _batch(6)
    j = {k: jnp.asarray(v) for k, v in d.items()}

    def grad_with(truncated):
        def f(logp):
            loss, _ = losses.policy_loss(
                logp, j["advantages"], j["mask"], clip_low=CLIP_LOW, clip_high=CLIP_HIGH,
                old_logprobs=j["old_logprobs"], truncated=truncated,
            )  # fmt: skip
            return losses.finish(loss)

        return np.asarray(jax.grad(f)(j["logprobs"]))

    g = grad_with(j["truncated"])
    assert not g[1].any() and g[0].any()  # row 1 is flagged truncated
    assert grad_with(None)[1].any()


def test_unknown_aggregation_is_rejected():
    d = _batch()
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        _call(d, aggregation="sum")
    assert set(losses.DEFAULT_AGGREGATION.values()) <= set(losses.AGGREGATIONS)


def test_entropy_from_logits():
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 3, size=(2, 3, 11)).astype(np.float32)
    expected = np.zeros((2, 3))
    for i in range(2):
        for k in range(3):
            z = np.exp(logits[i, k] - logits[i, k].max())
            p = z / z.sum()
            expected[i, k] = -sum(float(x) * math.log(float(x)) for x in p)
    np.testing.assert_allclose(losses.entropy_from_logits(jnp.asarray(logits)), expected, rtol=1e-5)


@pytest.mark.parametrize("value_clip", [None, 0.2])
def test_value_loss_matches_numpy(value_clip):
    rng = np.random.default_rng(8)
    b, t = 4, 7
    v = rng.normal(size=(b, t)).astype(np.float32)
    old = (v + rng.normal(0, 0.4, size=(b, t))).astype(np.float32)
    ret = rng.normal(size=(b, t)).astype(np.float32)
    mask = (rng.random((b, t)) > 0.3).astype(np.float32)
    trunc = np.array([False, False, True, False])
    total, n, clip_hits = 0.0, 0, 0
    zero_grad = np.zeros((b, t), bool)
    for i in range(b):
        for j in range(t):
            if mask[i, j] == 0 or trunc[i]:
                continue
            e = (float(v[i, j]) - float(ret[i, j])) ** 2
            if value_clip is not None:
                vc = float(old[i, j]) + min(max(float(v[i, j] - old[i, j]), -value_clip), value_clip)
                ec = (vc - float(ret[i, j])) ** 2
                if ec > e:
                    e, clip_hits, zero_grad[i, j] = ec, clip_hits + 1, True
            total += 0.5 * e
            n += 1

    def f(values):
        loss, metrics = losses.value_loss(
            values, jnp.asarray(ret), jnp.asarray(mask), old_values=jnp.asarray(old), value_clip=value_clip,
            truncated=jnp.asarray(trunc),
        )  # fmt: skip
        return losses.finish(loss), metrics

    (value, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(v))
    np.testing.assert_allclose(value, total / n, rtol=1e-5)
    grad = np.asarray(grad)
    if value_clip is None:
        np.testing.assert_allclose(grad, (v - ret) * mask * ~trunc[:, None] / n, rtol=1e-5, atol=1e-7)
    else:
        np.testing.assert_allclose(losses.finish(metrics["value_clip_frac"]), clip_hits / n, rtol=1e-6)
        assert zero_grad.sum() > 0 and np.all(grad[zero_grad] == 0.0)
    with pytest.raises(ValueError, match="old_values"):
        losses.value_loss(jnp.asarray(v), jnp.asarray(ret), jnp.asarray(mask), value_clip=0.2)
