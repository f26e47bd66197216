"""Advantage estimators against loop-by-loop numpy versions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer.rl import advantages as adv


def _rewards(seed: int, groups: int = 5, size: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(groups, size)).astype(np.float32)
    r[1] = (rng.random(size) > 0.5).astype(np.float32)  # binary outcome rewards, the common case
    r[2] = 0.7  # all equal: no signal
    return r


def _np_grpo(r: np.ndarray, eps: float) -> np.ndarray:
    out = np.zeros_like(r)
    for i in range(r.shape[0]):
        row = [float(x) for x in r[i]]
        mean = sum(row) / len(row)
        std = (sum((x - mean) ** 2 for x in row) / len(row)) ** 0.5
        for j, x in enumerate(row):
            out[i, j] = (x - mean) / (std + eps)
    return out


def _np_rloo(r: np.ndarray) -> np.ndarray:
    out = np.zeros_like(r)
    for i in range(r.shape[0]):
        for j in range(r.shape[1]):
            others = [float(r[i, k]) for k in range(r.shape[1]) if k != j]
            out[i, j] = r[i, j] - sum(others) / len(others)
    return out


def test_grpo_matches_numpy():
    r = _rewards(0)
    got = adv.compute_advantages("grpo", jnp.asarray(r), eps=1e-6)
    np.testing.assert_allclose(got.advantages, _np_grpo(r, 1e-6), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.returns, r)
    np.testing.assert_allclose(got.advantages[2], 0.0, atol=1e-5)  # an all-equal group carries no signal
    # Each group's advantages have mean 0 and (population) std ~1 where rewards differ.
    np.testing.assert_allclose(np.asarray(got.advantages).mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got.advantages)[[0, 1, 3, 4]].std(-1), 1.0, atol=1e-4)


def test_drgrpo_matches_numpy():
    r = _rewards(1)
    expected = np.array([[x - sum(row) / len(row) for x in row] for row in r.tolist()], np.float32)
    got = adv.compute_advantages("drgrpo", jnp.asarray(r))
    np.testing.assert_allclose(got.advantages, expected, rtol=1e-5, atol=1e-6)


def test_rloo_matches_numpy():
    r = _rewards(2)
    got = adv.compute_advantages("rloo", jnp.asarray(r))
    np.testing.assert_allclose(got.advantages, _np_rloo(r), rtol=1e-5, atol=1e-5)
    # A group of one has nothing to compare with.
    np.testing.assert_array_equal(adv.rloo(jnp.ones((3, 1))).advantages, np.zeros((3, 1)))


def _np_gae(r, v, m, gamma, lam):
    """GAE over the valid tokens of each row, written as an explicit backward loop."""
    b, t = r.shape
    advs, rets = np.zeros((b, t)), np.zeros((b, t))
    for i in range(b):
        steps = [j for j in range(t) if m[i, j] > 0]
        next_v, next_a = 0.0, 0.0
        for j in reversed(steps):
            delta = r[i, j] + gamma * next_v - v[i, j]
            a = delta + gamma * lam * next_a
            advs[i, j], rets[i, j] = a, a + v[i, j]
            next_v, next_a = v[i, j], a
    return advs, rets


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_numpy(gamma, lam):
    rng = np.random.default_rng(3)
    b, t = 4, 13
    m = np.zeros((b, t), np.float32)
    m[0, 3:9] = 1  # one contiguous turn
    m[1, [2, 3, 4, 7, 8, 11]] = 1  # two turns with a tool result between them
    m[2, :] = 1
    # row 3: no valid token
    r = rng.normal(size=(b, t)).astype(np.float32)
    v = rng.normal(size=(b, t)).astype(np.float32)
    got = jax.jit(adv.gae, static_argnames=("gamma", "lam"))(
        jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma=gamma, lam=lam
    )
    exp_a, exp_r = _np_gae(r * m, v, m, gamma, lam)
    np.testing.assert_allclose(got.advantages, exp_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.returns, exp_r, rtol=1e-5, atol=1e-5)
    assert not np.asarray(got.advantages)[m == 0].any()


def test_gae_with_outcome_reward_and_lambda_one_is_monte_carlo():
    rng = np.random.default_rng(4)
    m = np.zeros((3, 10), np.float32)
    m[0, 2:5], m[0, 7:9] = 1, 1
    m[1, :] = 1
    m[2, 9] = 1
    outcome = np.array([1.0, -0.5, 2.0], np.float32)
    v = rng.normal(size=m.shape).astype(np.float32)
    tok_r = adv.outcome_token_rewards(jnp.asarray(outcome), jnp.asarray(m))
    got = adv.compute_advantages("gae", tok_r, jnp.asarray(v), jnp.asarray(m), gamma=1.0, lam=1.0)
    # gamma = lambda = 1: A_t = (sum of future rewards) - V_t = outcome - V_t on every valid token.
    np.testing.assert_allclose(got.advantages, (outcome[:, None] - v) * m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.returns, outcome[:, None] * m, rtol=1e-5, atol=1e-5)


def test_outcome_token_rewards():
    m = np.array([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]], np.float32)
    rewards = np.array([3.0, -1.0, 5.0, 2.0], np.float32)
    expected = np.zeros_like(m)
    for i in range(m.shape[0]):
        valid = [j for j in range(m.shape[1]) if m[i, j]]
        if valid:
            expected[i, valid[-1]] = rewards[i]
    np.testing.assert_array_equal(adv.outcome_token_rewards(jnp.asarray(rewards), jnp.asarray(m)), expected)


def test_masked_whiten():
    rng = np.random.default_rng(5)
    x = rng.normal(3.0, 2.0, size=(4, 7)).astype(np.float32)
    m = (rng.random((4, 7)) > 0.3).astype(np.float32)
    w = np.asarray(adv.masked_whiten(jnp.asarray(x), jnp.asarray(m)))
    vals = w[m > 0]
    assert abs(vals.mean()) < 1e-5 and abs(vals.std() - 1.0) < 1e-4
    assert not w[m == 0].any()


def test_registry():
    assert set(adv.ADVANTAGES) == {"grpo", "drgrpo", "rloo", "gae"}
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*drgrpo"):
        adv.compute_advantages("ppo", jnp.zeros((2, 2)))
    # The group estimators jit and keep the [groups, group_size] layout.
    r = jnp.asarray(_rewards(6))
    for name in ("grpo", "drgrpo", "rloo"):
        out = jax.jit(adv.ADVANTAGES[name])(r)
        assert out.advantages.shape == r.shape and out.advantages.dtype == jnp.float32
