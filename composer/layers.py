"""Small building blocks of the transformer: RMSNorm, rotary embeddings, the SwiGLU feed-forward."""

import jax
import jax.numpy as jnp


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, axes: tuple[int, ...] = (-1,)) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2 over `axes`) + eps) * weight.

    The statistics are computed in float32 and the normalised x is cast back to x's dtype before the
    multiplication by the weight (the order Hugging Face Qwen3 / Llama use, so imported weights match).
    `weight` has the shape of x's normalised axes.
    """
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=axes, keepdims=True)
    return (x32 * jax.lax.rsqrt(var + eps)).astype(x.dtype) * weight.astype(x.dtype)


def rope(x_btnh: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), rotate-half layout (GPT-NeoX / Llama / Qwen).

    With half = h/2, inv_freq_i = theta^(-2i/h) and angle = position * inv_freq:
        out[..., :half] = x1 cos - x2 sin,   out[..., half:] = x2 cos + x1 sin,
    where x1 = x[..., :half], x2 = x[..., half:]. Computed in float32, returned in x's dtype.
    """
    h = x_btnh.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)  # [h/2]
    angle_bt1f = (positions_bt.astype(jnp.float32)[..., None] * inv_freq)[:, :, None, :]
    cos, sin = jnp.cos(angle_bt1f), jnp.sin(angle_bt1f)
    x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x_btnh.dtype)


def swiglu(x_md: jax.Array, w_gate_df: jax.Array, w_up_df: jax.Array, w_down_fd: jax.Array) -> jax.Array:
    """SwiGLU feed-forward (Shazeer 2020): down(silu(x @ gate) * (x @ up)). Works for any leading dims."""
    dtype = x_md.dtype
    gate = jnp.einsum("...d,df->...f", x_md, w_gate_df.astype(dtype))
    up = jnp.einsum("...d,df->...f", x_md, w_up_df.astype(dtype))
    return jnp.einsum("...f,fd->...d", jax.nn.silu(gate) * up, w_down_fd.astype(dtype))
