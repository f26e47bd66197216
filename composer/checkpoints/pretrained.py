"""Start from a pretrained checkpoint: config.model.init_from names a local Hugging Face checkpoint directory.

    params, cfg, tokenizer = load_pretrained(config)          # params born sharded on config.mesh

The architecture comes from the checkpoint's config.json (config.model / config.moe's architecture keys are
ignored, with a log line for each that differs); how the model runs (dtypes, kernels, expert dispatch, loss
coefficients, max_seq_len) comes from the experiment config. The tokenizer is the checkpoint's, so the
pipeline must not train one.
"""

from pathlib import Path

import ml_collections
from absl import logging
from jax.sharding import Mesh

from composer import sharding
from composer.checkpoints import hf, hf_config, hf_tokenizer
from composer.model_config import ModelConfig
from env.tokenizer import Tokenizer


def pretrained_model_config(
    config: ml_collections.ConfigDict, backend: str | None = None
) -> tuple[ModelConfig, dict]:
    """(ModelConfig, config.json dict) of the checkpoint at config.model.init_from, with the experiment
    config's runtime fields (hf_config.RUNTIME_FIELDS; 'auto' kernels as on `backend`, default JAX's)."""
    directory = Path(config.model.init_from)
    hf_json = hf.read_hf_config(directory)
    requested = ModelConfig.from_config(config, backend)
    runtime = {field: getattr(requested, field) for field in hf_config.RUNTIME_FIELDS}
    cfg = hf_config.model_config_from_hf(hf_json, **runtime)
    for field, (ours, theirs) in hf_config.architecture_differences(requested, cfg).items():
        logging.info(
            "init_from: %s = %r from the checkpoint (the experiment config says %r)", field, theirs, ours
        )
    return cfg, hf_json


def pretrained_tokenizer(config: ml_collections.ConfigDict) -> Tokenizer:
    """The tokenizer of the checkpoint at config.model.init_from (reads no weights), for the DATA phase."""
    cfg, _ = pretrained_model_config(config)
    return hf_tokenizer.load_tokenizer(config.model.init_from, cfg.vocab_size, config.model.chat_template)


def load_pretrained(
    config: ml_collections.ConfigDict, mesh: Mesh | None = None
) -> tuple[dict, ModelConfig, Tokenizer]:
    """(params, ModelConfig, Tokenizer) of the checkpoint at config.model.init_from.

    The params are created sharded on `mesh` (default: composer.sharding.make_mesh(config.mesh)) under
    config.mesh.rules, each device reading only its shard of the safetensors files.
    """
    if not config.model.init_from:
        raise ValueError("config.model.init_from is empty: there is no checkpoint to load")
    directory = Path(config.model.init_from)
    cfg, hf_json = pretrained_model_config(config)
    if mesh is None:
        mesh = sharding.make_mesh(config.mesh)
    params = hf.import_params(directory, cfg, hf_json["model_type"], mesh, tuple(config.mesh.rules))
    tokenizer = hf_tokenizer.load_tokenizer(directory, cfg.vocab_size, config.model.chat_template)
    logging.info(
        "init_from %s: %s, vocab %d (tokenizer %d)",
        directory,
        hf_json["model_type"],
        cfg.vocab_size,
        tokenizer.vocab_size,
    )
    return params, cfg, tokenizer
