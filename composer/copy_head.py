"""The copy head: a pointer over the context, mixed into the next-token distribution.

With h_t the final (normed) hidden state at position t and x the tokens,

    a_ts      = softmax_s(q_t . k_s / sqrt(c)),   q = h W_q, k = h W_k, over earlier positions s < t
    copy_t(v) = sum_s a_ts [x_{s+1} = v]          (point at s, copy the token that followed it)
    g_t       = sigmoid(h_t . w_g + b_g)
    p_t(v)    = (1 - g_t) softmax(logits_t)(v) + g_t copy_t(v)

With `copy_head_ngram` = n > 0 the pointer also gets an exact-match bonus: m_t = softplus(h_t W_m + b_m)
(n weights per query) and

    scores_ts += sum_{j=1..n} m_tj [x_{s-i} = x_{t-i} for i = 0..j-1]

so a source whose last j tokens equal the query's last j tokens gains m_t1 + ... + m_tj. That is the
matching half of an induction head, built in: once a copy has started, the longest match continues it
(the learned q . k alone, matching on one token's hidden state, loops back to another occurrence of the
token just copied, e.g. "0.621, 0.621, 0.621"), and W_m lets the query turn the bonus down where a copy
starts and the last tokens say nothing about where to point.

With `copy_head_recency` the pointer also prefers recent sources, by a slope each query sets:
r_t = softplus(h_t . w_r + b_r) and

    scores_ts -= r_t log(1 + t - s)

q . k carries no position, so without it the pointer cannot tell the start of the latest tool result
(whose path a call copies) from the start of an earlier one.

With line keys (cfg.copy_head_lines) a source also sees the line it would start copying:

    k_s += [s is in a context line] h_{e(s)} W_kl

where e(s) is the last token of the line that holds x_{s+1} (the token before the next newline or
message mark). Without it the key at s has seen only tokens up to s, so the pointer picks the start of
a line of code (the old_string of an edit) blind to that line's content: the buggy line and its
neighbours look the same until their ends. Only lines inside a finished non-assistant message (system,
user, tool) get the term: they are prefilled whole, so the sampler computes exactly the keys the learner
does, while the assistant's own tokens are decoded one at a time with no line end yet in sight.
Which tokens mark lines is the tokenizer's business, not the model's, so their ids are no part of
ModelConfig: they travel as a `LineTokens` value (hashable, a static argument under jit) that whoever
runs the model passes beside cfg (composer/pipeline/learner.line_tokens builds it from a tokenizer).

The model's "logits" become log p_t (their softmax is p_t, so every consumer of logits, the losses,
the learner's log-probs and the sampler, works unchanged). Pointing at s and copying x_{s+1} is an
induction head whose copy step is built in: the head only learns where to point (q_t matches k_s when
the context at s is like the context at t), and the copied token is exact however rare it is. Small
models trained briefly from scratch learn to copy names, paths and lines of code out of tool results
this way far sooner than through attention layers alone.

At t = 0 (no earlier position) the gate is closed and p_t is the vocabulary softmax.

The model reaches the head through `declarations` (its weights, params['copy']), `logits` (the mixture's
log-probs, without or with a cache: `init_cache` is the head's part of the sampler's cache),
`next_token_logprob` (a loss on the data's own tokens), `pointer_loss` (the pointer's own loss) and
`active_line_tokens` (the line tokens a call runs with).
"""

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from composer import kv_cache
from composer.model_config import ModelConfig
from composer.params import ParamDecl, constant, normal, zeros

# Gate pre-activation where the pointer has nowhere to point: sigmoid(-30) ~ 1e-13.
_CLOSED = -30.0


@dataclasses.dataclass(frozen=True)
class LineTokens:
    """The chat-template tokens that mark where a line of context ends (module docstring). Frozen and
    hashable: a static argument of jax.jit, like the ModelConfig it goes with."""

    im_start: int
    im_end: int
    assistant: int  # the assistant role's token, right after im_start
    newlines: tuple[int, ...]  # every token whose text holds a newline

    def __post_init__(self) -> None:
        # A list would leave the value unhashable (no static argument), numpy ints its hash unstable.
        for name in ("im_start", "im_end", "assistant"):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "newlines", tuple(int(i) for i in self.newlines))


def uses_line_keys(cfg: ModelConfig) -> bool:
    """Whether a model of `cfg` needs `LineTokens` to run: it has a copy head, with line keys."""
    return cfg.copy_head_dim > 0 and cfg.copy_head_lines


def active_line_tokens(cfg: ModelConfig, line_tokens: LineTokens | None) -> LineTokens | None:
    """The line tokens a call of the model runs with: `line_tokens` where cfg has line keys, None where it
    has none (its params hold no w_k_line). Line keys without ids are an error, never plain keys."""
    if not uses_line_keys(cfg):
        return None
    if line_tokens is None:
        raise ValueError(
            "the copy head's line keys (copy_head_lines) need the chat template's token ids: pass "
            "line_tokens (composer/pipeline/learner.line_tokens builds them from the tokenizer)"
        )
    return line_tokens


def declarations(cfg: ModelConfig) -> dict:
    """The head's weights (params['copy']); c = cfg.copy_head_dim."""
    d, c = cfg.d_model, cfg.copy_head_dim
    decls = {
        "w_q": ParamDecl((d, c), ("embed", None), normal(d**-0.5)),
        "w_k": ParamDecl((d, c), ("embed", None), normal(d**-0.5)),
        "w_gate": ParamDecl((d,), ("embed",), zeros),
        "b_gate": ParamDecl((), (), zeros),
    }
    if cfg.copy_head_ngram > 0:
        # softplus(3) = 3.05 a matched token: from the start a source whose last 3 tokens match the
        # query's outscores ~2000 unmatched ones (scores ~N(0, 1)) by e^9; W_m learns where not to.
        n = cfg.copy_head_ngram
        decls["w_match"] = ParamDecl((d, n), ("embed", None), zeros)
        decls["b_match"] = ParamDecl((n,), (None,), constant(3.0))
    if cfg.copy_head_recency:
        # softplus(-1) = 0.31: a source 1000 tokens back starts 2.2 below the one just before.
        decls["w_recency"] = ParamDecl((d,), ("embed",), zeros)
        decls["b_recency"] = ParamDecl((), (), constant(-1.0))
    if cfg.copy_head_lines:
        # Zero init: keys start as the plain ones; SFT learns what of a line's end to add.
        decls["w_k_line"] = ParamDecl((d, c), ("embed", None), zeros)
    return decls


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> tuple[jax.Array, ...]:
    """The head's part of a per-layer cache (kv_cache.LayerCaches.extra): its keys [1, b, s, 1, c]
    float32 and the token at each position [1, b, s, 1, 1] int32; () without a head."""
    if cfg.copy_head_dim == 0:
        return ()
    return (
        jnp.zeros((1, batch, max_len, 1, cfg.copy_head_dim), jnp.float32),
        jnp.zeros((1, batch, max_len, 1, 1), jnp.int32),
    )


class Projection(NamedTuple):
    """What the head reads off the final hidden states, float32: queries q [b, t, c], keys k [b, t, c],
    gate pre-activations z [b, t]; the n-gram weights match [b, t, n] and the recency slopes recency
    [b, t], each None when the model has no such term."""

    q: jax.Array
    k: jax.Array
    z: jax.Array
    match: jax.Array | None
    recency: jax.Array | None

    def at(self, idx_b: jax.Array) -> "Projection":
        """The queries' fields at index idx_b[i] of row i (t becomes 1); keys are kept whole."""

        def pick(x):
            if x is None:
                return None
            idx = idx_b.reshape((-1,) + (1,) * (x.ndim - 1))
            return jnp.take_along_axis(x, idx, axis=1)

        return Projection(pick(self.q), self.k, pick(self.z), pick(self.match), pick(self.recency))


def line_ends(
    tokens_bt: jax.Array, valid_bt: jax.Array, line_tokens: LineTokens
) -> tuple[jax.Array, jax.Array]:
    """For each position s of each row: (index of e(s), whether s gets the line term) [b, t] each.

    Everything is found inside the row (a call's own tokens): a message whose start is not in the row
    counts as the assistant's, which it always is where the sampler extends a cached prefix (the row then
    starts with the assistant's last token).
    """
    t = tokens_bt.shape[1]
    idx = jnp.arange(t, dtype=jnp.int32)[None, :]
    is_start = (tokens_bt == line_tokens.im_start) & valid_bt
    is_end = (tokens_bt == line_tokens.im_end) & valid_bt
    bound = is_start | is_end
    stop = jnp.isin(tokens_bt, jnp.asarray(line_tokens.newlines, jnp.int32)) | bound | ~valid_bt
    # next_stop[p] = the first stopping position >= p (t: none in the row).
    next_stop = jax.lax.cummin(jnp.where(stop, idx, t), axis=1, reverse=True)
    # The line that holds x_{s+1} ends just before the first stop after s.
    end = jnp.concatenate([next_stop[:, 1:], jnp.full_like(next_stop[:, :1], t)], axis=1) - 1
    last_start = jax.lax.cummax(jnp.where(is_start, idx, -1), axis=1)
    last_end = jax.lax.cummax(jnp.where(is_end, idx, -1), axis=1)
    role = jnp.take_along_axis(tokens_bt, jnp.clip(last_start + 1, 0, t - 1), axis=1)
    inside = (
        (last_start >= 0) & (last_start < idx) & (last_end < last_start) & (role != line_tokens.assistant)
    )
    use = inside & valid_bt & ~bound & (end >= idx)
    return jnp.where(use, end, idx), use


def project(
    p: dict,
    x_btd: jax.Array,
    tokens_bt: jax.Array | None = None,
    valid_bt: jax.Array | None = None,
    line_tokens: LineTokens | None = None,
) -> Projection:
    """The head's projections of final hidden states x_btd; with `line_tokens` (and the call's tokens
    and their validity) the keys get the line term (module docstring)."""
    x = x_btd.astype(jnp.float32)

    def f(name):
        return x @ p[name].astype(jnp.float32)

    z = f("w_gate") + p["b_gate"].astype(jnp.float32)
    match = recency = None
    if "w_match" in p:
        match = jax.nn.softplus(f("w_match") + p["b_match"].astype(jnp.float32))
    if "w_recency" in p:
        recency = jax.nn.softplus(f("w_recency") + p["b_recency"].astype(jnp.float32))
    k = f("w_k")
    # A one-token call (a decode step) holds no message start, so none of its positions gets the term.
    if line_tokens is not None and x.shape[1] > 1:
        end_bt, use_bt = line_ends(tokens_bt, valid_bt, line_tokens)
        x_end = jnp.take_along_axis(x, end_bt[..., None], axis=1)
        k = k + jnp.where(use_bt[..., None], x_end @ p["w_k_line"].astype(jnp.float32), 0.0)
    return Projection(f("w_q"), k, z, match, recency)


def bias(proj: Projection, toks_bs: jax.Array, query_pos_bt: jax.Array) -> jax.Array | None:
    """The n-gram bonus plus the recency term [b, t, s] (module docstring), None with neither. toks_bs: the
    token at each position s (the query's own and earlier ones included); query_pos_bt: each query's
    position in it (< 0: padding, no match)."""
    out = None
    if proj.match is not None:
        out = match_bonus(proj.match, toks_bs, query_pos_bt)
    if proj.recency is not None:
        s = jnp.arange(toks_bs.shape[1])
        dist = jnp.maximum(query_pos_bt[:, :, None] - s[None, None, :], 0).astype(jnp.float32)
        term = -proj.recency[:, :, None] * jnp.log1p(dist)
        out = term if out is None else out + term
    return out


def match_bonus(m_btn: jax.Array, toks_bs: jax.Array, query_pos_bt: jax.Array) -> jax.Array:
    """The n-gram bonus [b, t, s] (module docstring). toks_bs: the token at each position s (the query's
    own and earlier ones included); query_pos_bt: each query's position in it (< 0: padding, no match)."""
    s = toks_bs.shape[1]
    run = jnp.ones((), bool)
    bonus = jnp.zeros((), jnp.float32)
    for j in range(m_btn.shape[-1]):
        # x_{s-j} for every source s, and x_{t-j} for every query t; positions before 0 hold distinct
        # fillers, so they match nothing.
        key_tok = jnp.pad(toks_bs, ((0, 0), (j, 0)), constant_values=-2)[:, :s]
        qp = query_pos_bt - j
        q_tok = jnp.take_along_axis(toks_bs, jnp.clip(qp, 0, s - 1), axis=1)
        q_tok = jnp.where(qp >= 0, q_tok, -1)
        run = run & (q_tok[:, :, None] == key_tok[:, None, :])
        bonus = bonus + jnp.where(run, m_btn[:, :, j, None], 0.0)
    return bonus


def pointer(
    q_btc: jax.Array,
    z_bt: jax.Array,
    k_bsc: jax.Array,
    ok_bts: jax.Array,
    bias_bts: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The pointer weights a [b, t, s] (0 where not ok) and the gate pre-activations, closed for a query
    with no allowed position. Arguments as in `mix`."""
    c = q_btc.shape[-1]
    scores = jnp.einsum("btc,bsc->bts", q_btc, k_bsc) / jnp.sqrt(jnp.float32(c))
    if bias_bts is not None:
        scores = scores + bias_bts
    any_ok = jnp.any(ok_bts, axis=-1)
    # Rows with no allowed position get a uniform softmax (then zeroed) instead of NaN from all -inf.
    a = jax.nn.softmax(jnp.where(ok_bts, scores, jnp.where(any_ok[..., None], -jnp.inf, 0.0)), axis=-1)
    return jnp.where(ok_bts, a, 0.0), jnp.where(any_ok, z_bt, _CLOSED)


def _mixture(logp_vocab: jax.Array, z_bt: jax.Array, logp_copy: jax.Array) -> jax.Array:
    """log((1 - g) p_vocab + g copy), g = sigmoid(z), from the two log-probs (over v, or of one token)."""
    if logp_vocab.ndim > z_bt.ndim:
        z_bt = z_bt[..., None]
    return jnp.logaddexp(jax.nn.log_sigmoid(-z_bt) + logp_vocab, jax.nn.log_sigmoid(z_bt) + logp_copy)


def _log_or_neg_inf(x: jax.Array) -> jax.Array:
    """log x where x > 0, -inf where x == 0, with a finite gradient at 0."""
    has = x > 0
    return jnp.where(has, jnp.log(jnp.where(has, x, 1.0)), -jnp.inf)


def mix(
    logits_btv: jax.Array,
    q_btc: jax.Array,
    z_bt: jax.Array,
    k_bsc: jax.Array,
    next_bs: jax.Array,
    ok_bts: jax.Array,
    bias_bts: jax.Array | None = None,
    with_pointer: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log p [b, t, v] float32 (module docstring); with `with_pointer`, also the pointer weights a [b, t, s].

    k_bsc: keys of the positions the pointer may choose from; next_bs: the token that followed each of
    them; ok_bts: whether query t may point at s (s earlier than t, both real tokens); bias_bts: the
    n-gram bonus and recency term (`bias`), added to the scores.
    """
    b, t, v = logits_btv.shape
    a, z_bt = pointer(q_btc, z_bt, k_bsc, ok_bts, bias_bts)
    next_bs = jnp.clip(next_bs, 0, v - 1)
    b_idx = jnp.arange(b)[:, None, None]
    t_idx = jnp.arange(t)[None, :, None]
    copy = jnp.zeros((b, t, v), jnp.float32).at[b_idx, t_idx, next_bs[:, None, :]].add(a)
    logp_vocab = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    logp = _mixture(logp_vocab, z_bt, _log_or_neg_inf(copy))
    return (logp, a) if with_pointer else logp


def pointer_logprob(
    a_bts: jax.Array, next_bs: jax.Array, target_bt: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The pointer's own log-probability of each query's target, log sum_s a_ts [x_{s+1} = target_t], and
    whether any allowed source could copy it (where not, the log-prob is 0 and carries no gradient)."""
    return _log_mass(_mass(a_bts, next_bs, target_bt))


def _mass(a_bts: jax.Array, next_bs: jax.Array, target_bt: jax.Array) -> jax.Array:
    """sum_s a_ts [next_s = target_t], [b, t]."""
    return jnp.sum(jnp.where(next_bs[:, None, :] == target_bt[:, :, None], a_bts, 0.0), axis=-1)


def _log_mass(mass_bt: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log mass where it is > 0, else 0 with no gradient; whether it is > 0)."""
    copyable = mass_bt > 0
    return jnp.where(copyable, jnp.log(jnp.where(copyable, mass_bt, 1.0)), 0.0), copyable


def _uncached_inputs(p, x_btd, tokens_bt, positions_bt, line_tokens):
    """The pointer's inputs over a call's own tokens (see `mix_uncached`): (projection, next_bs, ok, bias)."""
    t = tokens_bt.shape[1]
    valid_bt = positions_bt >= 0
    proj = project(p, x_btd, tokens_bt, valid_bt, line_tokens)
    # Source s needs a known successor: s + 1 is a real token of the row, and s + 1 <= the query's index.
    succ_bs = jnp.concatenate([valid_bt[:, 1:], jnp.zeros_like(valid_bt[:, :1])], axis=1)
    idx = jnp.arange(t)
    ok = (idx[None, :] < idx[:, None])[None] & succ_bs[:, None, :] & valid_bt[:, :, None]
    next_bs = jnp.concatenate([tokens_bt[:, 1:], tokens_bt[:, -1:]], axis=1)
    # Row index = position here, so the tokens by index are the tokens by position.
    extra = bias(proj, tokens_bt, jnp.where(valid_bt, idx[None, :], -1))
    return proj, next_bs, ok, extra


def mix_uncached(
    p: dict,
    x_btd: jax.Array,
    logits_btv: jax.Array,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    line_tokens: LineTokens | None = None,
    with_pointer: bool = False,
) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The copy head over this call's own tokens (no cache: each row's real tokens at positions 0, 1, ...).
    With `with_pointer`, also `pointer_logprob` of each next token of the row ([b, t], the last position's
    meaningless): what a loss on the pointer alone trains."""
    proj, next_bs, ok, extra = _uncached_inputs(p, x_btd, tokens_bt, positions_bt, line_tokens)
    if not with_pointer:
        return mix(logits_btv, proj.q, proj.z, proj.k, next_bs, ok, extra)
    logp, a = mix(logits_btv, proj.q, proj.z, proj.k, next_bs, ok, extra, with_pointer=True)
    return logp, pointer_logprob(a, next_bs, next_bs)


def next_token_logprob_uncached(
    p: dict,
    x_btd: jax.Array,
    logits_btv: jax.Array,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    line_tokens: LineTokens | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """log p_t(x_{t+1}) [b, t] of the mixture, i.e. `mix_uncached`'s log-probs at each next token of the row
    (the last position's meaningless), and `pointer_logprob` of the same tokens.

    The copy distribution is needed at one token a query, and there it is the pointer's mass on that
    token: copy_t(x_{t+1}) = sum_s a_ts [x_{s+1} = x_{t+1}]. So this skips the scatter of a [b, t, s] into
    [b, t, v] (and its gather in the backward pass): the default model's SFT step (2 x 1792 tokens, 2-core
    CPU) took 1714 ms through `mix_uncached` and 1448-1556 through this, 1513 with no copy head at all.
    """
    v = logits_btv.shape[-1]
    proj, next_bs, ok, extra = _uncached_inputs(p, x_btd, tokens_bt, positions_bt, line_tokens)
    a, z_bt = pointer(proj.q, proj.z, proj.k, ok, extra)
    # As in `mix`, a source copies its clipped successor, and the target is that of the query's position.
    next_bs = jnp.clip(next_bs, 0, v - 1)
    mass = _mass(a, next_bs, next_bs)
    logp_vocab = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    target_vocab = jnp.take_along_axis(logp_vocab, next_bs[..., None], axis=-1)[..., 0]
    return _mixture(target_vocab, z_bt, _log_or_neg_inf(mass)), _log_mass(mass)


def cached_ok(positions_bt: jax.Array, n_cache: int) -> jax.Array:
    """ok [b, t, s] for queries at positions_bt over a cache indexed by position: s < the query's position
    (the successor s + 1 <= that position is then in the cache). Padding queries (position < 0) get none."""
    s = jnp.arange(n_cache)
    return s[None, None, :] < positions_bt[:, :, None]


def logits(
    p: dict,
    x_btd: jax.Array,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    line_tokens: LineTokens | None,
    unembed: Callable[[jax.Array], jax.Array],
    *,
    extra: tuple[jax.Array, ...] | None = None,
    plan: kv_cache.WritePlan | None = None,
    logits_at_b: jax.Array | None = None,
    with_pointer: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None, tuple[jax.Array, jax.Array] | None]:
    """The model's head with the copy head: log p [b, t, v] float32 (module docstring) of the final
    hidden states x_btd, where unembed maps hidden states to vocabulary logits; line_tokens: None without
    line keys (`active_line_tokens`).

    Without `extra`: over the call's own tokens (`mix_uncached`; with_pointer also gives its pointer
    log-probs). With `extra` (`init_cache`'s buffers) and the call's write `plan`: every new position's key
    and token are written there first, then the queries point over the whole cache; logits_at_b ([b]
    int32) keeps only query logits_at_b[i] of each row (t becomes 1). Returns (log p, extra or None,
    (pointer_logp, pointer_ok) [b, t] or None).
    """
    if extra is None:
        if logits_at_b is not None:
            raise ValueError("logits_at_b needs a cache")
        out = mix_uncached(p, x_btd, unembed(x_btd), tokens_bt, positions_bt, line_tokens, with_pointer)
        return (out[0], None, out[1]) if with_pointer else (out, None, None)
    proj = project(p, x_btd, tokens_bt, positions_bt >= 0, line_tokens)
    # The cache takes every new position's key and token, not only those of the kept queries.
    k_buf, keys_bsgc = kv_cache.write_layer(extra[0], jnp.int32(0), proj.k[:, :, None, :], plan)
    t_buf, toks_bsgc = kv_cache.write_layer(extra[1], jnp.int32(0), tokens_bt[:, :, None, None], plan)
    if logits_at_b is not None:
        x_btd = jnp.take_along_axis(x_btd, logits_at_b[:, None, None], axis=1)
        positions_bt = jnp.take_along_axis(positions_bt, logits_at_b[:, None], axis=1)
        proj = proj.at(logits_at_b)
    toks_bs = toks_bsgc[:, :, 0, 0]
    next_bs = jnp.concatenate([toks_bs[:, 1:], toks_bs[:, -1:]], axis=1)
    ok_bts = cached_ok(positions_bt, toks_bs.shape[1])
    bias_bts = bias(proj, toks_bs, positions_bt)
    logp_btv = mix(unembed(x_btd), proj.q, proj.z, keys_bsgc[:, :, 0, :], next_bs, ok_bts, bias_bts)
    return logp_btv, (k_buf, t_buf), None


def pointer_loss(
    pointer_logp_bt: jax.Array, pointer_ok_bt: jax.Array, mask_bt: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The pointer's own loss (SFT): (-sum of its log-prob of each trained token that some source could
    copy, how many such tokens). pointer_*: query-aligned, as `logits` gives them (index i scores token
    i + 1); mask_bt: target-aligned (index i weighs token i)."""
    pad = jnp.zeros_like(mask_bt[:, :1])
    logp_bt = jnp.concatenate([pad, pointer_logp_bt[:, :-1]], 1)
    mask_bt = mask_bt * jnp.concatenate([pad, pointer_ok_bt[:, :-1].astype(mask_bt.dtype)], 1)
    return -(logp_bt * mask_bt).sum(), mask_bt.sum()
