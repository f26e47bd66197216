"""Grouped-query self-attention: the attention layer and the registry of attention kernels.

Every kernel in ATTENTION_IMPLS has the signature

    attend(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b, *, self_keys=False) -> o_btnh

and the visibility rule: key j (its index in s, which is its position) is visible to a query at position
p iff j <= p and j < kv_len[b]. A query with p < 0 (padding) sees nothing useful; its output is finite and
meant to be ignored. n query heads share g kv heads (n % g == 0; head i uses kv head i // (n / g)); scores
are scaled by 1/sqrt(h). self_keys says that the keys are the call's own tokens (no cache: each row's
real tokens at positions 0, 1, ..., so a key's index is its position); a kernel may use it to skip the
keys no query sees, and must give the same result without it.

    'reference': `attend_reference`, the plain computation over every key (the oracle of the tests).
    'cpu':       `attend_cpu`, the same result in forms tuned for XLA:CPU: one matrix-vector product per
                 head for a decode step, causal query blocks without a cache, key chunks up to the longest
                 row with one.
    'pallas':    the Pallas kernels (kernels_pallas/attention_ops.py), imported only when selected.
    'twin':      the flash kernel's memory for the memory plan (composer/memory_twins.py).
    'auto':      (a config value, composer/model_config.py) 'pallas' on a GPU, 'cpu' elsewhere.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from composer import kv_cache, layers, registry
from composer.model_config import ModelConfig

# Large and finite, so that a query that sees no key gets a uniform (finite) softmax, not NaN.
_MASKED = -1e30

# Query block of the cache-free path (training, scoring): see `attend_causal_blocks`. fwd+bwd of one
# layer's attention over one 1792-token row (4 heads over 2 kv heads, head_dim 32) on a 2-core CPU: 132-166 ms
# in blocks of 256, 110 in blocks of 128 (49% of the scores instead of 57%, and each block's scores a
# quarter the size), 102 in blocks of 64 (but twice the compile time); at 2048 tokens 217 / 137 / 147.
CAUSAL_BLOCK = 128
# Key chunk of the cached path with several new tokens per row (prefill, extend): see `attend_key_chunks`.
KEY_CHUNK = 256
# A decode step (one query per row) with at most this many query heads takes one matrix-vector product
# per head (`_attend_one_query_per_head`), with more the block-diagonal form (`_attend_one_query_blocks`).
# The default model's decode at 1500-token contexts, 16 slots, on a 2-core CPU: 1066-1109 -> 1527-1551
# tokens/s; at 300 tokens and at the peer shape of benchmarks/decode.py, no change beyond noise.
PER_HEAD_MAX_HEADS = 8


def _visible_bts(j_s: jax.Array, q_pos_bt: jax.Array, kv_len_b: jax.Array) -> jax.Array:
    """The module's visibility rule: whether key index j_s[i] is visible to each query, [b, t, len(j_s)]."""
    return (j_s <= q_pos_bt[:, :, None]) & (j_s < kv_len_b[:, None, None])


def attend_reference(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    *,
    self_keys: bool = False,
) -> jax.Array:
    """softmax(q k^T / sqrt(h) + mask) v in plain jnp over every key; scores and softmax in float32."""
    del self_keys  # every key is scored; the mask alone decides
    b, t, n, h = q_btnh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    q_btgrh = q_btnh.reshape(b, t, g, n // g, h)
    scores = jnp.einsum("btgrh,bsgh->bgrts", q_btgrh, k_bsgh, preferred_element_type=jnp.float32)
    scores = scores * h**-0.5
    visible_bts = _visible_bts(jnp.arange(s, dtype=jnp.int32), q_pos_bt, kv_len_b)
    scores = jnp.where(visible_bts[:, None, None], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_bsgh.dtype)
    o_btgrh = jnp.einsum("bgrts,bsgh->btgrh", probs, v_bsgh)
    return o_btgrh.reshape(b, t, n, h)


def _attend_one_query(
    q_b1nh: jax.Array, k_bsgh: jax.Array, v_bsgh: jax.Array, q_pos_b1: jax.Array, kv_len_b: jax.Array
) -> jax.Array:
    """Attention of one query per row (a decode step): per head up to PER_HEAD_MAX_HEADS query
    heads, else in diagonal blocks. Both read the cache in place as [b, s, g*h]."""
    if q_b1nh.shape[2] <= PER_HEAD_MAX_HEADS:
        return _attend_one_query_per_head(q_b1nh, k_bsgh, v_bsgh, q_pos_b1, kv_len_b)
    return _attend_one_query_blocks(q_b1nh, k_bsgh, v_bsgh, q_pos_b1, kv_len_b)


def _attend_one_query_per_head(
    q_b1nh: jax.Array, k_bsgh: jax.Array, v_bsgh: jax.Array, q_pos_b1: jax.Array, kv_len_b: jax.Array
) -> jax.Array:
    """One query per row, one head at a time: each head's scores are a matrix-vector product of the
    row's cache, read as [s, g*h], with the head's query placed in its kv head's h entries (zeros
    elsewhere), and its output the product of its probabilities with the values, of which its kv head's h
    entries are kept. A product with one column reads the cache once and packs nothing, where the block
    form's [s, g*h] @ [g*h, g*r] product first copies the whole cache window into the matmul's own
    layout; the n products re-read a row's window from cache. Scores and softmax in float32.
    """
    b, _, n, h = q_b1nh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    r = n // g
    k_bsc, v_bsc = k_bsgh.reshape(b, s, g * h), v_bsgh.reshape(b, s, g * h)
    q_bgrh = q_b1nh.reshape(b, g, r, h).astype(k_bsgh.dtype)
    eye_gg = jnp.eye(g, dtype=k_bsgh.dtype)
    visible_bs = _visible_bts(jnp.arange(s, dtype=jnp.int32), q_pos_b1, kv_len_b)[:, 0]
    heads = []
    for gi in range(g):
        for ri in range(r):
            q_bc = (eye_gg[gi][None, :, None] * q_bgrh[:, gi, ri, None, :]).reshape(b, g * h)
            scores_bs = jnp.einsum("bsc,bc->bs", k_bsc, q_bc, preferred_element_type=jnp.float32) * h**-0.5
            probs_bs = jax.nn.softmax(jnp.where(visible_bs, scores_bs, _MASKED), axis=-1)
            o_bc = jnp.einsum("bs,bsc->bc", probs_bs.astype(v_bsgh.dtype), v_bsc)
            heads.append(o_bc[:, gi * h : (gi + 1) * h])
    return jnp.stack(heads, axis=1).reshape(b, 1, n, h)


def _attend_one_query_blocks(
    q_b1nh: jax.Array, k_bsgh: jax.Array, v_bsgh: jax.Array, q_pos_b1: jax.Array, kv_len_b: jax.Array
) -> jax.Array:
    """Attention of one query per row (a decode step), as matmuls over the cache's own layout.

    A dot over (b, g) batches needs s beside h, so XLA would first transpose the keys and the values (a
    copy of the whole cache window, per layer and step). Instead the cache is read as [b, s, g*h] and
    the queries form a block-diagonal [b, g*h, g*r] matrix (query head (g, r) has its h entries in rows
    g*h ... g*h + h - 1, zeros elsewhere): the scores are one [s, g*h] @ [g*h, g*r] product per row and
    the output one [g*r, s] @ [s, g*h] product, whose diagonal blocks are kept. That multiplies g times
    as many entries (the zeros), which costs little: a decode step is bound by reading the cache, and
    each cached entry is now read once, in place. Scores and softmax in float32.
    """
    b, _, n, h = q_b1nh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    r = n // g
    eye_gg = jnp.eye(g, dtype=k_bsgh.dtype)
    q_bgrh = q_b1nh.reshape(b, g, r, h).astype(k_bsgh.dtype)
    q_bce = jnp.einsum("bgrh,gk->bghkr", q_bgrh, eye_gg).reshape(b, g * h, g * r)
    k_bsc = k_bsgh.reshape(b, s, g * h)
    scores_bse = jnp.einsum("bsc,bce->bse", k_bsc, q_bce, preferred_element_type=jnp.float32) * h**-0.5
    visible_bs = _visible_bts(jnp.arange(s, dtype=jnp.int32), q_pos_b1, kv_len_b)[:, 0]
    scores_bse = jnp.where(visible_bs[:, :, None], scores_bse, _MASKED)
    probs_bse = jax.nn.softmax(scores_bse, axis=1).astype(v_bsgh.dtype)
    o_bec = jnp.einsum("bse,bsc->bec", probs_bse, v_bsgh.reshape(b, s, g * h))
    o_bgrh = jnp.einsum("bgrkh,gk->bgrh", o_bec.reshape(b, g, r, g, h), eye_gg)
    return o_bgrh.reshape(b, 1, n, h)


def attend_causal_blocks(
    attend: Callable,
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    block: int = CAUSAL_BLOCK,
) -> jax.Array:
    """`attend` run per block of `block` queries, block i over the first (i + 1) * block keys only.

    Precondition: no query's position exceeds its own index (padding is negative), as on the cache-free
    path where the keys are the call's own tokens and a key's index is its position. Then no query of
    block i sees a key past the block's end, and the result equals `attend` over all keys, while the
    masked upper triangle of the scores (almost half of them) is never computed: with 8 blocks, 36/64 of
    the score and softmax work, forward and backward (with 16, 136/256). Sequences of at most one block, or
    not a multiple of it, take the plain call.
    """
    t = q_btnh.shape[1]
    if t <= block or t % block or k_bsgh.shape[1] != t:
        return attend(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)
    outs = []
    for i in range(t // block):
        q_rows, end = slice(i * block, (i + 1) * block), (i + 1) * block
        outs.append(
            attend(q_btnh[:, q_rows], k_bsgh[:, :end], v_bsgh[:, :end], q_pos_bt[:, q_rows], kv_len_b)
        )
    return jnp.concatenate(outs, axis=1)


def attend_key_chunks(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    chunk: int = KEY_CHUNK,
) -> jax.Array:
    """Attention over a cache, `chunk` keys at a time, only as far as the call's longest row.

    A cache is allocated for the longest sequence, so most of its entries are usually empty: the plain
    computation scores and normalises every query against all s of them (for an extend of a few hundred
    tokens against a 2240-entry cache, most of its time). Here a while loop walks the keys in chunks with
    an online softmax (running max m, sum l and weighted values) and stops after the chunk holding entry
    max(kv_len) - 1, so the work follows the lengths actually present, in one compiled program. The last
    chunk starts at s - chunk (no padding copy of the cache); keys it shares with the previous one are
    masked. Forward only (the loop's trip count is data-dependent): the sampler's path, not training's.
    """
    b, t, n, h = q_btnh.shape
    s, g = k_bsgh.shape[1], k_bsgh.shape[2]
    if s <= chunk:
        return attend_reference(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)
    q_btgrh = q_btnh.reshape(b, t, g, n // g, h)
    stat_shape = (b, g, n // g, t)
    init = (
        jnp.int32(0),
        jnp.full(stat_shape, _MASKED, jnp.float32),  # running max of the scores
        jnp.zeros(stat_shape, jnp.float32),  # running sum of exp(score - max)
        jnp.zeros((*stat_shape, h), jnp.float32),  # running sum of exp(score - max) * value
    )
    n_chunks = (jnp.max(kv_len_b) + chunk - 1) // chunk

    def body(carry):
        i, m_bgrt, l_bgrt, acc_bgrth = carry
        first = i * chunk
        start = jnp.minimum(first, s - chunk)
        k_bcgh = jax.lax.dynamic_slice_in_dim(k_bsgh, start, chunk, axis=1)
        v_bcgh = jax.lax.dynamic_slice_in_dim(v_bsgh, start, chunk, axis=1)
        scores = jnp.einsum("btgrh,bcgh->bgrtc", q_btgrh, k_bcgh, preferred_element_type=jnp.float32)
        j_c = start + jnp.arange(chunk, dtype=jnp.int32)
        visible_btc = _visible_bts(j_c, q_pos_bt, kv_len_b) & (j_c >= first)
        scores = jnp.where(visible_btc[:, None, None], scores * h**-0.5, _MASKED)
        m_new = jnp.maximum(m_bgrt, jnp.max(scores, axis=-1))
        p_bgrtc = jnp.exp(scores - m_new[..., None])
        alpha = jnp.exp(m_bgrt - m_new)
        pv = jnp.einsum(
            "bgrtc,bcgh->bgrth", p_bgrtc.astype(v_bsgh.dtype), v_bcgh, preferred_element_type=jnp.float32
        )
        return i + 1, m_new, alpha * l_bgrt + jnp.sum(p_bgrtc, axis=-1), alpha[..., None] * acc_bgrth + pv

    _, _, l_bgrt, acc_bgrth = jax.lax.while_loop(lambda c: c[0] < n_chunks, body, init)
    # l >= 1 for a query that saw a key. One that saw none (padding) gets the mean of the values read,
    # or 0 when no chunk was read: finite, and ignored, as attend_reference's uniform softmax is.
    o_bgrth = acc_bgrth / jnp.maximum(l_bgrt, 1e-30)[..., None]
    return jnp.einsum("bgrth->btgrh", o_bgrth).reshape(b, t, n, h).astype(v_bsgh.dtype)


def attend_cpu(
    q_btnh: jax.Array,
    k_bsgh: jax.Array,
    v_bsgh: jax.Array,
    q_pos_bt: jax.Array,
    kv_len_b: jax.Array,
    *,
    self_keys: bool = False,
) -> jax.Array:
    """attend_reference's result in the forms XLA:CPU runs fastest: a decode step (one query per row) as
    matrix-vector products over the cache read in place, the cache-free path (self_keys) in causal query
    blocks, several queries over a cache in key chunks that stop at the longest row."""
    if q_btnh.shape[1] == 1:
        return _attend_one_query(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)
    if self_keys:
        return attend_causal_blocks(attend_reference, q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)
    return attend_key_chunks(q_btnh, k_bsgh, v_bsgh, q_pos_bt, kv_len_b)


def _attend_pallas(*q_k_v_pos_len: jax.Array, self_keys: bool = False) -> jax.Array:
    """The Pallas kernels, imported on first use (they skip invisible keys themselves)."""
    del self_keys
    attend = registry.load("kernels_pallas.attention_ops:attend", "attention_impl 'pallas'")
    return attend(*q_k_v_pos_len)


ATTENTION_IMPLS: dict[str, str | Callable] = {
    "reference": attend_reference,
    "cpu": attend_cpu,
    "pallas": _attend_pallas,
    # The flash kernel's memory without its arithmetic: what the memory plan compiles (never run).
    "twin": "composer.memory_twins:attend",
}


def get_attend(name: str) -> Callable:
    """The attention kernel registered as `name` (imports a lazy path now)."""
    return registry.resolve(ATTENTION_IMPLS, name, "attention_impl")


def attention_layer(
    p: dict,
    x_btd: jax.Array,
    positions_bt: jax.Array,
    cfg: ModelConfig,
    layer: jax.Array,
    cache: kv_cache.KVCache | None,
    plan: kv_cache.WritePlan | None,
) -> tuple[jax.Array, kv_cache.KVCache | None]:
    """Self-attention of one layer (p: wq, wk, wv, wo and, with qk-norm, q_norm, k_norm).

    Projections, qk-norm ('head': RMSNorm over h per head after the reshape; 'proj': RMSNorm over the
    whole n*h / g*h projection, as in OLMoE), RoPE, then attention. Without a cache the keys are this
    call's tokens (each row's real tokens at positions 0..n-1, so index = position). With a cache the new
    keys/values are written at their positions (per `plan`) and the queries attend over the whole cache.
    Returns (output [b, t, d], updated cache or None).
    """
    dtype = x_btd.dtype
    q_btnh = jnp.einsum("btd,dnh->btnh", x_btd, p["wq"].astype(dtype))
    k_btgh = jnp.einsum("btd,dgh->btgh", x_btd, p["wk"].astype(dtype))
    v_btgh = jnp.einsum("btd,dgh->btgh", x_btd, p["wv"].astype(dtype))
    if cfg.qk_norm == "head":
        q_btnh = layers.rms_norm(q_btnh, p["q_norm"], cfg.rms_eps)
        k_btgh = layers.rms_norm(k_btgh, p["k_norm"], cfg.rms_eps)
    elif cfg.qk_norm == "proj":
        q_btnh = layers.rms_norm(q_btnh, p["q_norm"], cfg.rms_eps, axes=(-2, -1))
        k_btgh = layers.rms_norm(k_btgh, p["k_norm"], cfg.rms_eps, axes=(-2, -1))
    q_btnh = layers.rope(q_btnh, positions_bt, cfg.rope_theta)
    k_btgh = layers.rope(k_btgh, positions_bt, cfg.rope_theta)

    if cache is None:
        keys_bsgh, values_bsgh = k_btgh, v_btgh
        kv_len_b = jnp.max(positions_bt, axis=1) + 1  # 0 for a row of padding only
    else:
        k_buf, keys_bsgh = kv_cache.write_layer(cache.k, layer, k_btgh, plan)
        v_buf, values_bsgh = kv_cache.write_layer(cache.v, layer, v_btgh, plan)
        cache = kv_cache.KVCache(k=k_buf, v=v_buf, lengths=plan.lengths_b)
        kv_len_b = plan.lengths_b
        q_btnh = q_btnh.astype(keys_bsgh.dtype)
    attend = get_attend(cfg.attention_impl)
    o_btnh = attend(
        q_btnh, keys_bsgh, values_bsgh, positions_bt, kv_len_b.astype(jnp.int32), self_keys=cache is None
    )
    return jnp.einsum("btnh,nhd->btd", o_btnh.astype(dtype), p["wo"].astype(dtype)), cache
