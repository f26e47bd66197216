"""Export composer params as a Hugging Face checkpoint: safetensors shards, the index, config.json, tokenizer.

    export_checkpoint(params, cfg, out_dir, "qwen3_moe", base_config=hf_config, tokenizer=tok,
                      files_from=source_dir, max_shard_bytes=5 << 30)

The names and layouts are those transformers writes (one tensor per expert, torch [out, in]), so
transformers, vLLM and SGLang load the result; composer's import reads it back bit-exactly. Tensors are
fetched from the devices one layer of one leaf at a time and written shard by shard, so the host holds at most
one shard plus one layer of one leaf. With several processes, every process takes part in the gathers and
process 0 writes.
"""

import json
import math
import shutil
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import safetensors.numpy
from absl import logging
from jax.experimental import multihost_utils

from composer.checkpoints import hf_config, hf_layout
from composer.checkpoints.hf import INDEX_FILE
from composer.checkpoints.hf_tokenizer import chat_template
from composer.model_config import ModelConfig
from env import chat
from env.tokenizer import Tokenizer

# Files of a checkpoint directory that describe the tokenizer and generation, copied along by `files_from`.
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _host(x: jax.Array) -> np.ndarray:
    """A (small) device array on the host, gathered across processes when this one does not hold it all."""
    if x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _plan(
    maps: list[hf_layout.TensorMap], itemsize: int, max_shard_bytes: int
) -> list[list[tuple[hf_layout.TensorMap, tuple[int, ...], str]]]:
    """The tensors (map, lead index, name) of each shard, in order; a shard closes before it would exceed
    max_shard_bytes (a tensor larger than that gets a shard of its own)."""
    shards: list[list] = [[]]
    size = 0
    for tmap in maps:
        nbytes = math.prod(tmap.stored_shape) * itemsize
        for idx, name in tmap.hf_names():
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append((tmap, idx, name))
            size += nbytes
    return shards


def shard_file_names(n: int) -> list[str]:
    """transformers' names: model.safetensors alone, else model-00001-of-0000n.safetensors, ..."""
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def export_checkpoint(
    params: dict,
    cfg: ModelConfig,
    out_dir: str | Path,
    model_type: str,
    *,
    base_config: dict | None = None,
    dtype: str | None = None,
    max_shard_bytes: int = 5 << 30,
    tokenizer: Tokenizer | None = None,
    files_from: str | Path | None = None,
) -> list[Path]:
    """Writes `params` as a `model_type` checkpoint into `out_dir`; returns the safetensors files written.

    base_config: the config.json to keep the fields composer does not model from (token ids, ...).
    dtype: 'float32' | 'bfloat16' (default cfg.param_dtype; the round trip is exact in the params' dtype).
    tokenizer: saved as tokenizer.json (with any chat tokens composer added at import).
    files_from: a checkpoint directory whose tokenizer / generation files (TOKENIZER_FILES, and
    tokenizer.json when `tokenizer` is None) are copied.
    """
    out = Path(out_dir)
    dtype = dtype or cfg.param_dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {tuple(_DTYPES)}")
    np_dtype = _DTYPES[dtype]
    config = hf_config.hf_config_from_model_config(cfg, model_type, base_config)
    config["dtype"] = config["torch_dtype"] = dtype
    maps = hf_layout.tensor_maps(cfg, model_type)
    for tmap in maps:
        leaf = hf_layout.get_leaf(params, tmap.path)
        if tuple(leaf.shape) != tmap.shape:
            raise ValueError(f"params{list(tmap.path)} has shape {leaf.shape}, cfg gives {tmap.shape}")
    shards = _plan(maps, np_dtype.itemsize, max_shard_bytes)
    names = shard_file_names(len(shards))
    writer = jax.process_index() == 0
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        # Shards of an earlier export into the same directory would be read as part of this checkpoint.
        for stale in [*out.glob("model*.safetensors"), out / INDEX_FILE]:
            stale.unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    cached: tuple = (None, None)  # ((leaf path, layer), host array of that layer)
    written = []
    for file, shard in zip(names, shards):
        tensors = {}
        for tmap, idx, name in shard:
            leaf = hf_layout.get_leaf(params, tmap.path)
            key = (tmap.path, idx[:1])
            if cached[0] != key:  # one device fetch per layer of a leaf (per leaf when unstacked)
                cached = (key, _host(leaf[idx[0]] if tmap.lead else leaf))
            inner = cached[1][idx[1:]] if tmap.lead else cached[1]
            tensors[name] = np.ascontiguousarray(tmap.to_hf(np.asarray(inner)).astype(np_dtype))
            weight_map[name] = file
            total += tensors[name].nbytes
        if writer:
            safetensors.numpy.save_file(tensors, str(out / file), metadata={"format": "pt"})
        written.append(out / file)
    if writer:
        if len(names) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_tokenizer(out, tokenizer, files_from)
    logging.info(
        "exported %d tensors (%s, %.1f MB) in %d shard(s) to %s",
        len(weight_map),
        dtype,
        total / 1e6,
        len(names),
        out,
    )
    return written


def _write_tokenizer(out: Path, tokenizer: Tokenizer | None, files_from: str | Path | None) -> None:
    if tokenizer is not None:
        tokenizer.save(out / "tokenizer.json")
    if files_from is not None:
        source = Path(files_from)
        names = TOKENIZER_FILES if tokenizer is not None else ("tokenizer.json", *TOKENIZER_FILES)
        for name in names:
            if (source / name).is_file() and (source / name).resolve() != (out / name).resolve():
                shutil.copyfile(source / name, out / name)
    if tokenizer is None or chat_template(out) is not None:
        return
    # The chat format the model was trained in, as a template: transformers and vLLM prompt it as composer
    # did (composer's own format for a model trained from scratch, else the checkpoint's it came from).
    (out / "chat_template.jinja").write_text(tokenizer.chat_format.source)
    if not (out / "tokenizer_config.json").exists():
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": chat.IM_END,
            "pad_token": chat.PAD,
            "clean_up_tokenization_spaces": False,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
