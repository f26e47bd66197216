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


# Line keys: token ids of a toy chat template (im_start, im_end, the assistant role, two newline tokens).
IM_START, IM_END, ASSISTANT, USER, NL, NL_INDENT = 0, 1, 2, 3, 4, 5
LINES = copy_head.LineTokens(IM_START, IM_END, ASSISTANT, (NL, NL_INDENT))


def _line_ends_reference(tokens, n):
    """(end, use) per position of one row's first n tokens, by the words of copy_head.line_ends."""
    end, use = list(range(len(tokens))), [False] * len(tokens)
    for s in range(n):
        starts = [p for p in range(s + 1) if tokens[p] == IM_START]
        ends = [p for p in range(s + 1) if tokens[p] == IM_END]
        if not starts or starts[-1] == s or (ends and ends[-1] > starts[-1]) or tokens[s] == IM_END:
            continue
        if tokens[starts[-1] + 1] == ASSISTANT:
            continue
        # The line that holds x_{s+1} ends before the first newline, message mark or the row's end.
        for p in range(s + 1, n + 1):
            if p == n or tokens[p] in (NL, NL_INDENT, IM_START, IM_END):
                if p - 1 >= s:
                    end[s], use[s] = p - 1, True
                break
    return end, use


def _chat_row(rng, n_messages):
    row = []
    for i in range(n_messages):
        row += [IM_START, ASSISTANT if i % 2 else USER]
        row += rng.choice([NL, NL_INDENT, 6, 7, 8, 9, 10], size=rng.integers(0, 9)).tolist()
        row += [IM_END, NL]
    return row


def test_line_ends_match_their_definition():
    rng = np.random.default_rng(0)
    rows = [_chat_row(rng, 5) for _ in range(6)]
    rows.append([7, 8, NL, 9, IM_END, NL, IM_START, USER, 6, NL, 7, IM_END])  # starts mid-message
    t = max(len(r) for r in rows) + 3
    tokens = np.full((len(rows), t), 11)
    lengths = np.array([len(r) - (i % 3) for i, r in enumerate(rows)])  # some rows cut, then padding
    for i, r in enumerate(rows):
        tokens[i, : lengths[i]] = r[: lengths[i]]
    valid = np.arange(t)[None] < lengths[:, None]
    end, use = copy_head.line_ends(jnp.asarray(tokens), jnp.asarray(valid), LINES)
    for i, n in enumerate(lengths):
        want_end, want_use = _line_ends_reference(tokens[i].tolist(), n)
        np.testing.assert_array_equal(np.asarray(use[i, :n]), want_use[:n])
        np.testing.assert_array_equal(
            np.asarray(end[i, :n])[want_use[:n]], np.asarray(want_end[:n])[want_use[:n]]
        )
    assert np.asarray(use).sum() > 20  # not vacuous: many context positions have a line end


def test_a_line_key_points_at_the_line_whose_end_matches():
    # Two context lines with the same start (tokens 6 7) and different ends (8 vs 9). Plain keys see only
    # the start, so a query wanting "the line that ends in 9" cannot choose between them; line keys add
    # the end's embedding and the pointer prefers the position before the second line's first 6. A
    # zero-layer model: h = embedding.
    cfg = dataclasses.replace(
        ModelConfig(vocab_size=16, d_model=16, copy_head_dim=16, copy_head_lines=True), n_layers=0
    )
    params = model.init(jax.random.key(0), cfg)
    params["embed"] = jnp.eye(16) * 4.0
    params["unembed"] = jnp.zeros_like(params["unembed"])
    w_q = jnp.zeros((16, 16)).at[12, 9].set(4.0)  # the query token 12 asks for lines ending in 9
    params["copy"].update(w_q=w_q, w_k=jnp.zeros((16, 16)), b_gate=jnp.asarray(30.0))
    tokens = jnp.array([[IM_START, USER, NL, 6, 7, 8, NL, 6, 7, 9, NL, IM_END, IM_START, ASSISTANT, 12]])
    positions = jnp.arange(tokens.shape[1])[None]

    def pointer(w_k_line):
        params["copy"]["w_k_line"] = w_k_line
        proj = copy_head.project(params["copy"], params["embed"][tokens], tokens, positions >= 0, LINES)
        scores = np.asarray(jnp.einsum("c,sc->s", proj.q[0, -1], proj.k[0]))
        return scores

    flat = pointer(jnp.zeros((16, 16)))
    assert flat[2] == flat[6]  # the positions before each line's first 6: equal without line keys
    sharp = pointer(jnp.eye(16))
    assert sharp[6] > sharp[2] + 10
    # Every source in the second line (6, 7, 8) carries its end; none outside the context message does.
    assert (sharp[[6, 7, 8]] > 10).all() and (sharp[11:] == 0).all()


def test_pointer_logprob_matches_a_loop():
    b, t = 2, 6
    rng = np.random.default_rng(0)
    a = rng.random((b, t, t))
    ok = np.tril(np.ones((t, t), bool), -1)[None] & (rng.random((b, t, t)) > 0.2)
    a = np.where(ok, a, 0.0)
    a = a / np.maximum(a.sum(-1, keepdims=True), 1e-9)
    tokens = rng.integers(0, 3, (b, t))
    nxt = np.concatenate([tokens[:, 1:], tokens[:, -1:]], 1)
    got, got_ok = map(
        np.asarray, copy_head.pointer_logprob(jnp.asarray(a), jnp.asarray(nxt), jnp.asarray(nxt))
    )
    for i in range(b):
        for q in range(t):
            mass = sum(a[i, q, s] for s in range(t) if nxt[i, s] == nxt[i, q])
            assert got_ok[i, q] == (mass > 0)
            np.testing.assert_allclose(got[i, q], np.log(mass) if mass > 0 else 0.0, rtol=1e-5, atol=1e-6)


def test_the_pointer_loss_trains_the_pointer_where_the_gate_is_closed():
    """With the gate shut, the mixture's loss leaves the pointer's weights (almost) untouched; the pointer
    loss still moves them, towards the sources that would copy the target. Logits are the same either way."""
    from composer import train

    base = ModelConfig(vocab_size=32, d_model=16, copy_head_dim=8, n_layers=1)
    params = model.init(jax.random.key(1), base)
    params["copy"]["b_gate"] = jnp.asarray(-12.0)
    tokens = jnp.array([[3, 7, 9, 4, 3, 7, 9, 4, 3, 7, 9, 4]])
    batch = {
        "tokens": tokens,
        "positions": jnp.arange(12)[None],
        "loss_mask": jnp.ones((1, 12), jnp.int32).at[:, 0].set(0),
    }

    def grad_w_q(coef):
        cfg = dataclasses.replace(base, copy_loss_coef=coef)
        grads, sums = jax.grad(lambda p: train.sft_loss(p, batch, cfg), has_aux=True)(params)
        return float(jnp.abs(grads["copy"]["w_q"]).sum()), sums

    off, sums_off = grad_w_q(0.0)
    on, sums_on = grad_w_q(0.5)
    assert on > 100 * off, (on, off)
    np.testing.assert_allclose(sums_off["loss"].total, sums_on["loss"].total, rtol=1e-6)
    # A model without a copy head ignores the weight.
    plain = dataclasses.replace(base, copy_head_dim=0, copy_loss_coef=0.5)
    _, sums_plain = train.sft_loss(model.init(jax.random.key(1), plain), batch, plain)
    assert "pointer_loss" not in sums_plain
    # From the second repeat on every target follows an earlier copy of the same token.
    assert float(sums_on["pointer_loss"].count) >= 7 and float(sums_on["pointer_loss"].total) > 0


@pytest.mark.parametrize("copy_head_dim", [0, 8])
def test_next_token_logprobs_equal_the_full_distribution_at_the_next_tokens(copy_head_dim):
    """model.next_token_logprobs (SFT's loss, no [b, t, v] copy distribution) against gathering forward's
    log-softmax at each next token: values, the pointer's own log-probs, and gradients, on rows of chat
    tokens with every copy-head term on, padding, and a row of padding only."""
    from composer import train

    cfg = ModelConfig(
        vocab_size=16,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        head_dim=8,
        copy_head_dim=copy_head_dim,
        copy_head_ngram=2,
        copy_head_recency=True,
        copy_head_lines=True,
        copy_loss_coef=0.5,
    )
    params = model.init(jax.random.key(3), cfg)
    rng = np.random.default_rng(1)
    rows = [_chat_row(rng, 4) for _ in range(3)]
    t = max(len(r) for r in rows) + 2
    tokens = np.zeros((4, t), np.int32)
    positions = np.full((4, t), -1, np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
        positions[i, : len(r)] = np.arange(len(r))
    tokens, positions = jnp.asarray(tokens), jnp.asarray(positions)
    weights = jnp.asarray(rng.random((4, t)) * (np.asarray(positions) > 0), jnp.float32)

    def full(p):
        logp, _, aux = train.token_logprobs(p, tokens, positions, cfg, line_tokens=LINES)
        return (logp * weights).sum(), (logp, aux)

    def targets(p):
        logp, aux = model.next_token_logprobs(p, tokens, positions, cfg, line_tokens=LINES)
        return (logp * weights).sum(), (logp, aux)

    (_, (want, want_aux)), want_grads = jax.value_and_grad(full, has_aux=True)(params)
    (_, (got, got_aux)), got_grads = jax.value_and_grad(targets, has_aux=True)(params)
    real = np.asarray(positions) > 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[:, 0] == 0)
    if copy_head_dim:
        ok = np.asarray(want_aux["pointer_ok"])
        np.testing.assert_array_equal(np.asarray(got_aux["pointer_ok"]), ok)
        np.testing.assert_allclose(
            np.asarray(got_aux["pointer_logp"])[ok],
            np.asarray(want_aux["pointer_logp"])[ok],
            rtol=1e-5,
            atol=1e-5,
        )
        assert ok.sum() > 10  # the rows repeat tokens, so many targets are copyable
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5, err_msg=str(path))


def test_line_keys_take_their_tokens_as_an_argument_and_fail_without_them():
    """ModelConfig says whether there are line keys; the tokens come beside it, and a model with line keys
    run without them is an error, not plain keys. A model without line keys (or copy head) needs none."""
    cfg = ModelConfig(vocab_size=16, d_model=16, n_layers=1, copy_head_dim=8, copy_head_lines=True)
    params = model.init(jax.random.key(0), cfg)
    tokens = jnp.asarray([_chat_row(np.random.default_rng(2), 3)])
    positions = jnp.arange(tokens.shape[1])[None]
    with pytest.raises(ValueError, match="line_tokens"):
        model.forward(params, tokens, positions, cfg)
    with pytest.raises(ValueError, match="line_tokens"):
        model.next_token_logprobs(params, tokens, positions, cfg)
    assert np.isfinite(np.asarray(model.forward(params, tokens, positions, cfg, line_tokens=LINES)[0])).all()
    # Without line keys the tokens change nothing, and none are needed.
    plain = dataclasses.replace(cfg, copy_head_lines=False)
    plain_params = {**params, "copy": {k: v for k, v in params["copy"].items() if k != "w_k_line"}}
    want = model.forward(plain_params, tokens, positions, plain)[0]
    got = model.forward(plain_params, tokens, positions, plain, line_tokens=LINES)[0]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    no_head = dataclasses.replace(cfg, copy_head_dim=0)
    model.forward(model.init(jax.random.key(0), no_head), tokens, positions, no_head)
    # Hashable and equal by value: a static jit argument that does not recompile for equal ids.
    same = copy_head.LineTokens(np.int32(IM_START), IM_END, ASSISTANT, [NL, NL_INDENT])
    assert same == LINES and hash(same) == hash(LINES)


def test_the_pipeline_takes_line_tokens_from_the_tokenizer():
    from composer.pipeline import learner
    from env import chat
    from env.tokenizer import train_tokenizer

    tok = train_tokenizer(["def f(x):\n    return x\n\nprint(f(1))\n", "assistant user tool"], 300)
    cfg = ModelConfig(copy_head_dim=8, copy_head_lines=True)
    lines = learner.line_tokens(cfg, tok)
    assert (lines.im_start, lines.im_end) == (tok.token_id(chat.IM_START), tok.token_id(chat.IM_END))
    assert [lines.assistant] == tok.encode("assistant")
    assert set(tok.encode("\n")) <= set(lines.newlines)
    assert all("\n" in tok.decode([i]) for i in lines.newlines)
    assert learner.line_tokens(dataclasses.replace(cfg, copy_head_lines=False), tok) is None
    assert learner.line_tokens(dataclasses.replace(cfg, copy_head_dim=0), tok) is None
