"""config.json -> ModelConfig: the fields of real checkpoints, and an error naming the field for what the
model cannot represent."""

import json
from pathlib import Path

import pytest

from composer.checkpoints import hf_config
from composer.checkpoints.hf_config import UnsupportedConfig, model_config_from_hf

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"

# The architecture fields of Qwen3-30B-A3B's config.json (transformers 4 spelling: rope_theta, num_experts).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _fixture(arch: str) -> dict:
    return json.loads((FIXTURES / arch / "config.json").read_text())


def test_qwen3_30b_a3b():
    from composer import model

    cfg = model_config_from_hf(QWEN3_30B_A3B, param_dtype="bfloat16", max_seq_len=16384)
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (2048, 48, 32, 4, 128)
    assert (cfg.n_experts, cfg.top_k, cfg.d_ff, cfg.n_dense_layers, cfg.norm_topk_prob) == (
        128,
        8,
        768,
        0,
        True,
    )
    assert (cfg.qk_norm, cfg.rope_theta, cfg.tie_embeddings, cfg.vocab_size) == ("head", 1e6, False, 151936)
    total, active = model.param_counts(cfg)
    assert 30.4e9 < total < 30.6e9 and 3.3e9 < active < 3.4e9  # "30.5B total, 3.3B activated"


def test_runtime_fields_only_from_the_caller():
    cfg = model_config_from_hf(_fixture("olmoe"), dispatch="gmm", compute_dtype="bfloat16")
    assert (cfg.dispatch, cfg.compute_dtype) == ("gmm", "bfloat16")
    with pytest.raises(TypeError, match="d_model"):
        model_config_from_hf(_fixture("olmoe"), d_model=8)


def test_both_spellings_of_rope_theta_and_expert_count():
    new = _fixture("qwen3_moe")  # transformers 5: rope_parameters, num_local_experts
    old = dict(new, rope_theta=new["rope_parameters"]["rope_theta"], num_experts=new["num_local_experts"])
    del old["rope_parameters"], old["num_local_experts"]
    assert model_config_from_hf(old) == model_config_from_hf(new)


def _with(arch: str, **changes) -> dict:
    return dict(_fixture(arch), **changes)


@pytest.mark.parametrize(
    "hf, field",
    [
        (_with("qwen3_moe", model_type="qwen2_moe"), "model_type"),
        (_with("qwen3_moe", attention_bias=True), "attention_bias"),
        (_with("mixtral", hidden_act="gelu"), "hidden_act"),
        (_with("olmoe", clip_qkv=8.0), "clip_qkv"),
        (
            _with("qwen3_moe", rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}),
            "rope_parameters.rope_type",
        ),
        (_with("mixtral", rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling.rope_type"),
        (_with("mixtral", sliding_window=64), "sliding_window"),
        (_with("qwen3_moe", use_sliding_window=True, sliding_window=32), "sliding_window"),
        (_with("qwen3_moe", mlp_only_layers=[1]), "mlp_only_layers / decoder_sparse_step"),
        (
            _with("qwen3_moe", mlp_only_layers=[], decoder_sparse_step=2),
            "mlp_only_layers / decoder_sparse_step",
        ),
        (_with("qwen3_moe", shared_expert_intermediate_size=64), "shared_expert_intermediate_size"),
        (_with("olmoe", head_dim=16), "head_dim"),
        (_with("qwen3_moe", quantization_config={"quant_method": "fp8"}), "quantization_config"),
        (_with("mixtral", partial_rotary_factor=0.5), "partial_rotary_factor"),
        (_with("qwen3_moe", num_local_experts=0), "num_experts"),
    ],
)
def test_unrepresentable_fields_are_named(hf, field):
    with pytest.raises(UnsupportedConfig) as err:
        model_config_from_hf(hf, max_seq_len=128)
    assert field in str(err.value)


def test_a_sliding_window_longer_than_every_sequence_is_full_attention():
    assert model_config_from_hf(_with("mixtral", sliding_window=4096), max_seq_len=2048).n_layers == 2
    assert model_config_from_hf(
        _with("qwen3_moe", use_sliding_window=False, sliding_window=32), max_seq_len=128
    )


def test_dense_prefix_from_decoder_sparse_step_and_mlp_only_layers():
    assert model_config_from_hf(_with("qwen3_moe", mlp_only_layers=[0, 1])).n_dense_layers == 2
    assert (
        model_config_from_hf(_with("qwen3_moe", mlp_only_layers=[], decoder_sparse_step=1)).n_dense_layers
        == 0
    )
    # decoder_sparse_step 3 with 3 layers: layers 0 and 1 dense, layer 2 sparse (a prefix).
    assert (
        model_config_from_hf(_with("qwen3_moe", mlp_only_layers=[], decoder_sparse_step=3)).n_dense_layers
        == 2
    )


def test_architecture_differences():
    a = model_config_from_hf(_fixture("olmoe"))
    b = model_config_from_hf(_fixture("olmoe"), dispatch="gmm")
    assert hf_config.architecture_differences(a, b) == {}
    c = model_config_from_hf(_fixture("mixtral"))
    assert set(hf_config.architecture_differences(a, c)) >= {"qk_norm", "vocab_size", "norm_topk_prob"}
