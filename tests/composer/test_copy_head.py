"""The copy head against a numpy loop over its equations, and what it is for: copying a token after a
matching context, a token the vocabulary softmax has no reason to prefer."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer import copy_head, model
from composer.model_config import ModelConfig


def _reference(p, x_btd, logits_btv, tokens_bt, lengths_b):
    """log p_t(v) by loops over rows, queries and sources (copy_head module docstring), with the n-gram
    bonus when p has w_match and the recency term when it has w_recency."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x_btd, np.float64)
    logits = np.asarray(logits_btv, np.float64)
    b, t, v = logits.shape
    c = p["w_q"].shape[1]
    out = np.full((b, t, v), np.nan)
    for i in range(b):
        for q in range(lengths_b[i]):
            vocab = np.exp(logits[i, q] - logits[i, q].max())
            vocab /= vocab.sum()
            sources = list(range(q))  # s < q: its successor s + 1 <= q is a real token
            g = 1 / (1 + np.exp(-(x[i, q] @ p["w_gate"] + p["b_gate"]))) if sources else 0.0
            copy = np.zeros(v)
            if sources:
                scores = np.array([(x[i, q] @ p["w_q"]) @ (x[i, s] @ p["w_k"]) / np.sqrt(c) for s in sources])
                if "w_match" in p:
                    m = np.log1p(np.exp(x[i, q] @ p["w_match"] + p["b_match"]))
                    for n, s in enumerate(sources):
                        for j in range(len(m)):
                            # the last j + 1 tokens at s equal those at q (none before position 0)
                            same = all(tokens_bt[i, s - u] == tokens_bt[i, q - u] for u in range(j + 1))
                            if s - j < 0 or not same:
                                break
                            scores[n] += m[j]
                if "w_recency" in p:
                    r = np.log1p(np.exp(x[i, q] @ p["w_recency"] + p["b_recency"]))
                    scores -= r * np.log1p(q - np.array(sources))
                a = np.exp(scores - scores.max())
                a /= a.sum()
                for s, w in zip(sources, a):
                    copy[tokens_bt[i, s + 1]] += w
            with np.errstate(divide="ignore"):
                out[i, q] = np.log((1 - g) * vocab + g * copy)
    return out


@pytest.mark.parametrize("ngram, recency", [(0, False), (3, False), (0, True), (3, True)])
def test_mix_matches_the_equations(ngram, recency):
    b, t, d, c, v = 3, 7, 8, 4, 11
    keys = jax.random.split(jax.random.key(0), 10)
    p = {
        "w_q": jax.random.normal(keys[0], (d, c)),
        "w_k": jax.random.normal(keys[1], (d, c)),
        "w_gate": jax.random.normal(keys[2], (d,)),
        "b_gate": jnp.asarray(0.3),
    }
    if ngram:
        p["w_match"] = jax.random.normal(keys[6], (d, ngram))
        p["b_match"] = jax.random.normal(keys[7], (ngram,))
    if recency:
        p["w_recency"] = jax.random.normal(keys[8], (d,))
        p["b_recency"] = jax.random.normal(keys[9], ())
    x = jax.random.normal(keys[3], (b, t, d))
    logits = jax.random.normal(keys[4], (b, t, v))
    # Few distinct tokens, so 1-, 2- and 3-token matches all occur.
    tokens = np.asarray(jax.random.randint(keys[5], (b, t), 0, 3 if ngram else v))
    lengths = np.array([7, 4, 1])
    positions = np.where(np.arange(t)[None] < lengths[:, None], np.arange(t)[None], -1)
    got = np.asarray(copy_head.mix_uncached(p, x, logits, jnp.asarray(tokens), jnp.asarray(positions)))
    want = _reference(p, x, logits, tokens, lengths)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(got[i, :n], want[i, :n], atol=1e-5)
    assert np.isfinite(got[:, 0]).all()  # t = 0: nothing to copy, the vocabulary alone


def test_model_forward_rejects_a_cache_with_the_copy_head():
    cfg = ModelConfig(copy_head_dim=4)
    params = model.init(jax.random.key(0), cfg)
    cache = model.kv_cache.init_cache(cfg, 1, 8)
    with pytest.raises(ValueError, match="copy head"):
        model.forward(params, jnp.zeros((1, 2), jnp.int32), jnp.arange(2)[None], cfg, cache)


def test_a_pointer_at_a_matching_context_copies_the_token_after_it():
    # Keys and queries from the token embedding only (one zero-layer model): q_t . k_s is large when
    # x_s == x_t, so after [..., A, B, ..., A] the head points at the earlier A and copies B, a token the
    # vocabulary softmax (a zero unembedding: uniform) gives 1 / v.
    cfg = dataclasses.replace(ModelConfig(vocab_size=64, d_model=64, copy_head_dim=64), n_layers=0)
    params = model.init(jax.random.key(0), cfg)
    params["embed"] = jnp.eye(64) * 8.0
    params["unembed"] = jnp.zeros_like(params["unembed"])
    params["copy"] = {
        "w_q": jnp.eye(64) * 8.0,
        "w_k": jnp.eye(64) * 8.0,
        "w_gate": jnp.zeros(64),
        "b_gate": jnp.asarray(6.0),
    }
    tokens = jnp.array([[5, 17, 9, 3, 22, 5]])
    logp = model.forward(params, tokens, jnp.arange(6)[None], cfg)[0][0, -1]
    assert int(jnp.argmax(logp)) == 17
    assert float(jnp.exp(logp[17])) > 0.9


def test_the_ngram_bonus_continues_a_copy_where_one_token_is_ambiguous():
    # In [3, 1, 2, 9, 7, 3, 4, 5, 7, 3] the last token 3 came twice before, followed by 1 and by 4; only
    # the second time after a 7, as now. Keys and queries carry no information (zero projections), so
    # the pointer goes by the bonus alone: with 2-token matches it continues "7 3" with 4; with 1-token
    # matches only it cannot choose between 1 and 4.
    cfg = dataclasses.replace(
        ModelConfig(vocab_size=16, d_model=16, copy_head_dim=4, copy_head_ngram=2), n_layers=0
    )
    params = model.init(jax.random.key(0), cfg)
    params["unembed"] = jnp.zeros_like(params["unembed"])
    params["copy"]["w_q"] = jnp.zeros_like(params["copy"]["w_q"])
    params["copy"]["b_gate"] = jnp.asarray(30.0)
    tokens = jnp.array([[3, 1, 2, 9, 7, 3, 4, 5, 7, 3]])
    p = jnp.exp(model.forward(params, tokens, jnp.arange(10)[None], cfg)[0][0, -1])
    assert float(p[4]) > 0.9
    params["copy"]["b_match"] = jnp.array([3.0, -30.0])  # softplus(-30) ~ 0: 1-token matches only
    p = jnp.exp(model.forward(params, tokens, jnp.arange(10)[None], cfg)[0][0, -1])
    assert 0.4 < float(p[4]) < 0.6 and 0.4 < float(p[1]) < 0.6


def test_the_recency_term_prefers_the_latest_of_equal_sources():
    # [2, 5, 9, 2, 6, 9, 2]: after 2 the context offers 5 and 6, equal by content (zero projections; the
    # 1-token bonus finds both earlier 2s). The recency term picks the later one, 6; without it, a tie.
    cfg = dataclasses.replace(
        ModelConfig(vocab_size=16, d_model=16, copy_head_dim=4, copy_head_ngram=1, copy_head_recency=True),
        n_layers=0,
    )
    params = model.init(jax.random.key(0), cfg)
    params["unembed"] = jnp.zeros_like(params["unembed"])
    params["copy"]["w_q"] = jnp.zeros_like(params["copy"]["w_q"])
    params["copy"]["b_gate"] = jnp.asarray(30.0)
    params["copy"]["b_match"] = jnp.array([6.0])
    params["copy"]["b_recency"] = jnp.asarray(3.0)
    tokens = jnp.array([[2, 5, 9, 2, 6, 9, 2]])
    p = jnp.exp(model.forward(params, tokens, jnp.arange(7)[None], cfg)[0][0, -1])
    assert float(p[6]) > 0.7 and float(p[5]) < 0.2
    params["copy"]["b_recency"] = jnp.asarray(-30.0)  # softplus ~ 0: no recency term
    p = jnp.exp(model.forward(params, tokens, jnp.arange(7)[None], cfg)[0][0, -1])
    assert abs(float(p[6]) - float(p[5])) < 0.01
