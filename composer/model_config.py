"""ModelConfig: the static description of the transformer (config.model and config.moe, flattened).

Frozen and hashable, so it can be a static argument of jax.jit. Re-exported as composer.model.ModelConfig.
"""

import dataclasses

import jax.numpy as jnp
import ml_collections

# The keys of config.moe; every other field comes from config.model under the same name.
_MOE_FIELDS = (
    "n_experts",
    "top_k",
    "d_ff",
    "norm_topk_prob",
    "shared_expert_d_ff",
    "dispatch",
    "capacity_factor",
    "aux_loss_coef",
    "z_loss_coef",
)
# Fields that are not config keys (set by code that needs them).
_DERIVED_FIELDS = ("value_head",)
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_QK_NORMS = ("none", "head", "proj")
_REMATS = ("none", "full", "save_dots")
# Config value 'auto' of a kernel choice -> the choice on each backend (jax.default_backend()).
AUTO = {
    "attention_impl": {"gpu": "pallas", "default": "cpu"},
    "dispatch": {"gpu": "gmm", "default": "ragged_dot"},
}


def resolve_auto(values: dict, backend: str) -> dict:
    """`values` (ModelConfig fields) with each 'auto' kernel choice replaced by `backend`'s."""
    return {
        k: AUTO[k].get(backend, AUTO[k]["default"]) if k in AUTO and v == "auto" else v
        for k, v in values.items()
    }


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and choices of the decoder-only MoE transformer. Defaults give a tiny test model."""

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    qk_norm: str = "head"  # 'none' | 'head' (per head over head_dim) | 'proj' (over the whole q / k)
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    # A copy head of this width (0: none): the next token is a mixture of the vocabulary softmax and a
    # pointer over the context that copies the token after the position it points at (composer/copy_head.py).
    copy_head_dim: int = 0
    # With a copy head: an exact-match bonus on the pointer for sources whose last 1..n tokens equal the
    # query's (0: none; composer/copy_head.py).
    copy_head_ngram: int = 0
    # With a copy head: a per-query penalty on the log-distance to each source (composer/copy_head.py).
    copy_head_recency: bool = False
    # With a copy head: line keys, a source's key also sees the end of the line it would copy
    # (composer/copy_head.py). The chat tokens that mark lines are the tokenizer's, not the model's: whoever
    # runs the model passes them beside this config (copy_head.LineTokens).
    copy_head_lines: bool = False
    # With a copy head: the weight of a loss on the pointer alone (SFT), -log sum_s a_ts [x_{s+1} = target]
    # at every trained token some source could copy (0: none). The mixture's own loss trains the pointer
    # only through the gate: where the gate closes early (the vocabulary guessing a file's package among
    # twenty), the pointer there gets almost no gradient and never learns to point; this one always does.
    copy_loss_coef: float = 0.0
    n_dense_layers: int = 0  # the first n layers use a dense SwiGLU of width d_ff_dense
    d_ff_dense: int = 128
    max_seq_len: int = 256
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    # Key of composer.attention.ATTENTION_IMPLS: 'cpu' (the XLA:CPU-tuned forms), 'reference' (plain),
    # 'pallas' (the kernels).
    attention_impl: str = "cpu"
    # The learner's memory: rematerialise each scanned layer in the backward pass ('none' | 'full': keep only
    # the layer's input | 'save_dots': keep the weight matmuls' outputs, recompute the rest); REMAT_POLICIES.
    remat: str = "none"
    # The learner's log-probs over the vocabulary this many positions at a time (0: all at once), so no
    # [b, t, V] f32 logits exist at once (composer/chunked_logprobs.py). Models without a copy head.
    logits_chunk: int = 0
    # MoE (config.moe)
    n_experts: int = 4
    top_k: int = 2
    d_ff: int = 64  # width of one expert
    norm_topk_prob: bool = True
    shared_expert_d_ff: int = 0  # 0: no shared expert
    dispatch: str = "capacity"  # key of composer.moe.DISPATCH_IMPLS
    capacity_factor: float = 2.0
    aux_loss_coef: float = 1e-2
    z_loss_coef: float = 1e-3
    # A scalar value head on the final hidden state (PPO's critic, sharing the trunk). Not a config key:
    # the RL phase turns it on for rl.algorithm='gae'.
    value_head: bool = False

    def __post_init__(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotate-half RoPE")
        if self.qk_norm not in _QK_NORMS:
            raise ValueError(f"qk_norm {self.qk_norm!r} is not one of {_QK_NORMS}")
        if not 0 <= self.n_dense_layers <= self.n_layers:
            raise ValueError(f"n_dense_layers {self.n_dense_layers} outside [0, n_layers={self.n_layers}]")
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k {self.top_k} outside [1, n_experts={self.n_experts}]")
        if self.remat not in _REMATS:
            raise ValueError(f"remat {self.remat!r} is not one of {_REMATS}")
        if self.logits_chunk < 0:
            raise ValueError(f"logits_chunk must be >= 0, got {self.logits_chunk}")
        for name in ("param_dtype", "compute_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {tuple(_DTYPES)}")

    @property
    def n_moe_layers(self) -> int:
        return self.n_layers - self.n_dense_layers

    @property
    def param_jnp_dtype(self) -> jnp.dtype:
        return _DTYPES[self.param_dtype]

    @property
    def compute_jnp_dtype(self) -> jnp.dtype:
        return _DTYPES[self.compute_dtype]

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict, backend: str | None = None) -> "ModelConfig":
        """Builds the model config from the full experiment config (its `model` and `moe` sub-dicts).

        Every field is read from the config (a missing key is an error, never a silent default);
        config.model.init_from is not part of the architecture and is left to the caller. A kernel choice
        'auto' (AUTO) becomes `backend`'s (default: the backend JAX runs on).
        """
        values = {}
        for field in dataclasses.fields(cls):
            if field.name in _DERIVED_FIELDS:
                continue
            section = config.moe if field.name in _MOE_FIELDS else config.model
            values[field.name] = field.type(section[field.name])
        if any(values[k] == "auto" for k in AUTO):
            if backend is None:
                import jax

                backend = jax.default_backend()
            values = resolve_auto(values, backend)
        return cls(**values)
