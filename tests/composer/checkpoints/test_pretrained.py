"""load_pretrained: config.model.init_from -> (params born sharded on config.mesh, ModelConfig, tokenizer)."""

from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from composer import model, sharding
from composer.checkpoints import load_pretrained, pretrained_tokenizer
from experiments.composer import get_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"


def test_load_pretrained_on_the_config_mesh():
    config = get_config("tiny")
    config.model.init_from = str(FIXTURES / "qwen3_moe")
    config.mesh.data, config.mesh.fsdp, config.mesh.expert = 1, 2, 4
    config.moe.dispatch = "ragged_dot"
    config.model.max_seq_len = 128
    params, cfg, tokenizer = load_pretrained(config)
    # Architecture from config.json, how-to-run from the experiment config.
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_dense_layers, cfg.head_dim) == (
        303,
        32,
        3,
        1,
        16,
    )
    assert (cfg.dispatch, cfg.max_seq_len, cfg.param_dtype) == ("ragged_dot", 128, "float32")
    mesh = sharding.make_mesh(config.mesh)
    want = sharding.param_shardings(cfg, mesh, tuple(config.mesh.rules))
    leaves = jax.tree.leaves(params)
    assert all(a.sharding.is_equivalent_to(s, a.ndim) for a, s in zip(leaves, jax.tree.leaves(want)))
    assert len(params["moe_layers"]["moe"]["w_down"].sharding.device_set) == 8
    assert tokenizer.vocab_size == 287 and tokenizer.im_end_id == 282
    assert pretrained_tokenizer(config).encode("<tool_call>x") == tokenizer.encode("<tool_call>x")
    ref = load_file(str(FIXTURES / "qwen3_moe" / "reference.safetensors"))
    ids = ref["input_ids"]
    pos = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    logits, _, _ = jax.jit(model.forward, static_argnums=3)(params, ids, pos, cfg)
    assert np.abs(np.asarray(logits) - ref["logits"]).max() < 1e-4


def test_no_checkpoint_named():
    with pytest.raises(ValueError, match="init_from is empty"):
        load_pretrained(get_config("tiny"))
    config = get_config("tiny")
    config.model.init_from = "/nonexistent/checkpoint"
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(config)
