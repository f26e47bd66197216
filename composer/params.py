"""The one table of the model's weights: shape, logical axes and initializer of every parameter.

The model's params pytree has the structure of `declarations(cfg)`:

    embed [v, d]            unembed [d, v] (untied only)          final_norm [d]
    value_head: w [d], b [] (with cfg.value_head only: PPO's critic on the final hidden state)
    copy: the copy head's weights (with cfg.copy_head_dim > 0; composer/copy_head.py declares them)
    dense_layers / moe_layers (stacks; leading axis L = number of layers in the stack):
        attn_norm [L, d], mlp_norm [L, d]
        attn: wq [L, d, n, h], wk / wv [L, d, g, h], wo [L, n, h, d],
              q_norm / k_norm: [L, h] (qk_norm 'head') or [L, n, h] / [L, g, h] ('proj')
        mlp (dense stack): w_gate / w_up [L, d, f], w_down [L, f, d]
        moe (MoE stack): router [L, d, e], w_gate / w_up [L, e, d, f], w_down [L, e, f, d],
              shared: w_gate / w_up [L, d, f_s], w_down [L, f_s, d] (with a shared expert)

Logical axes are mapped to mesh axes by the rules table of the config (composer/sharding.py); an axis of
None, or a name the rules do not mention (e.g. 'norm'), is replicated.
"""

import dataclasses
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp

from composer.model_config import ModelConfig

Initializer = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]


@dataclasses.dataclass(frozen=True)
class ParamDecl:
    """One weight: its shape, one logical axis name (or None) per dimension, and its initializer."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: Initializer

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axes):
            raise ValueError(f"shape {self.shape} and axes {self.axes} differ in rank")


def normal(std: float) -> Initializer:
    """N(0, std^2); std = 1/sqrt(fan_in) keeps activations O(1) at init (LeCun normal)."""
    return lambda key, shape, dtype: (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def ones(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    del key
    return jnp.ones(shape, dtype)


def zeros(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    del key
    return jnp.zeros(shape, dtype)


def constant(value: float) -> Initializer:
    """Every entry `value`."""
    return lambda key, shape, dtype: jnp.full(shape, value, dtype)


def _stack(n: int, tree: dict) -> dict:
    """Prepends the 'layers' axis of length n to every declaration in `tree`."""
    return jax.tree.map(lambda p: ParamDecl((n, *p.shape), ("layers", *p.axes), p.init), tree)


def _swiglu(d: int, f: int, lead: tuple[int, ...] = (), lead_axes: tuple[str, ...] = ()) -> dict:
    return {
        "w_gate": ParamDecl((*lead, d, f), (*lead_axes, "embed", "mlp"), normal(d**-0.5)),
        "w_up": ParamDecl((*lead, d, f), (*lead_axes, "embed", "mlp"), normal(d**-0.5)),
        "w_down": ParamDecl((*lead, f, d), (*lead_axes, "mlp", "embed"), normal(f**-0.5)),
    }


def _attention(cfg: ModelConfig) -> dict:
    d, n, g, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    decls = {
        "wq": ParamDecl((d, n, h), ("embed", "heads", "head_dim"), normal(d**-0.5)),
        "wk": ParamDecl((d, g, h), ("embed", "kv_heads", "head_dim"), normal(d**-0.5)),
        "wv": ParamDecl((d, g, h), ("embed", "kv_heads", "head_dim"), normal(d**-0.5)),
        "wo": ParamDecl((n, h, d), ("heads", "head_dim", "embed"), normal((n * h) ** -0.5)),
    }
    if cfg.qk_norm == "head":
        decls["q_norm"] = ParamDecl((h,), ("head_dim",), ones)
        decls["k_norm"] = ParamDecl((h,), ("head_dim",), ones)
    elif cfg.qk_norm == "proj":
        decls["q_norm"] = ParamDecl((n, h), ("heads", "head_dim"), ones)
        decls["k_norm"] = ParamDecl((g, h), ("kv_heads", "head_dim"), ones)
    return decls


def _layer(cfg: ModelConfig, moe: bool) -> dict:
    d = cfg.d_model
    decls = {
        "attn_norm": ParamDecl((d,), ("norm",), ones),
        "attn": _attention(cfg),
        "mlp_norm": ParamDecl((d,), ("norm",), ones),
    }
    if not moe:
        decls["mlp"] = _swiglu(d, cfg.d_ff_dense)
        return decls
    e = cfg.n_experts
    # The router's expert axis stays replicated: every token needs the logits of all experts.
    decls["moe"] = {"router": ParamDecl((d, e), ("embed", None), normal(d**-0.5))}
    decls["moe"].update(_swiglu(d, cfg.d_ff, lead=(e,), lead_axes=("exp",)))
    if cfg.shared_expert_d_ff > 0:
        decls["moe"]["shared"] = _swiglu(d, cfg.shared_expert_d_ff)
    return decls


def declarations(cfg: ModelConfig) -> dict:
    """The nested dict of ParamDecl that defines every parameter of the model."""
    d, v = cfg.d_model, cfg.vocab_size
    # A tied table is also the output projection, so it gets that projection's scale 1/sqrt(d).
    embed_std = d**-0.5 if cfg.tie_embeddings else 1.0
    decls: dict = {
        "embed": ParamDecl((v, d), ("vocab", "embed"), normal(embed_std)),
        "final_norm": ParamDecl((d,), ("norm",), ones),
    }
    if not cfg.tie_embeddings:
        decls["unembed"] = ParamDecl((d, v), ("embed", "vocab"), normal(d**-0.5))
    if cfg.copy_head_dim > 0:
        # Imported here: the copy head declares its weights with this module's ParamDecl.
        from composer import copy_head

        decls["copy"] = copy_head.declarations(cfg)
    if cfg.value_head:
        # Zero init: every value starts at 0, the critic learns from the first returns.
        decls["value_head"] = {"w": ParamDecl((d,), ("embed",), zeros), "b": ParamDecl((), (), zeros)}
    if cfg.n_dense_layers > 0:
        decls["dense_layers"] = _stack(cfg.n_dense_layers, _layer(cfg, moe=False))
    if cfg.n_moe_layers > 0:
        decls["moe_layers"] = _stack(cfg.n_moe_layers, _layer(cfg, moe=True))
    return decls


def initialize(key: jax.Array, decls: dict, dtype: jnp.dtype) -> dict:
    """Draws every declared parameter. Each gets the key fold_in(key, crc32(its path)), so adding a
    parameter does not change the values of the others."""

    def draw(path, decl: ParamDecl) -> jax.Array:
        leaf_key = jax.random.fold_in(key, zlib.crc32(jax.tree_util.keystr(path).encode()) & 0x7FFFFFFF)
        return decl.init(leaf_key, decl.shape, dtype)

    return jax.tree_util.tree_map_with_path(draw, decls)
