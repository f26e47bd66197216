"""The learner's memory savers change memory, not results: log-probs over the vocabulary in chunks, and
the scanned layers rematerialised in the backward pass (cfg.remat). Peaks from XLA's compiled memory
analysis on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from step_batches import random_batch

from composer import chunked_logprobs, model, train

CFG = model.ModelConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=32)


def _temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_chunked_scores_and_their_gradients_equal_the_whole_vocabulary_at_once():
    kx, kw, ky = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (2, 37, 16))
    w = jax.random.normal(kw, (16, 50))
    y = jax.random.randint(ky, (2, 37), 0, 50)
    logits = jnp.einsum("btd,dv->btv", x, w) / 0.7
    logp_v = jax.nn.log_softmax(logits)
    want_logp = jnp.take_along_axis(logp_v, y[..., None], -1)[..., 0]
    want_entropy = -jnp.sum(jnp.exp(logp_v) * logp_v, -1)

    def loss(x, w, chunk):
        logp, entropy = chunked_logprobs.scores(x, w, y, temperature=0.7, chunk=chunk)
        return jnp.sum(logp * jnp.arange(37)) + jnp.sum(entropy), (logp, entropy)

    want_grads = jax.grad(lambda x, w: loss(x, w, 0)[0], argnums=(0, 1))(x, w)
    for chunk in (0, 8, 37):  # 8 does not divide 37: the last chunk is padded
        (logp, entropy) = loss(x, w, chunk)[1]
        np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-5)
        grads = jax.grad(lambda x, w, c=chunk: loss(x, w, c)[0], argnums=(0, 1))(x, w)
        for got, want in zip(grads, want_grads):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_chunks_keep_the_whole_b_t_v_logits_out_of_the_backward_pass():
    b, t, d, v = 2, 512, 32, 8192
    x, w = jnp.ones((b, t, d)), jnp.ones((d, v))
    y = jnp.zeros((b, t), jnp.int32)
    whole_btv = b * t * v * 4  # f32

    def grad_fn(chunk):
        return jax.grad(lambda x, w: chunked_logprobs.scores(x, w, y, chunk=chunk)[0].sum(), argnums=(0, 1))

    whole = _temp_bytes(grad_fn(0), x, w)
    assert whole >= whole_btv
    # About two chunks' [b, 64, V] (the logits and their softmax) instead of two [b, 512, V].
    assert _temp_bytes(grad_fn(64), x, w) < 0.2 * whole


def test_the_models_chunked_scores_equal_its_whole_ones():
    batch = jax.tree.map(lambda a: a[0], random_batch(jax.random.key(1), 1, 3, 40, vocab_size=CFG.vocab_size))
    params = model.init(jax.random.key(0), CFG)
    chunked = model.ModelConfig(**{**CFG.__dict__, "logits_chunk": 16})
    for fn in (
        lambda c: train.token_logprobs(params, batch["tokens"], batch["positions"], c, 0.8)[:2],
        lambda c: model.next_token_logprobs(params, batch["tokens"], batch["positions"], c)[:1],
    ):
        for got, want in zip(fn(chunked), fn(CFG)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("remat", ["full", "save_dots"])
def test_remat_gives_the_same_gradients(remat):
    params = model.init(jax.random.key(0), CFG)
    batch = jax.tree.map(lambda a: a[0], random_batch(jax.random.key(2), 1, 2, 32, vocab_size=CFG.vocab_size))
    rematted = model.ModelConfig(**{**CFG.__dict__, "remat": remat})
    want = jax.grad(lambda p: train.sft_loss(p, batch, CFG)[0])(params)
    got = jax.grad(lambda p: train.sft_loss(p, batch, rematted)[0])(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 + 1e-4 * float(np.abs(b).max()))


def test_full_remat_keeps_less_of_the_forward_for_the_backward():
    cfg = model.ModelConfig(**{**CFG.__dict__, "n_layers": 6, "d_model": 64, "d_ff": 128, "max_seq_len": 512})
    params = model.init(jax.random.key(0), cfg)
    batch = jax.tree.map(
        lambda a: a[0], random_batch(jax.random.key(3), 1, 4, 512, vocab_size=cfg.vocab_size)
    )

    def grad_fn(c):
        return jax.grad(lambda p, bt: train.sft_loss(p, bt, c)[0])

    none = _temp_bytes(grad_fn(cfg), params, batch)
    full = _temp_bytes(grad_fn(model.ModelConfig(**{**cfg.__dict__, "remat": "full"})), params, batch)
    assert full < 0.7 * none


def test_an_unknown_remat_fails_with_its_name():
    with pytest.raises(ValueError, match="remat 'some'"):
        model.ModelConfig(remat="some")
