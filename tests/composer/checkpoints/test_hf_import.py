"""Import of Hugging Face MoE checkpoints: composer's logits equal transformers' (stored with the fixtures),
with and without the KV cache, and a sharded import equals an unsharded one."""

import dataclasses
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file

from composer import kv_cache, model, sharding
from composer.checkpoints import hf, hf_config, hf_layout
from experiments.composer import DEFAULT_RULES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
ARCHS = ("qwen3_moe", "olmoe", "mixtral")
FORWARD = jax.jit(model.forward, static_argnums=3)


def _load(arch: str, mesh=None, **runtime):
    directory = FIXTURES / arch
    hf_json = hf.read_hf_config(directory)
    # ragged_dot is dropless: capacity dispatch could drop tokens that transformers routes.
    cfg = hf_config.model_config_from_hf(hf_json, dispatch="ragged_dot", max_seq_len=128, **runtime)
    params = hf.import_params(directory, cfg, hf_json["model_type"], mesh, DEFAULT_RULES)
    return params, cfg, load_file(str(directory / "reference.safetensors"))


def _positions(ids: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_transformers(arch):
    params, cfg, ref = _load(arch)
    logits, _, aux = FORWARD(params, ref["input_ids"], _positions(ref["input_ids"]), cfg)
    assert np.abs(np.asarray(logits) - ref["logits"]).max() < 1e-4
    assert float(aux["dropped_fraction"]) == 0.0
    assert ref["logits"].std() > 0.5  # the reference is not near-constant (the weights are O(1))


def test_config_of_each_fixture():
    """What each architecture maps to (qk-norm placement, renormalisation, dense prefix)."""
    cfgs = {a: hf_config.model_config_from_hf(hf.read_hf_config(FIXTURES / a)) for a in ARCHS}
    q, o, m = cfgs["qwen3_moe"], cfgs["olmoe"], cfgs["mixtral"]
    assert (q.qk_norm, q.norm_topk_prob, q.n_dense_layers, q.head_dim, q.rope_theta) == (
        "head",
        True,
        1,
        16,
        1e6,
    )
    assert (o.qk_norm, o.norm_topk_prob, o.n_dense_layers, o.head_dim, o.rms_eps) == (
        "proj",
        False,
        0,
        8,
        1e-5,
    )
    assert (m.qk_norm, m.norm_topk_prob, m.n_dense_layers, m.n_experts, m.d_ff) == ("none", True, 0, 4, 16)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_transformers_with_kv_cache(arch):
    """Prefill of the first 5 tokens, then one token per step; also with capacity dispatch at factor E / k."""
    for dispatch in ("ragged_dot", "capacity"):
        params, cfg, ref = _load(arch)
        cfg = dataclasses.replace(cfg, dispatch=dispatch, capacity_factor=cfg.n_experts / cfg.top_k)
        ids = ref["input_ids"]
        b, t = ids.shape
        step = jax.jit(model.forward, static_argnums=3, donate_argnums=4)
        cache = kv_cache.init_cache(cfg, b, t)
        got = np.zeros(ref["logits"].shape, np.float32)
        logits, cache, _ = step(params, ids[:, :5], _positions(ids[:, :5]), cfg, cache)
        got[:, :5] = logits
        for i in range(5, t):
            logits, cache, _ = step(params, ids[:, i : i + 1], np.full((b, 1), i, np.int32), cfg, cache)
            got[:, i] = logits[:, 0]
        np.testing.assert_array_equal(cache.lengths, [t] * b)
        assert np.abs(got - ref["logits"]).max() < 1e-4, dispatch


def _mesh(fsdp: int, expert: int, tensor: int):
    shape = ml_collections.ConfigDict({"data": 1, "fsdp": fsdp, "expert": expert, "tensor": tensor})
    return sharding.make_mesh(shape)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("axes", [(2, 4, 1), (2, 2, 2)], ids=["fsdp2-expert4", "fsdp2-expert2-tensor2"])
def test_sharded_import_equals_unsharded(arch, axes):
    assert jax.device_count() == 8
    mesh = _mesh(*axes)
    full, cfg, ref = _load(arch)
    params, _, _ = _load(arch, mesh)
    want = sharding.param_shardings(cfg, mesh, DEFAULT_RULES)
    n_split = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        target = want
        for key in path:
            target = target[key.key]
        assert leaf.sharding.is_equivalent_to(target, leaf.ndim), path
        np.testing.assert_array_equal(
            np.asarray(leaf), np.asarray(hf_layout.get_leaf(full, [k.key for k in path]))
        )
        n_split += leaf.addressable_shards[0].data.shape != leaf.shape
    assert n_split >= 10  # the mesh really splits the weights (experts, embed dims, heads)
    logits, _, _ = jax.jit(model.forward, static_argnums=3)(
        params, ref["input_ids"], _positions(ref["input_ids"]), cfg
    )
    assert np.abs(np.asarray(logits) - ref["logits"]).max() < 1e-4


def test_each_device_reads_only_its_shard():
    """The callback of a device asks the file for the rows / columns of its shard only."""
    mesh = _mesh(2, 4, 1)
    directory = FIXTURES / "qwen3_moe"
    cfg = hf_config.model_config_from_hf(hf.read_hf_config(directory))
    requested = []
    original = hf._Reader.getter

    def recording(self, name):
        get = original(self, name)

        def sliced(index):
            part = get(index)
            requested.append((name, part.size))
            return part

        return sliced

    hf._Reader.getter = recording
    try:
        params = hf.import_params(directory, cfg, "qwen3_moe", mesh, DEFAULT_RULES)
    finally:
        hf._Reader.getter = original
    # w_gate [L, e, d, f] over (expert 4, fsdp 2): each of the 8 devices reads 1 expert, half of each matrix.
    gate = [size for name, size in requested if name.endswith("experts.0.gate_proj.weight")]
    assert gate == [cfg.d_model * cfg.d_ff // 2] * 2 * cfg.n_moe_layers  # only the 2 devices holding expert 0
    embed = [size for name, size in requested if name == "model.embed_tokens.weight"]
    assert len(embed) == 8 and all(size == cfg.vocab_size * cfg.d_model // 2 for size in embed)
    assert params["moe_layers"]["moe"]["w_gate"].addressable_shards[0].data.shape == (
        cfg.n_moe_layers,
        1,
        16,
        16,
    )


def test_read_part_matches_the_full_transform():
    """TensorMap.read_part on random slices equals slicing the fully transformed tensor."""
    rng = np.random.default_rng(0)
    cfg = hf_config.model_config_from_hf(hf.read_hf_config(FIXTURES / "olmoe"))
    for tmap in hf_layout.tensor_maps(cfg, "olmoe"):
        stored = rng.standard_normal(tmap.stored_shape).astype(np.float32)
        inner_shape = tmap.shape[tmap.lead :]
        full = np.transpose(stored.reshape([s for g in tmap.view for s in g]), tmap.perm)
        np.testing.assert_array_equal(tmap.to_hf(full), stored)
        for _ in range(5):
            idx = []
            for n in inner_shape:
                a = int(rng.integers(0, n))
                idx.append(slice(a, int(rng.integers(a + 1, n + 1))))
            got = tmap.read_part(lambda s, x=stored: x[s], tuple(idx))
            np.testing.assert_array_equal(got, full[tuple(idx)], err_msg=str(tmap.path))


def test_bfloat16_params():
    params, cfg, ref = _load("mixtral", param_dtype="bfloat16")
    leaf = params["moe_layers"]["moe"]["w_up"]
    assert leaf.dtype == jax.numpy.bfloat16
    full, _, _ = _load("mixtral")
    want = np.asarray(full["moe_layers"]["moe"]["w_up"]).astype(jax.numpy.bfloat16)
    np.testing.assert_array_equal(np.asarray(leaf), want)
