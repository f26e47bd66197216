"""The tiny model with the Pallas kernels selected (dispatch 'gmm', attention 'pallas', interpret mode on
CPU) gives the logits and gradients of the reference path (dispatch 'ragged_dot', attention 'reference'),
in training (no cache) and in cached prefill + decode (where t == 1 takes the decode attention kernel).

Matmuls run at full f32 precision so that a GPU's TF32 default cannot blur the comparison."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer import kv_cache, model

REFERENCE = model.ModelConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, n_experts=4, top_k=2,
    d_ff=32, max_seq_len=64, dispatch="ragged_dot", attention_impl="reference",
)  # fmt: skip
KERNELS = dataclasses.replace(REFERENCE, dispatch="gmm", attention_impl="pallas")
T = 16
LENGTHS = (T, 9)  # row 1: 9 real tokens, then padding (position -1)


def _batch(seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (len(LENGTHS), T), 0, REFERENCE.vocab_size)
    i = jnp.arange(T)[None, :]
    valid = i < jnp.array(LENGTHS)[:, None]
    return tokens, jnp.where(valid, i, -1), valid


KERNEL_NAMES = {"gmm", "tgmm", "flash_forward", "flash_dq", "flash_dkv", "decode_attention"}


def _pallas_kernels(f, *args) -> set[str]:
    """Names of the Pallas kernels in the traced program (proves the kernel path is the one compared)."""
    return set(re.findall(r"name=(\w+)", str(jax.make_jaxpr(f)(*args)))) & KERNEL_NAMES


def _close(actual, expected, rel):
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    np.testing.assert_allclose(actual, expected, rtol=rel, atol=rel * scale)


@pytest.fixture(autouse=True)
def _full_f32_matmuls():
    with jax.default_matmul_precision("float32"):
        yield


@pytest.mark.slow
def test_training_logits_and_gradients_match_the_reference_path():
    params = model.init(jax.random.key(0), REFERENCE)
    tokens, positions, valid = _batch()
    probe = jax.random.normal(jax.random.key(1), (REFERENCE.vocab_size,))

    def loss_and_logits(p, cfg):
        logits, _, aux = model.forward(p, tokens, positions, cfg)
        # padding positions' logits are not defined alike by the two attention paths: leave them out
        loss = jnp.sum(jnp.where(valid, logits @ probe, 0.0)) / jnp.sum(valid) + aux["load_balance_loss"]
        return loss, logits

    grad_fn = jax.value_and_grad(loss_and_logits, has_aux=True)
    assert _pallas_kernels(lambda p: grad_fn(p, KERNELS), params) == {
        "gmm",
        "tgmm",
        "flash_forward",
        "flash_dq",
        "flash_dkv",
    }
    assert not _pallas_kernels(lambda p: grad_fn(p, REFERENCE), params)
    run = jax.jit(grad_fn, static_argnums=1)
    (loss_k, logits_k), grads_k = run(params, KERNELS)
    (loss_r, logits_r), grads_r = run(params, REFERENCE)
    mask = np.asarray(valid)
    _close(np.asarray(logits_k)[mask], np.asarray(logits_r)[mask], 1e-4)
    _close(loss_k, loss_r, 1e-5)
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree.leaves_with_path(grads_r)]
    for path, g_k, g_r in zip(paths, jax.tree.leaves(grads_k), jax.tree.leaves(grads_r)):
        assert float(jnp.max(jnp.abs(g_r))) > 0, path  # every weight is exercised
        _close(g_k, g_r, 1e-4)


@pytest.mark.slow
def test_cached_prefill_and_decode_match_the_reference_path():
    params = model.init(jax.random.key(2), REFERENCE)
    tokens, positions, valid = _batch(seed=3)
    next_tokens = jax.random.randint(jax.random.key(4), (len(LENGTHS), 1), 0, REFERENCE.vocab_size)
    next_positions = jnp.array(LENGTHS, jnp.int32)[:, None]  # the rows decode at different positions

    def prefill_then_decode(p, cfg):
        cache = kv_cache.init_cache(cfg, len(LENGTHS), cfg.max_seq_len)
        prefill, cache, _ = model.forward(p, tokens, positions, cfg, cache)
        decode, cache, _ = model.forward(p, next_tokens, next_positions, cfg, cache)
        return prefill, decode, cache.lengths

    assert _pallas_kernels(lambda p: prefill_then_decode(p, KERNELS), params) == {
        "flash_forward",
        "decode_attention",
        "gmm",
    }
    run = jax.jit(prefill_then_decode, static_argnums=1)
    prefill_k, decode_k, lengths_k = run(params, KERNELS)
    prefill_r, decode_r, lengths_r = run(params, REFERENCE)
    mask = np.asarray(valid)
    _close(np.asarray(prefill_k)[mask], np.asarray(prefill_r)[mask], 1e-4)
    _close(decode_k, decode_r, 1e-4)
    assert lengths_k.tolist() == lengths_r.tolist() == [T + 1, 10]
