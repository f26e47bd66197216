"""The transformer: variants run, every parameter learns, counts, attention against a loop, registries."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer import attention, model, params, registry
from composer.model_config import ModelConfig, resolve_auto
from experiments import composer as experiment

FORWARD = jax.jit(model.forward, static_argnums=3)

CFG = ModelConfig()  # the defaults: a tiny model


def _batch(cfg, b=2, t=8, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)
    lengths = jnp.where(jnp.arange(b) % 2 == 0, t, t // 2)  # rows of full and half length
    i = jnp.arange(t)[None, :]
    return tokens, jnp.where(i < lengths[:, None], i, -1)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(qk_norm="none"),
        dict(qk_norm="head"),
        dict(qk_norm="proj", tie_embeddings=True),
        dict(n_dense_layers=1, shared_expert_d_ff=32, dispatch="ragged_dot"),
        dict(n_layers=1, n_dense_layers=1),  # no MoE layer at all: aux is zero
        dict(compute_dtype="bfloat16"),
        dict(param_dtype="bfloat16", compute_dtype="bfloat16", n_dense_layers=1, dispatch="ragged_dot"),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_variants_give_finite_logits(overrides):
    cfg = dataclasses.replace(CFG, **overrides)
    p = model.init(jax.random.key(0), cfg)
    assert all(leaf.dtype == cfg.param_jnp_dtype for leaf in jax.tree.leaves(p))
    tokens, positions = _batch(cfg)
    logits, cache, aux = FORWARD(p, tokens, positions, cfg)
    assert logits.shape == (*tokens.shape, cfg.vocab_size) and logits.dtype == jnp.float32
    assert cache is None
    assert np.isfinite(np.asarray(logits)).all()
    assert set(aux) == {"load_balance_loss", "router_z_loss", "dropped_fraction"}
    if cfg.n_moe_layers == 0:
        assert all(float(v) == 0.0 for v in aux.values())
    else:
        assert float(aux["load_balance_loss"]) > 0 and float(aux["router_z_loss"]) > 0


@pytest.mark.slow  # ~10 s of CPU: compiles the backward pass of a 3-layer model
@pytest.mark.parametrize("tie_embeddings,qk_norm", [(False, "head"), (True, "proj")])
def test_every_parameter_gets_a_gradient(tie_embeddings, qk_norm):
    cfg = ModelConfig(
        n_layers=3, n_dense_layers=1, shared_expert_d_ff=32, qk_norm=qk_norm, tie_embeddings=tie_embeddings
    )
    p = model.init(jax.random.key(0), cfg)
    tokens, positions = _batch(cfg, b=4, t=8)
    probe = jax.random.normal(jax.random.key(1), (cfg.vocab_size,))

    def loss(p):
        logits, _, aux = model.forward(p, tokens, positions, cfg)
        return jnp.mean(logits @ probe) + aux["load_balance_loss"] + aux["router_z_loss"]

    grads = jax.jit(jax.grad(loss))(p)
    norms = {
        jax.tree_util.keystr(path): float(jnp.linalg.norm(g)) for path, g in jax.tree.leaves_with_path(grads)
    }
    assert all(np.isfinite(n) for n in norms.values())
    assert not [k for k, n in norms.items() if n == 0.0], norms
    # Stacked weights: every layer of the stack learns, not only one.
    per_layer = jnp.linalg.norm(grads["moe_layers"]["moe"]["w_up"].reshape(cfg.n_moe_layers, -1), axis=1)
    assert (per_layer > 0).all()


def test_padding_does_not_change_real_tokens():
    """Appending padding (and changing the padding's token ids) leaves the real tokens' logits alone."""
    cfg = dataclasses.replace(CFG, dispatch="ragged_dot")
    p = model.init(jax.random.key(0), cfg)
    tokens, positions = _batch(cfg, b=2, t=8)
    logits, _, aux = FORWARD(p, tokens, positions, cfg)
    padded_tokens = jnp.concatenate([tokens, jnp.full((2, 3), -1)], axis=1)  # an out-of-range pad id
    padded_positions = jnp.concatenate([positions, jnp.full((2, 3), -1)], axis=1)
    logits_p, _, aux_p = FORWARD(p, padded_tokens, padded_positions, cfg)
    valid = np.asarray(positions) >= 0
    np.testing.assert_allclose(np.asarray(logits_p)[:, :8][valid], np.asarray(logits)[valid], atol=1e-5)
    np.testing.assert_allclose(aux_p["load_balance_loss"], aux["load_balance_loss"], rtol=1e-5)


def test_param_counts_from_shapes():
    cfg = ModelConfig(n_layers=3, n_dense_layers=1, shared_expert_d_ff=32)
    total, active = model.param_counts(cfg)
    p = model.init(jax.random.key(0), cfg)
    assert total == sum(leaf.size for leaf in jax.tree.leaves(p))
    d, f, e, k = cfg.d_model, cfg.d_ff, cfg.n_experts, cfg.top_k
    assert total - active == cfg.n_moe_layers * (e - k) * 3 * d * f


def test_model_config_from_experiment_config():
    for variant in ("tiny", None, "gpu"):
        config = experiment.get_config(variant)
        cfg = model.ModelConfig.from_config(config)
        assert cfg.d_model == config.model.d_model and cfg.n_experts == config.moe.n_experts
        # 'auto' kernels (the :gpu config) are the backend's choice (model_config.AUTO).
        kernels = resolve_auto({"dispatch": config.moe.dispatch}, jax.default_backend())
        assert cfg.d_ff == config.moe.d_ff and cfg.dispatch == kernels["dispatch"]
        hash(cfg)  # usable as a static jit argument
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3)


def _attend_loop(q, k, v, q_pos, kv_len):
    """softmax attention one query and one head at a time, in float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, n, h = q.shape
    g = k.shape[2]
    out = np.zeros_like(q)
    for bi, ti, ni in np.ndindex(b, t, n):
        keys = [j for j in range(k.shape[1]) if j <= q_pos[bi, ti] and j < kv_len[bi]]
        if not keys:
            continue
        gi = ni // (n // g)
        s = np.array([q[bi, ti, ni] @ k[bi, j, gi] / math.sqrt(h) for j in keys])
        w = np.exp(s - s.max())
        out[bi, ti, ni] = (w / w.sum()) @ v[bi, keys, gi]
    return out


def _qkv(seed: int, b: int, t: int, s: int, n: int, g: int, h: int):
    """Random queries [b, t, n, h] and keys, values [b, s, g, h]."""
    ks = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ks[0], (b, t, n, h)), jax.random.normal(ks[1], (b, s, g, h)),
            jax.random.normal(ks[2], (b, s, g, h)))  # fmt: skip


def test_reference_attention_equals_loop():
    b, t, s, n, g, h = 3, 4, 9, 6, 2, 8
    q, k, v = _qkv(0, b, t, s, n, g, h)
    q_pos = np.array([[3, 4, 5, 6], [0, 1, -1, -1], [8, -1, -1, -1]], np.int32)
    kv_len = np.array([7, 2, 9], np.int32)
    got = jax.jit(attention.attend_reference)(q, k, v, jnp.asarray(q_pos), jnp.asarray(kv_len))
    want = _attend_loop(q, k, v, q_pos, kv_len)
    visible = q_pos >= 0
    np.testing.assert_allclose(np.asarray(got)[visible], want[visible], atol=1e-5)
    assert np.isfinite(np.asarray(got)).all()


@pytest.mark.parametrize("n, g", [(4, 2), (4, 4), (6, 1), (12, 4), (16, 16)])
def test_cpu_decode_attention_equals_reference(n, g):
    # A decode step (one query per row) through 'cpu': per head up to PER_HEAD_MAX_HEADS query heads,
    # else the block-diagonal path; both over the cache's own layout. GQA and MHA, a padding query.
    assert (n <= attention.PER_HEAD_MAX_HEADS) == (n < 12)
    b, s, h = 4, 11, 8
    q, k, v = _qkv(3, b, 1, s, n, g, h)
    q_pos = np.array([[6], [0], [-1], [10]], np.int32)
    kv_len = np.array([7, 1, 0, 11], np.int32)
    args = (jnp.asarray(q_pos), jnp.asarray(kv_len))
    got = jax.jit(attention.get_attend("cpu"))(q, k, v, *args)
    want = attention.attend_reference(q, k, v, *args)
    visible = q_pos >= 0
    np.testing.assert_allclose(np.asarray(got)[visible], np.asarray(want)[visible], atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(got)[visible], _attend_loop(q, k, v, q_pos, kv_len)[visible], atol=1e-5
    )
    assert np.isfinite(np.asarray(got)).all()


def test_cpu_cached_attention_equals_reference():
    # Several queries per row over a cache longer than a key chunk (prefill / extend through 'cpu').
    b, t, s, n, g, h = 3, 5, 2 * attention.KEY_CHUNK + 7, 4, 2, 8
    q, k, v = _qkv(5, b, t, s, n, g, h)
    q_pos = np.array([[300, 301, 302, 303, 304], [0, 1, 2, -1, -1], [-1] * 5], np.int32)
    kv_len = np.array([305, 3, 0], np.int32)
    args = (jnp.asarray(q_pos), jnp.asarray(kv_len))
    got = np.asarray(jax.jit(attention.get_attend("cpu"))(q, k, v, *args))
    want = np.asarray(attention.attend_reference(q, k, v, *args))
    visible = q_pos >= 0
    np.testing.assert_allclose(got[visible], want[visible], atol=1e-5)
    assert np.isfinite(got).all()


def test_key_chunks_equal_loop_and_stop_at_the_longest_row():
    # Rows extending cached prefixes: several queries each, different lengths, a padding query, a row
    # with nothing; s = 45 is not a multiple of the chunk, so the last chunk overlaps the one before.
    b, t, s, n, g, h, chunk = 4, 3, 45, 4, 2, 8, 8
    q, k, v = _qkv(4, b, t, s, n, g, h)
    q_pos = np.array([[20, 21, 22], [3, 4, -1], [-1, -1, -1], [30, 31, 32]], np.int32)
    kv_len = np.array([23, 5, 0, 33], np.int32)
    args = (jnp.asarray(q_pos), jnp.asarray(kv_len))
    fn = jax.jit(functools.partial(attention.attend_key_chunks, chunk=chunk))
    got = np.asarray(fn(q, k, v, *args))
    want = _attend_loop(q, k, v, q_pos, kv_len)
    visible = q_pos >= 0
    np.testing.assert_allclose(got[visible], want[visible], atol=1e-5)
    assert np.isfinite(got).all()
    # The loop reads chunks up to the one holding entry max(kv_len) - 1 = 32, i.e. entries [0, 40):
    # NaN past them changes nothing, while NaN in entry 35 (masked, but read) does.
    k_nan, v_nan = k.at[:, 40:].set(jnp.nan), v.at[:, 40:].set(jnp.nan)
    np.testing.assert_array_equal(np.asarray(fn(q, k_nan, v_nan, *args)), got)
    assert np.isnan(np.asarray(fn(q, k, v.at[:, 35].set(jnp.nan), *args))).any()
    # The whole row fits in one chunk: the plain computation.
    whole = np.asarray(attention.attend_key_chunks(q, k, v, *args, chunk=s))
    np.testing.assert_allclose(whole[visible], got[visible], atol=1e-5)


@pytest.mark.parametrize("block", [8, attention.CAUSAL_BLOCK])
def test_causal_blocks_equal_full_attention_values_and_grads(block):
    # Rows of real tokens at positions = indices, then padding (-1), as the cache-free path gets them.
    # Block CAUSAL_BLOCK: 'cpu' itself with self_keys (the training path), against the plain reference.
    b, n, g, h = 3, 4, 2, 8
    t = 4 * block
    q, k, v = _qkv(1, b, t, t, n, g, h)
    lengths = np.array([t, t // 2 + 3, 5])
    q_pos = np.where(np.arange(t)[None] < lengths[:, None], np.arange(t)[None], -1).astype(np.int32)
    kv_len = jnp.asarray(lengths, jnp.int32)
    real = jnp.asarray(q_pos >= 0)[:, :, None, None]

    def loss(fn, q, k, v):
        o = fn(q, k, v, jnp.asarray(q_pos), kv_len)
        return jnp.sum(jnp.where(real, o, 0.0) * jnp.cos(jnp.arange(h)))

    def blocked(*a):
        if block == attention.CAUSAL_BLOCK:
            return attention.get_attend("cpu")(*a, self_keys=True)
        return attention.attend_causal_blocks(attention.attend_reference, *a, block=block)

    want, want_g = jax.value_and_grad(loss, (1, 2, 3))(attention.attend_reference, q, k, v)
    got, got_g = jax.value_and_grad(loss, (1, 2, 3))(blocked, q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, e in zip(got_g, want_g):
        np.testing.assert_allclose(a, e, atol=1e-5)
    if block != 8:
        return
    o = blocked(q, k, v, jnp.asarray(q_pos), kv_len)
    np.testing.assert_allclose(np.asarray(o)[q_pos >= 0], _attend_loop(q, k, v, q_pos, lengths)[q_pos >= 0],
                               atol=1e-5)  # fmt: skip


def test_registries_resolve_lazily():
    assert attention.get_attend("reference") is attention.attend_reference
    assert attention.get_attend("cpu") is attention.attend_cpu
    table = {"norm": "composer.layers:rms_norm", "missing": "composer.no_such_module:f"}
    assert registry.resolve(table, "norm", "thing").__name__ == "rms_norm"
    with pytest.raises(ImportError, match="no_such_module"):
        registry.resolve(table, "missing", "thing")
    with pytest.raises(ValueError, match="reference"):
        attention.get_attend("flash")


def test_declarations_cover_params():
    cfg = ModelConfig(n_layers=3, n_dense_layers=1, shared_expert_d_ff=32, qk_norm="proj")
    decls = params.declarations(cfg)
    p = model.init(jax.random.key(0), cfg)
    assert jax.tree.structure(decls) == jax.tree.structure(p)
    assert [d.shape for d in jax.tree.leaves(decls)] == [w.shape for w in jax.tree.leaves(p)]
    assert decls["moe_layers"]["moe"]["w_up"].axes == ("layers", "exp", "embed", "mlp")
