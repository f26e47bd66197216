"""Train steps: exact micro-batching, SFT learns, the RL loss by hand, sharded equals single-device."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from step_batches import random_batch

from composer import model, sharding, train
from composer.rl import losses
from experiments import composer as composer_config

CFG = model.ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=32)


def _batch(key, m, b, t, rl=False):
    return random_batch(key, m, b, t, vocab_size=CFG.vocab_size, rl=rl)


def _optimizer():
    return train.make_optimizer(composer_config.get_config("tiny").optim, 1e-2, 10)


@pytest.mark.parametrize("loss_fn, rl", [(train.sft_loss, False), (train.rl_loss, True)])
def test_micro_batches_equal_one_big_batch(loss_fn, rl):
    params = model.init(jax.random.key(0), CFG)
    batch = _batch(jax.random.key(1), 4, 2, 16, rl)
    hp = train.RLHParams(aggregation="token_mean")
    g4, s4 = train.accumulate_grads(loss_fn, params, batch, CFG, hp)
    big = jax.tree.map(lambda x: x.reshape((1, -1) + x.shape[2:]), batch)
    g1, s1 = train.accumulate_grads(loss_fn, params, big, CFG, hp)
    # Aux losses are per micro-batch means, so compare without them.
    np.testing.assert_allclose(s4["loss"].total, s1["loss"].total, rtol=1e-5)
    np.testing.assert_allclose(s4["loss"].count, s1["loss"].count)
    if not rl:
        cfg0 = model.ModelConfig(**{**CFG.__dict__, "aux_loss_coef": 0.0, "z_loss_coef": 0.0})
        g4, _ = train.accumulate_grads(loss_fn, params, batch, cfg0, hp)
        g1, _ = train.accumulate_grads(loss_fn, params, big, cfg0, hp)
        for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(g1)):
            # f32 sums in a different order: allow a few ulps against the gradient's scale.
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5 * float(np.abs(b).max()))


def test_sft_step_reduces_loss():
    params = model.init(jax.random.key(0), CFG)
    opt = _optimizer()
    state = train.init_state(params, opt)
    batch = _batch(jax.random.key(2), 2, 4, 16)
    step = jax.jit(lambda s, b, k: train.sft_step(s, b, k, cfg=CFG, optimizer=opt))
    first = None
    for i in range(10):
        state, metrics = step(state, batch, jax.random.key(i))
        first = metrics["loss"] if first is None else first
    assert int(state.step) == 10
    assert float(metrics["loss"]) < float(first) - 0.5


def test_rl_loss_equals_policy_loss_on_learner_logprobs():
    params = model.init(jax.random.key(0), CFG)
    batch = jax.tree.map(lambda x: x[0], _batch(jax.random.key(3), 1, 4, 16, rl=True))
    hp = train.RLHParams(kl_coef=0.0)
    cfg0 = model.ModelConfig(**{**CFG.__dict__, "aux_loss_coef": 0.0, "z_loss_coef": 0.0})
    total, sums = train.rl_loss(params, batch, cfg0, hp)
    logp, _, _ = train.token_logprobs(params, batch["tokens"], batch["positions"], cfg0)
    # By hand: ratio 1, so pg = -A * min(exp(logp - sampler), cap); truncated row masked.
    mask = batch["loss_mask"] * (1 - batch["truncated"][:, None])
    w = jnp.minimum(jnp.exp(logp - batch["sampler_logprobs"]), hp.tis_cap)
    expected = jnp.sum(-batch["advantages"][:, None] * w * mask)
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    np.testing.assert_allclose(losses.finish(sums["loss"]), expected / mask.sum(), rtol=1e-5)


def test_rl_step_takes_per_token_advantages():
    """Per-token advantages (as PPO's GAE gives) equal to each row's scalar give the same update; a
    token's own advantage moves only what that token's log-prob moves."""
    params = model.init(jax.random.key(0), CFG)
    opt = _optimizer()
    batch = _batch(jax.random.key(4), 2, 2, 16, rl=True)
    step = jax.jit(lambda s, b, k: train.rl_step(s, b, k, cfg=CFG, optimizer=opt, hp=train.RLHParams()))
    per_token = dict(
        batch, advantages=jnp.broadcast_to(batch["advantages"][..., None], batch["tokens"].shape)
    )
    s1, m1 = step(train.init_state(params, opt), batch, jax.random.key(0))
    s2, m2 = step(train.init_state(params, opt), per_token, jax.random.key(0))
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # By hand on one micro-batch: the loss is the mask-weighted sum of -A[b, t] * w[b, t].
    hp = train.RLHParams(kl_coef=0.0)
    cfg0 = model.ModelConfig(**{**CFG.__dict__, "aux_loss_coef": 0.0, "z_loss_coef": 0.0})
    mb = jax.tree.map(lambda x: x[0], per_token)
    mb["advantages"] = jax.random.normal(jax.random.key(5), mb["tokens"].shape)
    total, _ = train.rl_loss(params, mb, cfg0, hp)
    logp, _, _ = train.token_logprobs(params, mb["tokens"], mb["positions"], cfg0)
    mask = mb["loss_mask"] * (1 - mb["truncated"][:, None])
    w = jnp.minimum(jnp.exp(logp - mb["sampler_logprobs"]), hp.tis_cap)
    np.testing.assert_allclose(total, jnp.sum(-mb["advantages"] * w * mask), rtol=1e-5)


def test_sharded_sft_step_equals_single_device():
    config = composer_config.get_config("tiny")
    opt = _optimizer()
    batch = _batch(jax.random.key(4), 2, 8, 16)
    results = []
    for shape in ({"data": 1}, {"data": 2, "fsdp": 2, "expert": 2}):
        config.mesh.data, config.mesh.fsdp, config.mesh.expert = (
            shape.get("data", 1),
            shape.get("fsdp", 1),
            shape.get("expert", 1),
        )
        devices = jax.devices()[: int(np.prod(list(shape.values())))]
        mesh = sharding.make_mesh(config.mesh, devices)
        params = sharding.init_sharded(jax.random.key(0), CFG, mesh, config.mesh.rules)
        state = jax.jit(lambda p: train.init_state(p, opt))(params)
        step = train.jit_step(train.sft_step, state, batch, mesh, config.mesh.rules, cfg=CFG, optimizer=opt)
        state, metrics = step(state, batch, jax.random.key(0))
        results.append((jax.device_get(state.params), float(metrics["loss"])))
    (p1, l1), (p2, l2) = results
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


PPO_CFG = model.ModelConfig(**{**CFG.__dict__, "value_head": True})


def _ppo_batch(key):
    batch = _batch(key, 2, 3, 16, rl=True)
    del batch["ref_logprobs"]
    batch["truncated"] = jnp.zeros((2, 3), bool)
    batch["rewards"] = jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    return batch


def test_ppo_targets_under_a_zero_critic_are_the_outcome():
    params = model.init(jax.random.key(0), PPO_CFG)
    assert not np.any(params["value_head"]["w"])  # born at zero
    batch = _ppo_batch(jax.random.key(1))
    hp = train.PPOHParams(gamma=1.0, lam=1.0)
    out = train.ppo_targets(params, batch, PPO_CFG, hp)
    mask = np.asarray(batch["loss_mask"])
    # V = 0 everywhere and gamma = lam = 1: every generated token's return is its episode's reward.
    np.testing.assert_allclose(out["returns"], np.asarray(batch["rewards"])[..., None] * mask, atol=1e-6)
    np.testing.assert_allclose(out["old_values"], 0.0)
    # Advantages are whitened over the valid tokens: mean 0, std 1 there, 0 elsewhere.
    adv = np.asarray(out["advantages"])
    assert abs(adv[mask > 0].mean()) < 1e-5 and abs(adv[mask > 0].std() - 1.0) < 1e-3
    assert not np.any(adv[mask == 0])


def test_ppo_steps_fit_the_critic_and_move_the_policy():
    params = model.init(jax.random.key(0), PPO_CFG)
    opt = _optimizer()
    state = train.init_state(params, opt)
    batch = _ppo_batch(jax.random.key(1))
    hp = train.PPOHParams(gamma=1.0, lam=0.95)
    step = jax.jit(lambda s, b: train.ppo_step(s, b, jax.random.key(0), cfg=PPO_CFG, optimizer=opt, hp=hp))
    errors = []
    for _ in range(8):
        batch.update(train.ppo_targets(state.params, batch, PPO_CFG, hp))
        state, metrics = step(state, batch)
        errors.append(float(metrics["value_error"]))
        assert np.isfinite(float(metrics["loss"]))
    assert errors[-1] < 0.75 * errors[0], errors  # the critic fits the returns (lr warms up, then decays)
    assert np.any(np.asarray(state.params["value_head"]["w"]))
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params["unembed"], params["unembed"])
    assert moved > 0


def test_off_policy_rows_are_a_weighted_likelihood_step():
    """A row flagged off_policy (the expert's, never sampled) has IS weight 1 and ratio 1 whatever its
    sampler_logprobs hold, so d loss / d logp = -A * mask / count; an on-policy row with the same garbage
    log-probs is weighted by the capped IS ratio instead."""
    cfg0 = model.ModelConfig(**{**CFG.__dict__, "aux_loss_coef": 0.0, "z_loss_coef": 0.0})
    aux = {"load_balance_loss": jnp.zeros(()), "router_z_loss": jnp.zeros(())}
    mask = jnp.array([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    batch = {
        "loss_mask": mask,
        "advantages": jnp.array([2.0, 2.0]),
        "sampler_logprobs": jnp.full((2, 3), -30.0),  # far below logp: the raw IS weight is huge
        "truncated": jnp.array([False, False]),
        "off_policy": jnp.array([1.0, 0.0]),
    }
    hp = train.RLHParams(aggregation="token_mean", tis_cap=2.0)
    logp = jnp.full((2, 3), -1.0)
    entropy = jnp.zeros((2, 3))

    def loss(lp):
        total, sums = train._policy_loss(lp, entropy, aux, batch, cfg0, hp)
        return total / sums["loss"].count

    grad = np.asarray(jax.grad(loss)(logp))
    np.testing.assert_allclose(grad[0], [0.0, -2.0 / 4, -2.0 / 4], rtol=1e-6)
    np.testing.assert_allclose(grad[1], [0.0, -2.0 * 2.0 / 4, -2.0 * 2.0 / 4], rtol=1e-6)  # capped at 2


def test_bf16_params_move_at_a_small_learning_rate_through_the_f32_master_copy():
    """AdamW at 1e-6 on bf16 weights: applied to bf16 directly, most updates round away; the master copy
    takes every one, and the bf16 params, its rounding, move once the steps add up to their spacing."""
    cfg = model.ModelConfig(**{**CFG.__dict__, "param_dtype": "bfloat16"})
    params = model.init(jax.random.key(0), cfg)
    optim = composer_config.get_config("tiny").optim
    optim.warmup_steps = 0
    opt = train.make_optimizer(optim, 1e-6, 1000)
    state = train.init_state(params, opt)
    assert state.master is not None and state.master["unembed"].dtype == jnp.float32
    assert train.init_state(model.init(jax.random.key(0), CFG), opt).master is None  # f32: no copy
    batch = _batch(jax.random.key(2), 1, 4, 16)
    step = jax.jit(lambda s, b: train.sft_step(s, b, None, cfg=cfg, optimizer=opt))

    def moved(a, b):  # share of the unembedding's entries that changed
        return float(np.mean(np.asarray(a["unembed"], np.float32) != np.asarray(b["unembed"], np.float32)))

    # The old way, the optimizer straight on the bf16 params:
    grads = jax.grad(lambda p: train.sft_loss(p, jax.tree.map(lambda x: x[0], batch), cfg)[0])(params)
    updates, _ = opt.update(grads, opt.init(params), params)
    assert moved(optax.apply_updates(params, updates), params) < 0.1

    state = step(state, batch)[0]
    assert moved(state.master, params) > 0.99
    np.testing.assert_array_equal(
        np.asarray(state.params["unembed"]), np.asarray(state.master["unembed"].astype(jnp.bfloat16))
    )
    for _ in range(199):
        state = step(state, batch)[0]
    assert state.params["unembed"].dtype == jnp.bfloat16
    # Straight on bf16 each of these steps would round away the same way: the share would stay below 0.1.
    assert moved(state.params, params) > 0.2
