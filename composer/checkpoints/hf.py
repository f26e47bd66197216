"""Import a Hugging Face checkpoint (config.json + safetensors shards) into composer's params, born sharded.

    cfg = model_config_from_hf(read_hf_config(directory), **runtime)
    params = import_params(directory, cfg, mesh, rules)

No torch: the shards are opened with `safetensors.safe_open(..., framework="np")`, which memory-maps the file
and reads only the slices asked for. Each leaf is created with `jax.make_array_from_callback` under the
NamedSharding the rules give it (composer.sharding.param_shardings), and the callback of a device reads just
that device's shard of the leaf: the layers and experts it holds, and the rows / columns of each stored
tensor that fall in its shard (composer/checkpoints/hf_layout.py). No host ever holds a whole leaf unless a
device does. Values are cast to cfg.param_dtype (bfloat16 checkpoints load exactly into float32 params).

Every tensor of the checkpoint must be used: a leftover tensor (a bias, a shared expert, a fused expert
layout) is an error naming it, never silently dropped.
"""

import contextlib
import json
import math
from pathlib import Path

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open

from composer import sharding
from composer.checkpoints import hf_layout
from composer.checkpoints.hf_config import UnsupportedConfig
from composer.model_config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(directory: str | Path) -> dict:
    """The checkpoint's config.json as a dict."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a Hugging Face checkpoint: no config.json")
    return json.loads(path.read_text())


def weight_files(directory: str | Path) -> dict[str, Path]:
    """{tensor name: shard file}, from model.safetensors.index.json, else from model*.safetensors."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: directory / file for name, file in weight_map.items()}
    files = sorted(directory.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{directory}: no model*.safetensors files (torch .bin checkpoints are not read)"
        )
    out = {}
    for file in files:
        with safe_open(str(file), framework="np") as f:
            out.update(dict.fromkeys(f.keys(), file))
    return out


class _Reader:
    """Open safetensors shards (memory-mapped), read by tensor name and slice."""

    def __init__(self, files: dict[str, Path], stack: contextlib.ExitStack):
        self.files = files
        self._stack = stack
        self._open: dict[Path, object] = {}

    def _handle(self, name: str):
        if name not in self.files:
            raise UnsupportedConfig(f"the checkpoint has no tensor {name!r}")
        file = self.files[name]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(safe_open(str(file), framework="np"))
        return self._open[file]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._handle(name).get_slice(name).get_dtype()

    def getter(self, name: str):
        sliced = self._handle(name).get_slice(name)
        return lambda index: sliced[index]


def _unit_slices(index: tuple, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """make_array_from_callback's index (slices, maybe open-ended) as explicit unit-step slices."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"unexpected strided shard index {index}")
        out.append(slice(start, stop))
    return tuple(out)


def _leaf_callback(tmap: hf_layout.TensorMap, reader: _Reader, dtype: np.dtype):
    """The make_array_from_callback callback of one leaf: reads one device's shard, slice by slice."""

    def shard(index) -> np.ndarray:
        idx = _unit_slices(index, tmap.shape)
        lead, inner = idx[: tmap.lead], idx[tmap.lead :]
        lead_shape = tuple(s.stop - s.start for s in lead)
        inner_shape = tuple(s.stop - s.start for s in inner)
        parts = []
        for offsets in np.ndindex(*lead_shape):  # one empty tuple when there are no lead axes
            pos = tuple(o + s.start for o, s in zip(offsets, lead))
            parts.append(tmap.read_part(reader.getter(tmap.hf_name(pos)), inner).astype(dtype))
        if not parts:
            return np.zeros(lead_shape + inner_shape, dtype)
        return np.stack(parts).reshape(lead_shape + inner_shape)

    return shard


def _check_names(maps: list[hf_layout.TensorMap], reader: _Reader, cfg: ModelConfig) -> None:
    """Every tensor the model needs is there with its shape; every tensor there is used."""
    needed = set()
    for tmap in maps:
        for _, name in tmap.hf_names():
            needed.add(name)
            shape = reader.shape(name)
            if shape != tmap.stored_shape:
                raise UnsupportedConfig(
                    f"tensor {name} has shape {list(shape)}, the config gives {list(tmap.stored_shape)}"
                )
    extra = sorted(set(reader.files) - needed)
    if cfg.tie_embeddings:
        extra = [n for n in extra if n != "lm_head.weight"]  # some tied checkpoints still store the table
    extra = [n for n in extra if not n.endswith(hf_layout.IGNORED_SUFFIXES)]
    if extra:
        shown = ", ".join(extra[:6]) + (f" and {len(extra) - 6} more" if len(extra) > 6 else "")
        raise UnsupportedConfig(f"the checkpoint has tensors composer's model has no place for: {shown}")


def import_params(
    directory: str | Path,
    cfg: ModelConfig,
    model_type: str,
    mesh: Mesh | None = None,
    rules: sharding.Rules = (),
) -> dict:
    """composer params (cfg.param_dtype) from the safetensors shards in `directory`.

    With `mesh`, each leaf gets the NamedSharding of composer.sharding.param_shardings(cfg, mesh, rules) and
    each device reads only its shard; without, every leaf is read whole onto the first device.
    """
    maps = hf_layout.tensor_maps(cfg, model_type)
    if mesh is not None:
        shardings = sharding.param_shardings(cfg, mesh, rules)
    dtype = np.dtype(cfg.param_jnp_dtype)
    params: dict = {}
    with contextlib.ExitStack() as stack:
        reader = _Reader(weight_files(directory), stack)
        _check_names(maps, reader, cfg)
        for tmap in maps:
            if mesh is None:
                leaf_sharding = SingleDeviceSharding(jax.devices()[0])
            else:
                leaf_sharding = hf_layout.get_leaf(shardings, tmap.path)
            value = jax.make_array_from_callback(
                tmap.shape, leaf_sharding, _leaf_callback(tmap, reader, dtype)
            )
            hf_layout.set_leaf(params, tmap.path, value)
    n = sum(math.prod(t.shape) for t in maps)
    where = f"mesh {dict(mesh.shape)}" if mesh is not None else "one device"
    logging.info("imported %s parameters (%s) from %s onto %s", f"{n:,}", cfg.param_dtype, directory, where)
    return params
