"""Hugging Face checkpoints in and out: import (born sharded), export, config.json and tokenizer mapping."""

from composer.checkpoints.hf import import_params, read_hf_config
from composer.checkpoints.hf_config import (
    UnsupportedConfig,
    hf_config_from_model_config,
    model_config_from_hf,
)
from composer.checkpoints.hf_export import export_checkpoint
from composer.checkpoints.hf_tokenizer import load_tokenizer
from composer.checkpoints.pretrained import load_pretrained, pretrained_model_config, pretrained_tokenizer

__all__ = [
    "UnsupportedConfig",
    "export_checkpoint",
    "hf_config_from_model_config",
    "import_params",
    "load_pretrained",
    "load_tokenizer",
    "model_config_from_hf",
    "pretrained_model_config",
    "pretrained_tokenizer",
    "read_hf_config",
]
