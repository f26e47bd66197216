"""The code-search encoder as pure functions over a params pytree (the JAX twin of
env/tools/search_encoder.forward, which the tools run in NumPy; tests check the two agree).

    init(key, cfg) -> params
    forward(params, ids_bt, cfg) -> z_bd   (L2-normalised)

ids: 0 pads, the row's first token is the QUERY or CHUNK marker. Token + learned position embeddings, then
cfg.n_layers pre-norm layers, x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)), with bidirectional multi-head
attention over the row's real tokens and a ReLU MLP; a final RMSNorm, the mean over real tokens (mean
pooling, as Sentence-BERT, Reimers & Gurevych 2019), a linear projection and L2 normalisation.
"""

import math

import jax
import jax.numpy as jnp

from composer import layers
from env.tools.search_encoder import PAD, EncoderConfig


def init(key: jax.Array, cfg: EncoderConfig) -> dict:
    """Random float32 parameters; the same structure search_encoder.save writes."""
    d, f = cfg.d_model, cfg.d_ff
    k_embed, k_pos, k_proj, *k_layers = jax.random.split(key, 3 + cfg.n_layers)
    out_scale = 1.0 / math.sqrt(2 * cfg.n_layers)  # residual branches scaled down (GPT-2's init)

    def normal(k, shape, std):
        return std * jax.random.normal(k, shape, jnp.float32)

    def layer(k):
        k1, k2, k3, k4 = jax.random.split(k, 4)
        return {
            "attn_norm_d": jnp.ones((d,), jnp.float32),
            "w_qkv_dk": normal(k1, (d, 3 * d), 1 / math.sqrt(d)),
            "w_o_kd": normal(k2, (d, d), out_scale / math.sqrt(d)),
            "mlp_norm_d": jnp.ones((d,), jnp.float32),
            "w_in_df": normal(k3, (d, f), 1 / math.sqrt(d)),
            "b_in_f": jnp.zeros((f,), jnp.float32),
            "w_out_fd": normal(k4, (f, d), out_scale / math.sqrt(f)),
        }

    return {
        "embed_vd": normal(k_embed, (cfg.n_embed, d), 0.5),
        "pos_td": normal(k_pos, (cfg.max_len, d), 0.02),
        "layers": [layer(k) for k in k_layers],
        "final_norm_d": jnp.ones((d,), jnp.float32),
        "w_proj_dd": normal(k_proj, (d, d), 1 / math.sqrt(d)),
    }


def param_count(params: dict) -> int:
    return sum(x.size for x in jax.tree.leaves(params))


def attention(p: dict, x_btd: jax.Array, mask_bt: jax.Array, cfg: EncoderConfig) -> jax.Array:
    """Bidirectional multi-head self-attention; padded keys get no weight."""
    b, t, d = x_btd.shape
    n = cfg.n_heads
    h = d // n
    qkv = jnp.einsum("btd,dk->btk", x_btd, p["w_qkv_dk"]).reshape(b, t, 3, n, h)
    q_btnh, k_btnh, v_btnh = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    s_bnts = jnp.einsum("btnh,bsnh->bnts", q_btnh, k_btnh) / math.sqrt(h)
    s_bnts = s_bnts + jnp.where(mask_bt, 0.0, -1e9)[:, None, None, :]
    a_btnh = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s_bnts, axis=-1), v_btnh)
    return jnp.einsum("btk,kd->btd", a_btnh.reshape(b, t, d), p["w_o_kd"])


def mean_pool(x_btd: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """[b, t, d] -> [b, d]: the mean over each row's real tokens (a row of padding only gives zeros)."""
    m_bt1 = mask_bt[..., None].astype(x_btd.dtype)
    return (x_btd * m_bt1).sum(1) / jnp.maximum(m_bt1.sum(1), 1.0)


def forward(params: dict, ids_bt: jax.Array, cfg: EncoderConfig) -> jax.Array:
    """[b, t] int ids -> [b, d] float32 unit vectors (module docstring)."""
    t = ids_bt.shape[1]
    mask_bt = ids_bt != PAD
    x_btd = params["embed_vd"][ids_bt] + params["pos_td"][:t]
    for p in params["layers"]:
        x_btd = x_btd + attention(p, layers.rms_norm(x_btd, p["attn_norm_d"], cfg.rms_eps), mask_bt, cfg)
        y_btd = layers.rms_norm(x_btd, p["mlp_norm_d"], cfg.rms_eps)
        hid_btf = jax.nn.relu(jnp.einsum("btd,df->btf", y_btd, p["w_in_df"]) + p["b_in_f"])
        x_btd = x_btd + jnp.einsum("btf,fd->btd", hid_btf, p["w_out_fd"])
    x_btd = layers.rms_norm(x_btd, params["final_norm_d"], cfg.rms_eps)
    z_bd = mean_pool(x_btd, mask_bt) @ params["w_proj_dd"]
    return z_bd / jnp.maximum(jnp.linalg.norm(z_bd, axis=-1, keepdims=True), 1e-6)
