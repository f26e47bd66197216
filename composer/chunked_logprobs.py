"""Next-token log-probs and entropies over the vocabulary, a chunk of positions at a time.

The learner needs, per position, log p(target) and the entropy of softmax(logits / T); computing them from
the whole `[b, t, V]` f32 logits costs 2 GiB per 16K-token sequence at V = 32K (9 GiB at 152K), and the
backward pass keeps the softmax too. Here the positions go through `lax.scan` in chunks of `chunk`; each
chunk's function is rematerialised (`jax.checkpoint`), so the forward keeps only the chunk's hidden states
and the backward rebuilds one chunk's `[b, chunk, V]` at a time. Peak: one chunk's logits, not t's.

    logit_v = x . w_v / T,   lse = logsumexp_v logit_v
    logp    = logit_target - lse
    entropy = lse - sum_v softmax(logit)_v logit_v
"""

import jax
import jax.numpy as jnp


def _chunk_scores(x_bcd, w_dv, targets_bc, temperature: float):
    logits = jnp.einsum("bcd,dv->bcv", x_bcd, w_dv.astype(x_bcd.dtype), preferred_element_type=jnp.float32)
    if temperature != 1.0:
        logits = logits / temperature
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, targets_bc[..., None], axis=-1)[..., 0]
    entropy = lse - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
    return target - lse, entropy


def scores(
    x_btd: jax.Array, w_dv: jax.Array, targets_bt: jax.Array, *, temperature: float = 1.0, chunk: int = 0
) -> tuple[jax.Array, jax.Array]:
    """(log p(targets_bt[b, i] | x_btd[b, i]), entropy at i), each [b, t] float32, for logits x . w / T.

    x_btd: final hidden states; w_dv: the unembedding; targets_bt: int ids (any value where unused).
    chunk: positions per chunk (0 or >= t: all at once, the plain computation without a scan).
    """
    b, t, d = x_btd.shape
    if chunk <= 0 or chunk >= t:
        return _chunk_scores(x_btd, w_dv, targets_bt, temperature)
    n = -(-t // chunk)
    pad = n * chunk - t
    x = jnp.pad(x_btd, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
    y = jnp.pad(targets_bt, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
    one = jax.checkpoint(lambda xc, yc: _chunk_scores(xc, w_dv, yc, temperature))
    _, (logp, entropy) = jax.lax.scan(lambda carry, xy: (carry, one(*xy)), None, (x, y))

    def unchunk(a):
        return a.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]

    return unchunk(logp), unchunk(entropy)
