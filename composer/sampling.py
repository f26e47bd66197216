"""The sampling maths of the sampler: per-request keys, temperature and top-p (nucleus) sampling, log-probs.

Keys. Token i of request r is drawn with

    key(r, i) = fold_in(fold_in(base_key, seed(r)), i),    seed(r) = a stable hash of the request id,

so a token's key depends only on its request and its index in the turn, never on the decode slot, the other
requests in the batch or the step at which it was generated: continuous batching draws the same tokens as
generating each request alone.

Distribution. With logits z [v] and temperature T > 0, the sampling distribution is

    q(x) = softmax(z / T)(x) restricted to the nucleus N_p and renormalised,
    N_p  = the smallest set of most probable tokens (under softmax(z / T)) whose total probability >= p,

and the recorded log-prob of the drawn token x is log q(x), the log-prob under the distribution it was
actually drawn from (the behaviour policy of RL). At p = 1, q = softmax(z / T), which is what the RL learner
scores (composer.train.token_logprobs at the sampler's temperature), so the two log-probs agree. With
p < 1 they differ: the learner has no nucleus, and the loss's importance-sampling correction (truncated
ratio learner / sampler) sees that gap as staleness. T = 0 is greedy (argmax); its distribution is a
point mass, so the recorded log-prob is 0 (the same as a nucleus of one token, the limit p -> 0).
"""

import hashlib

import jax
import jax.numpy as jnp


def request_seed(request_id: str) -> int:
    """A seed in [0, 2^31) that depends only on the request id (stable across processes and runs)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def token_keys(base_key: jax.Array, seed_b: jax.Array, index_b: jax.Array) -> jax.Array:
    """key(r, i) = fold_in(fold_in(base_key, seed_b), index_b) for each row b: [b] keys."""

    def one(seed, index):
        return jax.random.fold_in(jax.random.fold_in(base_key, seed), index)

    return jax.vmap(one)(seed_b, index_b)


def nucleus_logits(logits_bv: jax.Array, top_p: float | jax.Array) -> jax.Array:
    """logits with every token outside the top-p nucleus set to -inf (the most probable token is always kept).

    top_p: a scalar, or one per row [b]. A token j is in the nucleus iff the probability of the tokens
    strictly more probable than it is < p; a token tied with the last kept one is kept too.
    """
    top_p = jnp.asarray(top_p, jnp.float32)
    p_b1 = top_p[:, None] if top_p.ndim == 1 else top_p
    probs_bv = jax.nn.softmax(logits_bv, axis=-1)
    sorted_bv = jnp.flip(jnp.sort(probs_bv, axis=-1), axis=-1)  # descending
    before_bv = jnp.cumsum(sorted_bv, axis=-1) - sorted_bv  # mass of the more probable tokens
    n_keep_b = jnp.maximum(jnp.sum(before_bv < p_b1, axis=-1), 1)
    threshold_b = jnp.take_along_axis(sorted_bv, n_keep_b[:, None] - 1, axis=-1)
    return jnp.where(probs_bv >= threshold_b, logits_bv, -jnp.inf)


def sample(
    keys_b: jax.Array, logits_bv: jax.Array, temperature: float | jax.Array, top_p: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row and its log-prob under the distribution it was drawn from (module docstring).

    keys_b: [b] keys; logits_bv: [b, v] float32; temperature >= 0 and 0 < top_p <= 1, each a scalar or one
    per row [b] (requests with their own settings share a batch), Python floats or traced. The sampler
    passes them traced, so that one compiled program serves greedy evaluation and sampled rollouts; each
    branch (greedy or not, nucleus or not) runs only when some row takes it.
    Returns (tokens [b] int32, logprobs [b] float32).
    """
    logits_bv = logits_bv.astype(jnp.float32)
    b = logits_bv.shape[0]
    t_b = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (b,))
    p_b = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (b,))
    greedy_b = t_b == 0.0

    def greedy(logits_bv):
        return jnp.argmax(logits_bv, axis=-1).astype(jnp.int32), jnp.zeros((b,), jnp.float32)

    def nucleus(scaled_bv):
        return jnp.where((p_b < 1.0)[:, None], nucleus_logits(scaled_bv, p_b), scaled_bv)

    def drawn(logits_bv):
        scaled_bv = logits_bv / jnp.where(greedy_b, 1.0, t_b)[:, None]
        scaled_bv = jax.lax.cond(jnp.any(p_b < 1.0), nucleus, lambda x: x, scaled_bv)
        tokens_b = jax.vmap(jax.random.categorical)(keys_b, scaled_bv).astype(jnp.int32)
        logp_bv = jax.nn.log_softmax(scaled_bv, axis=-1)
        logp_b = jnp.take_along_axis(logp_bv, tokens_b[:, None], axis=-1)[:, 0]
        # Greedy rows beside sampled ones: the argmax, log-prob 0 (a point mass), as the greedy branch.
        argmax_b = jnp.argmax(logits_bv, axis=-1).astype(jnp.int32)
        return jnp.where(greedy_b, argmax_b, tokens_b), jnp.where(greedy_b, 0.0, logp_b)

    return jax.lax.cond(jnp.all(greedy_b), greedy, drawn, logits_bv)
