"""Export to Hugging Face safetensors: the original names and shapes, bit-exact round trips, sharded files."""

import dataclasses
import json
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest
from safetensors import safe_open

from composer import model, sharding
from composer.checkpoints import export_checkpoint, hf, hf_config, load_tokenizer
from composer.model_config import ModelConfig
from env import chat
from env.chat_format import NATIVE_TEMPLATE
from env.tokenizer import render
from env.tools import tool_schemas
from experiments.composer import DEFAULT_RULES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
ARCHS = ("qwen3_moe", "olmoe", "mixtral")


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out = {}
    for name, file in hf.weight_files(directory).items():
        with safe_open(str(file), framework="np") as f:
            out[name] = f.get_tensor(name)
    return out


def _import(directory: Path, mesh=None):
    hf_json = hf.read_hf_config(directory)
    cfg = hf_config.model_config_from_hf(hf_json)
    return hf.import_params(directory, cfg, hf_json["model_type"], mesh, DEFAULT_RULES), cfg, hf_json


def _assert_trees_equal(a: dict, b: dict) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("arch", ARCHS)
def test_export_gives_the_original_tensors_and_imports_bit_exact(arch, tmp_path):
    source = FIXTURES / arch
    params, cfg, hf_json = _import(source)
    tok = load_tokenizer(source, cfg.vocab_size)
    files = export_checkpoint(
        params, cfg, tmp_path, arch, base_config=hf_json, tokenizer=tok, files_from=source
    )
    assert files == [tmp_path / "model.safetensors"]
    original, exported = _tensors(source), _tensors(tmp_path)
    assert sorted(exported) == sorted(original)
    for name, value in original.items():
        assert exported[name].shape == value.shape and exported[name].dtype == value.dtype, name
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    with safe_open(str(files[0]), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
    again, cfg2, _ = _import(tmp_path)
    assert cfg2 == cfg
    _assert_trees_equal(again, params)
    assert (tmp_path / "tokenizer_config.json").read_text() == (source / "tokenizer_config.json").read_text()
    assert load_tokenizer(tmp_path, cfg.vocab_size).encode("<|im_start|>user\nhi") == tok.encode(
        "<|im_start|>user\nhi"
    )


def test_config_json_round_trip_keeps_the_checkpoint_fields(tmp_path):
    source = FIXTURES / "qwen3_moe"
    params, cfg, hf_json = _import(source)
    export_checkpoint(params, cfg, tmp_path, "qwen3_moe", base_config=hf_json)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["mlp_only_layers"] == [0] and written["num_experts"] == 4
    assert written["rope_theta"] == written["rope_parameters"]["rope_theta"] == 1e6
    for key in ("max_position_embeddings", "eos_token_id", "bos_token_id", "head_dim", "norm_topk_prob"):
        assert written[key] == hf_json[key], key
    assert hf_config.model_config_from_hf(written) == hf_config.model_config_from_hf(hf_json)


def test_several_shards_with_index_from_sharded_params(tmp_path):
    """A small max_shard_bytes splits the files; the index maps every tensor; the params were sharded on 8
    devices; the re-import (sharded again) is bit-exact."""
    mesh = sharding.make_mesh(ml_collections.ConfigDict({"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}))
    params, cfg, hf_json = _import(FIXTURES / "mixtral", mesh)
    files = export_checkpoint(params, cfg, tmp_path, "mixtral", max_shard_bytes=40_000)
    assert len(files) >= 4
    assert [f.name for f in files][:2] == [f"model-0000{i}-of-{len(files):05d}.safetensors" for i in (1, 2)]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f.name for f in files}
    assert sorted(index["weight_map"]) == sorted(_tensors(FIXTURES / "mixtral"))
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in _tensors(FIXTURES / "mixtral").values())
    for file in files:  # under the limit (plus the header), or one tensor larger than the limit alone
        names = [n for n, f in index["weight_map"].items() if f == file.name]
        assert file.stat().st_size < 40_000 + 4096 or len(names) == 1, (file.name, names)
    again, _, _ = _import(tmp_path, mesh)
    _assert_trees_equal(again, params)
    # Re-exported as one file into the same directory: the earlier shards and index are gone.
    assert export_checkpoint(params, cfg, tmp_path, "mixtral") == [tmp_path / "model.safetensors"]
    assert sorted(p.name for p in tmp_path.glob("model*")) == ["model.safetensors"]
    _assert_trees_equal(_import(tmp_path, mesh)[0], params)


@pytest.mark.parametrize(
    "model_type, cfg",
    [
        ("qwen3", ModelConfig(n_layers=2, n_dense_layers=2, d_ff_dense=48, qk_norm="head")),
        (
            "llama",
            ModelConfig(n_layers=2, n_dense_layers=2, d_ff_dense=48, qk_norm="none", tie_embeddings=True),
        ),
        ("qwen3_moe", ModelConfig(n_layers=3, n_dense_layers=2, qk_norm="head", norm_topk_prob=False)),
        ("olmoe", ModelConfig(n_layers=2, qk_norm="proj", n_heads=4, head_dim=16, d_model=64)),
        ("mixtral", ModelConfig(n_layers=2, qk_norm="none", tie_embeddings=True)),
    ],
)
def test_random_composer_model_round_trips(model_type, cfg, tmp_path):
    """composer -> HF -> composer for every supported type (dense ones and tied embeddings included): the same
    config, the same arrays bit for bit; bfloat16 params stay bfloat16 on disk."""
    cfg = dataclasses.replace(cfg, dispatch="ragged_dot", vocab_size=96)
    params = model.init(jax.random.key(3), cfg)
    export_checkpoint(params, cfg, tmp_path / "f32", model_type)
    again, cfg2, hf_json = _import(tmp_path / "f32")
    assert hf_json["model_type"] == model_type
    expected = dataclasses.replace(cfg, dispatch=cfg2.dispatch)
    if model_type in hf_config.DENSE_TYPES:  # the MoE fields of a dense model are unused: canonical values
        expected = dataclasses.replace(
            expected, n_experts=1, top_k=1, d_ff=cfg.d_ff_dense, norm_topk_prob=False
        )
    if model_type in ("olmoe", "mixtral"):  # no dense layers: d_ff_dense is unused, read as the expert width
        expected = dataclasses.replace(expected, d_ff_dense=cfg.d_ff)
    assert cfg2 == expected
    _assert_trees_equal(again, params)
    if cfg.tie_embeddings:
        assert "lm_head.weight" not in _tensors(tmp_path / "f32")

    bf16 = jax.tree.map(lambda x: x.astype(jax.numpy.bfloat16), params)
    cfg_bf16 = dataclasses.replace(cfg, param_dtype="bfloat16")
    export_checkpoint(bf16, cfg_bf16, tmp_path / "bf16", model_type)
    assert {v.dtype.name for v in _tensors(tmp_path / "bf16").values()} == {"bfloat16"}
    hf_json = hf.read_hf_config(tmp_path / "bf16")
    cfg3 = hf_config.model_config_from_hf(hf_json, param_dtype="bfloat16")
    _assert_trees_equal(hf.import_params(tmp_path / "bf16", cfg3, model_type), bf16)


def test_export_refuses_what_the_type_cannot_hold(tmp_path):
    cfg = ModelConfig(qk_norm="head")
    params = model.init(jax.random.key(0), cfg)
    with pytest.raises(hf_config.UnsupportedConfig, match="qk_norm"):
        export_checkpoint(params, cfg, tmp_path, "olmoe")
    cfg = ModelConfig(qk_norm="none", norm_topk_prob=False)
    with pytest.raises(hf_config.UnsupportedConfig, match="renormalises"):
        export_checkpoint(model.init(jax.random.key(0), cfg), cfg, tmp_path, "mixtral")
    cfg = ModelConfig(shared_expert_d_ff=32)
    with pytest.raises(hf_config.UnsupportedConfig, match="shared"):
        export_checkpoint(model.init(jax.random.key(0), cfg), cfg, tmp_path, "qwen3_moe")
    cfg = ModelConfig(copy_head_dim=8)
    with pytest.raises(hf_config.UnsupportedConfig, match="copy head"):
        export_checkpoint(model.init(jax.random.key(0), cfg), cfg, tmp_path, "qwen3_moe")
    assert not list(tmp_path.iterdir())


def test_a_model_in_composer_s_own_format_exports_it_as_its_chat_template(tmp_path):
    """Exported with a tokenizer in composer's own format, the checkpoint carries that format as a Jinja
    template: transformers renders a conversation with tools exactly as composer does, and composer reads
    the export back in the same format."""
    transformers = pytest.importorskip("transformers")
    source = FIXTURES / "qwen3_moe"
    params, cfg, hf_json = _import(source)
    tok = load_tokenizer(source, cfg.vocab_size, "native")
    export_checkpoint(params, cfg, tmp_path, "qwen3_moe", base_config=hf_json, tokenizer=tok)
    assert (tmp_path / "chat_template.jinja").read_text() == NATIVE_TEMPLATE
    conversation = [
        chat.system_message(tool_schemas(), "Fix bugs."),
        chat.Message("user", "add(2, 3) returns -1"),
        chat.Message("assistant", "Reading.", [chat.ToolCall("read_file", {"target_file": "<|im_end|>.py"})]),
        chat.Message("tool", "def add(a, b):"),
        chat.Message("assistant", "Done."),
    ]
    dicts = [
        {"role": m.role, "content": m.content}
        | ({"tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in m.tool_calls]} if m.tool_calls else {})
        for m in conversation
    ]  # fmt: skip
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for n, gen in ((2, True), (len(conversation), False)):
        text = hf_tok.apply_chat_template(
            dicts[:n], tools=tool_schemas(), tokenize=False, add_generation_prompt=gen
        )
        assert text == chat.render_text(conversation[:n], gen)
    again = load_tokenizer(tmp_path, cfg.vocab_size)
    assert again.chat_format.source == NATIVE_TEMPLATE
    assert list(render(conversation, again)[0]) == list(render(conversation, tok)[0])
