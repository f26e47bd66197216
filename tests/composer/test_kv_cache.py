"""KV cache: prefill then step-by-step decode (rows at different lengths) equals the full forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer import kv_cache, model
from composer.model_config import ModelConfig

FORWARD = jax.jit(model.forward, static_argnums=3)

CFG = ModelConfig(n_layers=3, n_dense_layers=1, shared_expert_d_ff=32)
LENGTHS = np.array([9, 5, 12, 1])  # real tokens per row (right padding after them)
T = 12


def _positions(lengths, start, width):
    """Positions start[b] + i of a chunk of `width` tokens per row, -1 where i >= lengths[b]."""
    i = np.arange(width)[None, :]
    return np.where(i < lengths[:, None], start[:, None] + i, -1).astype(np.int32)


def _batch(seed=0):
    tokens = np.asarray(jax.random.randint(jax.random.key(seed), (len(LENGTHS), T), 0, CFG.vocab_size))
    positions = _positions(LENGTHS, np.zeros_like(LENGTHS), T)
    return tokens, positions


def _gather(tokens, starts, width):
    idx = np.clip(starts[:, None] + np.arange(width)[None, :], 0, T - 1)
    return np.take_along_axis(tokens, idx, axis=1)


# capacity_factor = E / k: nothing is dropped, so routing a token does not depend on the rest of its batch
# (with drops, a 4-token decode batch and a 48-token full batch would drop different assignments).
@pytest.mark.parametrize("dispatch", ["capacity", "ragged_dot"])
def test_prefill_then_decode_equals_full_forward(dispatch):
    cfg = dataclasses.replace(CFG, dispatch=dispatch, capacity_factor=CFG.n_experts / CFG.top_k)
    params = model.init(jax.random.key(1), cfg)
    tokens, positions = _batch()
    full, _, _ = FORWARD(params, tokens, positions, cfg)
    step = jax.jit(model.forward, static_argnums=3, donate_argnums=4)

    # PREFILL: each row's first prefill_b tokens (right-padded to the longest); rows then sit at
    # different positions. One row gets no prefill at all.
    prefill = np.minimum(LENGTHS, np.array([4, 2, 6, 0]))
    cache = kv_cache.init_cache(cfg, len(LENGTHS), T)
    width = int(prefill.max())
    pos = _positions(prefill, np.zeros_like(prefill), width)
    logits, cache, _ = step(params, _gather(tokens, np.zeros_like(prefill), width), pos, cfg, cache)
    got = np.zeros_like(full)
    for b in range(len(LENGTHS)):
        got[b, : prefill[b]] = logits[b, : prefill[b]]
    np.testing.assert_array_equal(cache.lengths, prefill)

    # DECODE: one token per row per step; a row past its length feeds padding and must stay unchanged.
    done = prefill.copy()
    while (done < LENGTHS).any():
        n_new = (done < LENGTHS).astype(int)
        old = cache
        old_k = np.array(cache.k, copy=True)  # a copy: a numpy view would pin the buffer
        logits, cache, _ = step(params, _gather(tokens, done, 1), _positions(n_new, done, 1), cfg, cache)
        assert old.k.is_deleted(), "the cache buffer should be donated"
        for b in np.flatnonzero(n_new):
            got[b, done[b]] = logits[b, 0]
        for b in np.flatnonzero(n_new == 0):  # an idle row's entries and length are untouched
            np.testing.assert_array_equal(np.asarray(cache.k)[:, b], old_k[:, b])
        done += n_new
        np.testing.assert_array_equal(cache.lengths, done)

    valid = positions >= 0
    np.testing.assert_allclose(got[valid], np.asarray(full)[valid], atol=1e-4, rtol=1e-4)


def test_chunk_appended_near_the_end_of_the_cache():
    """A multi-token chunk whose padded tail runs past the cache end lands at the right indices."""
    cfg = dataclasses.replace(CFG, dispatch="ragged_dot")
    params = model.init(jax.random.key(2), cfg)
    tokens, positions = _batch(seed=3)
    full, _, _ = FORWARD(params, tokens, positions, cfg)

    # Prefill up to `split`, then one chunk of width 5 with the rest: row 2 (length 12) continues at
    # position 9 with 3 real tokens, so its window (9..13) runs past the cache end (12).
    split = np.minimum(LENGTHS, np.array([7, 3, 9, 1]))
    cache = kv_cache.init_cache(cfg, len(LENGTHS), T)
    width = int(split.max())
    _, cache, _ = FORWARD(
        params, _gather(tokens, np.zeros_like(split), width), _positions(split, 0 * split, width), cfg, cache
    )
    rest = LENGTHS - split
    chunk = 5
    logits, cache, _ = FORWARD(
        params, _gather(tokens, split, chunk), _positions(rest, split, chunk), cfg, cache
    )
    np.testing.assert_array_equal(cache.lengths, LENGTHS)
    for b in range(len(LENGTHS)):
        np.testing.assert_allclose(logits[b, : rest[b]], full[b, split[b] : LENGTHS[b]], atol=1e-4, rtol=1e-4)


def test_plan_write_windows():
    lengths = jnp.array([3, 7, 5], jnp.int32)
    positions = jnp.array([[3, 4, -1], [-1, -1, -1], [6, 7, -1]], jnp.int32)
    plan = kv_cache.plan_write(lengths, positions, max_len=8)
    np.testing.assert_array_equal(plan.lengths_b, [5, 7, 8])
    # Row 2's window would start at 6 and end past 8: it is clamped to start 5 and shifted by one slot.
    np.testing.assert_array_equal(plan.start_b, [3, 0, 5])
    np.testing.assert_array_equal(plan.keep_bt, [[1, 1, 0], [0, 0, 0], [0, 1, 1]])
    np.testing.assert_array_equal(plan.src_bt[2, 1:], [0, 1])
    with pytest.raises(ValueError, match="do not fit"):
        kv_cache.plan_write(lengths, jnp.zeros((3, 9), jnp.int32), max_len=8)


def test_one_token_write_touches_only_its_entries():
    """A decode step's write (one token per row, a scatter): each row's entry at its position in the
    given layer, nothing for a padding row, every other entry as it was."""
    n_layers, b, s, g, h = 2, 3, 8, 2, 4
    buf = jax.random.normal(jax.random.key(0), (n_layers, b, s, g, h))
    new = jax.random.normal(jax.random.key(1), (b, 1, g, h))
    positions = jnp.array([[3], [-1], [7]], jnp.int32)
    plan = kv_cache.plan_write(jnp.array([3, 5, 7], jnp.int32), positions, max_len=s)
    out, layer_view = jax.jit(kv_cache.write_layer)(buf, jnp.int32(1), new, plan)
    want = np.array(buf)
    want[1, 0, 3] = new[0, 0]
    want[1, 2, 7] = new[2, 0]
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(layer_view, want[1])
    np.testing.assert_array_equal(plan.lengths_b, [4, 5, 8])
