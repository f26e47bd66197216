"""Hugging Face `config.json` <-> composer's ModelConfig: Qwen3-MoE, OLMoE, Mixtral, dense Qwen3 and Llama.

    model_config_from_hf(hf_config, **runtime) -> ModelConfig
    hf_config_from_model_config(cfg, model_type, base=None) -> dict

A config.json describes the architecture only. The fields of ModelConfig that say how composer runs the model
(RUNTIME_FIELDS: dtypes, kernels, expert dispatch, loss coefficients, the longest sequence) come from the
experiment config. Whatever composer's model cannot reproduce exactly (biases, rope scaling, a sliding window
shorter than the sequences, dense layers that are not a prefix, ...) is an error that names the field.

How the architectures differ, as composer sees them (checked against transformers' modelling code):

    model_type   qk_norm                        top-k renormalised     dense layers
    qwen3_moe    'head' (RMSNorm over h)        norm_topk_prob         mlp_only_layers, decoder_sparse_step
    olmoe        'proj' (over the n*h / g*h     norm_topk_prob         none
                 projection, before reshape)
    mixtral      'none'                         always                 none
    qwen3        'head'                         (dense)                all
    llama        'none'                         (dense)                all
"""

import dataclasses

from absl import logging

from composer.model_config import ModelConfig

MOE_TYPES = ("qwen3_moe", "olmoe", "mixtral")
DENSE_TYPES = ("qwen3", "llama")
SUPPORTED_TYPES = MOE_TYPES + DENSE_TYPES
QK_NORM = {"qwen3_moe": "head", "olmoe": "proj", "mixtral": "none", "qwen3": "head", "llama": "none"}
ARCHITECTURES = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}
# ModelConfig fields that are choices of how to run the model, not part of the checkpoint.
RUNTIME_FIELDS = (
    "max_seq_len",
    "param_dtype",
    "compute_dtype",
    "attention_impl",
    "dispatch",
    "capacity_factor",
    "aux_loss_coef",
    "z_loss_coef",
    "remat",
    "logits_chunk",
)


class UnsupportedConfig(ValueError):
    """config.json asks for something composer's model cannot reproduce; the message names the field."""


def _fail(model_type: str, field: str, value, why: str) -> UnsupportedConfig:
    return UnsupportedConfig(f"config.json ({model_type}): {field}={value!r} is not supported: {why}")


def rope_theta(hf: dict) -> float:
    """RoPE base from `rope_theta` (transformers 4) or `rope_parameters.rope_theta` (transformers 5).

    Only plain RoPE is supported: any scaling (linear, dynamic, yarn, llama3, ...) is an error.
    """
    model_type = hf["model_type"]
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    for field, spec in (("rope_parameters", params), ("rope_scaling", scaling or {})):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise _fail(model_type, f"{field}.rope_type", kind, "composer implements plain RoPE only")
    factor = hf.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise _fail(model_type, "partial_rotary_factor", factor, "composer rotates the whole head")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise UnsupportedConfig(
            f"config.json ({model_type}) gives no rope_theta (nor rope_parameters.rope_theta)"
        )
    return float(theta)


def _n_dense_prefix(hf: dict, n_layers: int) -> int:
    """Qwen3-MoE: layer i is sparse iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.

    composer runs the dense layers as one stack before the MoE stack, so they must be a prefix.
    """
    step = hf.get("decoder_sparse_step", 1) or 1
    mlp_only = set(hf.get("mlp_only_layers") or [])
    dense = [i for i in range(n_layers) if i in mlp_only or (i + 1) % step != 0]
    if dense != list(range(len(dense))):
        raise _fail(
            "qwen3_moe",
            "mlp_only_layers / decoder_sparse_step",
            (sorted(mlp_only), step),
            f"the dense layers {dense} are not a prefix of the {n_layers} layers (composer runs its dense "
            "layers first, as one stack)",
        )
    return len(dense)


def _check_common(hf: dict, max_seq_len: int) -> None:
    model_type = hf["model_type"]
    act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
    if act != "silu":
        raise _fail(model_type, "hidden_act", act, "composer's feed-forward is SwiGLU (silu)")
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field):
            raise _fail(model_type, field, hf[field], "composer's projections have no biases")
    if hf.get("quantization_config"):
        raise _fail(model_type, "quantization_config", "...", "load a checkpoint in float32 / bfloat16")
    if hf.get("clip_qkv") is not None:
        raise _fail(model_type, "clip_qkv", hf["clip_qkv"], "composer does not clamp q, k, v")
    if hf.get("shared_expert_intermediate_size"):
        raise _fail(
            model_type,
            "shared_expert_intermediate_size",
            hf["shared_expert_intermediate_size"],
            "a gated shared expert has no counterpart in composer",
        )
    # A sliding window longer than every sequence composer runs is the same as full attention.
    window = hf.get("sliding_window")
    if model_type in ("qwen3_moe", "qwen3") and not hf.get("use_sliding_window", False):
        window = None
    if window is not None and window < max_seq_len:
        raise _fail(
            model_type,
            "sliding_window",
            window,
            f"composer attends over the whole sequence and model.max_seq_len is {max_seq_len}; "
            f"set model.max_seq_len <= {window}",
        )
    if hf.get("router_jitter_noise"):
        logging.warning(
            "config.json: router_jitter_noise=%s (training-time noise) is not applied by composer",
            hf["router_jitter_noise"],
        )


def model_config_from_hf(hf: dict, **runtime) -> ModelConfig:
    """The ModelConfig of a Hugging Face checkpoint's config.json (a dict).

    `runtime` sets RUNTIME_FIELDS (those left out take ModelConfig's defaults); the rest is the checkpoint's.
    Raises UnsupportedConfig, naming the field, for what composer's model cannot represent.
    """
    unknown = set(runtime) - set(RUNTIME_FIELDS)
    if unknown:
        raise TypeError(f"not runtime fields of ModelConfig: {sorted(unknown)} (they come from config.json)")
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedConfig(f"config.json: model_type={model_type!r} is not one of {SUPPORTED_TYPES}")
    max_seq_len = runtime.get("max_seq_len", ModelConfig.max_seq_len)
    _check_common(hf, max_seq_len)
    d, n_layers, n_heads = hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d // n_heads
    if model_type == "olmoe" and n_heads * head_dim != d:
        # OLMoE's q_norm has the width of hidden_size: it normalises the whole projection.
        raise _fail(
            model_type, "head_dim", head_dim, f"OLMoE's q_norm needs n_heads * head_dim == hidden_size {d}"
        )
    if max_seq_len > hf.get("max_position_embeddings", max_seq_len):
        logging.warning(
            "model.max_seq_len %d exceeds the checkpoint's max_position_embeddings %d",
            max_seq_len,
            hf["max_position_embeddings"],
        )
    arch = dict(
        vocab_size=hf["vocab_size"],
        d_model=d,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=head_dim,
        qk_norm=QK_NORM[model_type],
        rope_theta=rope_theta(hf),
        rms_eps=float(hf["rms_norm_eps"]),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        shared_expert_d_ff=0,
    )
    if model_type in DENSE_TYPES:
        # Every layer dense; the MoE fields are unused (no MoE stack) but must be valid.
        f = hf["intermediate_size"]
        arch.update(n_dense_layers=n_layers, d_ff_dense=f, n_experts=1, top_k=1, d_ff=f, norm_topk_prob=False)
    elif model_type == "qwen3_moe":
        n_experts = hf.get("num_experts", hf.get("num_local_experts"))
        if not n_experts:
            raise _fail(model_type, "num_experts", n_experts, "a Qwen3-MoE without experts is a dense qwen3")
        arch.update(
            n_dense_layers=_n_dense_prefix(hf, n_layers),
            d_ff_dense=hf["intermediate_size"],
            n_experts=n_experts,
            top_k=hf["num_experts_per_tok"],
            d_ff=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        )
    else:
        n_experts = hf["num_experts"] if model_type == "olmoe" else hf["num_local_experts"]
        arch.update(
            n_dense_layers=0,
            d_ff_dense=hf["intermediate_size"],
            n_experts=n_experts,
            top_k=hf["num_experts_per_tok"],
            d_ff=hf["intermediate_size"],
            # Mixtral renormalises the top-k weights unconditionally.
            norm_topk_prob=True if model_type == "mixtral" else bool(hf.get("norm_topk_prob", False)),
        )
    return ModelConfig(**arch, **runtime)


def hf_config_from_model_config(cfg: ModelConfig, model_type: str, base: dict | None = None) -> dict:
    """A config.json (dict) for `cfg` as a `model_type` checkpoint.

    `base` (e.g. the config.json the model was imported from) supplies the fields composer does not model
    (token ids, max_position_embeddings, ...); the architecture fields are overwritten from `cfg`. Raises
    UnsupportedConfig when `cfg` cannot be written as `model_type` (the message names the field).
    """
    if model_type not in SUPPORTED_TYPES:
        raise UnsupportedConfig(f"model_type={model_type!r} is not one of {SUPPORTED_TYPES}")
    if cfg.qk_norm != QK_NORM[model_type]:
        raise UnsupportedConfig(
            f"{model_type} has qk_norm {QK_NORM[model_type]!r}, the model has {cfg.qk_norm!r}"
        )
    if cfg.copy_head_dim:
        raise UnsupportedConfig(f"{model_type} has no copy head (copy_head_dim={cfg.copy_head_dim})")
    if cfg.shared_expert_d_ff:
        raise UnsupportedConfig(
            f"{model_type} has no shared expert (shared_expert_d_ff={cfg.shared_expert_d_ff})"
        )
    if model_type in DENSE_TYPES and cfg.n_moe_layers:
        raise UnsupportedConfig(f"{model_type} is dense, the model has {cfg.n_moe_layers} MoE layers")
    if model_type in ("olmoe", "mixtral") and cfg.n_dense_layers:
        raise UnsupportedConfig(f"{model_type} has no dense layers (n_dense_layers={cfg.n_dense_layers})")
    if model_type == "mixtral" and not cfg.norm_topk_prob:
        raise UnsupportedConfig("mixtral always renormalises the top-k weights (norm_topk_prob=False)")
    if model_type == "olmoe" and cfg.n_heads * cfg.head_dim != cfg.d_model:
        raise UnsupportedConfig(f"olmoe needs n_heads * head_dim == d_model (head_dim={cfg.head_dim})")
    hf = dict(base) if base and base.get("model_type") == model_type else {}
    for stale in ("transformers_version", "rope_scaling", "num_local_experts", "num_experts"):
        hf.pop(stale, None)
    hf.update(
        architectures=[ARCHITECTURES[model_type]],
        model_type=model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        rms_norm_eps=cfg.rms_eps,
        # Both spellings: transformers 4 (and most servers) read rope_theta, transformers 5 rope_parameters.
        rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        # Both spellings again: transformers 5 reads dtype, older readers torch_dtype.
        dtype=cfg.param_dtype,
        torch_dtype=cfg.param_dtype,
    )
    hf.setdefault("max_position_embeddings", cfg.max_seq_len)
    if model_type != "mixtral":
        hf["attention_bias"] = False
    if model_type in DENSE_TYPES:
        hf["intermediate_size"] = cfg.d_ff_dense
    elif model_type == "qwen3_moe":
        hf.update(
            num_experts=cfg.n_experts,
            num_experts_per_tok=cfg.top_k,
            moe_intermediate_size=cfg.d_ff,
            intermediate_size=cfg.d_ff_dense,
            norm_topk_prob=cfg.norm_topk_prob,
            mlp_only_layers=list(range(cfg.n_dense_layers)),
            decoder_sparse_step=1,
            use_sliding_window=False,
        )
    else:
        experts_key = "num_experts" if model_type == "olmoe" else "num_local_experts"
        hf.update(
            {experts_key: cfg.n_experts, "num_experts_per_tok": cfg.top_k, "intermediate_size": cfg.d_ff}
        )
        if model_type == "olmoe":
            hf["norm_topk_prob"] = cfg.norm_topk_prob
    return hf


def architecture_differences(cfg: ModelConfig, other: ModelConfig) -> dict[str, tuple]:
    """{field: (cfg's value, other's value)} over the fields that are not RUNTIME_FIELDS."""
    out = {}
    for field in dataclasses.fields(ModelConfig):
        a, b = getattr(cfg, field.name), getattr(other, field.name)
        if field.name not in RUNTIME_FIELDS and a != b:
            out[field.name] = (a, b)
    return out
