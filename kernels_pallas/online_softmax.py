"""The online softmax both attention kernels run over key blocks, in base 2 (FlashAttention-2, Algorithm 1).

With z = (q . k) * scale * log2(e), -inf where a key is not visible, per block j:
    m_j = max(m_{j-1}, rowmax z_j),  l_j = 2^(m_{j-1} - m_j) l_{j-1} + rowsum 2^(z_j - m_j),
    o_j = 2^(m_{j-1} - m_j) o_{j-1} + 2^(z_j - m_j) v_j.
m is replaced by 0 while still -inf, so no inf - inf appears; a row that saw no key keeps l = 0.
"""

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32

Carry = tuple[jax.Array, jax.Array, jax.Array]  # o [rows, h], m [rows], l [rows], all f32


def softmax_init(rows: int, h: int) -> Carry:
    """The carry before the first key block: o = 0, m = -inf, l = 0."""
    return jnp.zeros((rows, h), _F32), jnp.full((rows,), -jnp.inf, _F32), jnp.zeros((rows,), _F32)


def softmax_step(carry: Carry, z: jax.Array, v: jax.Array) -> Carry:
    """The carry after one key block: z [rows, block] base-2 scores (-inf where masked), v [block, h]."""
    o, m, denom = carry
    m_new = jnp.maximum(m, jnp.max(z, axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    alpha = jnp.exp2(m - m_safe)
    p = jnp.exp2(z - m_safe[:, None])
    denom = alpha * denom + jnp.sum(p, axis=1)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=_F32)
    return alpha[:, None] * o + pv, m_new, denom
