"""From logical axes to device shardings: the mesh, the rules table, params born sharded.

Every weight declares its logical axes once (composer/params.py); the config's rules table
(config.mesh.rules: pairs (logical axis, mesh axis | tuple of mesh axes | None)) maps them to the mesh
axes ('data', 'fsdp', 'expert', 'tensor'). Changing the parallelism is a change of config only.

Two rules make any rules table valid for any shape:
- a mesh axis is used at most once per PartitionSpec: a dimension whose rule names a mesh axis already
  taken by an earlier dimension does not use it again;
- a dimension not divisible by the product of its mesh axes keeps the longest prefix of those axes whose
  product divides it (replicated when none does), so tiny test shapes work on any mesh.
"""

import math
from collections.abc import Mapping, Sequence

import jax
import ml_collections
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from composer import kv_cache, model, params
from composer.model_config import ModelConfig

MESH_AXES = ("data", "fsdp", "expert", "tensor")
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]


def mesh_shape(mesh_config: ml_collections.ConfigDict, n_devices: int) -> tuple[int, ...]:
    """The sizes of MESH_AXES from config.mesh, where one -1 takes the remaining devices."""
    sizes = [int(mesh_config[name]) for name in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1: {dict(zip(MESH_AXES, sizes))}")
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if n_devices % fixed:
            raise ValueError(
                f"{n_devices} devices do not divide into a mesh with fixed axes of product {fixed}"
            )
        sizes[sizes.index(-1)] = n_devices // fixed
    if math.prod(sizes) != n_devices:
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, have {n_devices}"
        )
    return tuple(sizes)


def make_mesh(mesh_config: ml_collections.ConfigDict, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The device mesh over ('data', 'fsdp', 'expert', 'tensor') described by config.mesh.

    Axis types are Auto (jax.make_mesh defaults to Explicit): the model code is written once, without
    shardings, and the compiler propagates the shardings of jit's inputs and outputs through it. Explicit
    axes would make shardings part of every array's type, so each einsum that contracts a sharded axis
    (e.g. 'embed' over fsdp) would need an explicit out_sharding in the model code.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_to_spec(
    axes: Sequence[str | None],
    rules: Rules,
    shape: Sequence[int] | None = None,
    mesh: Mesh | None = None,
) -> PartitionSpec:
    """The PartitionSpec of an array with logical `axes` under `rules`.

    A logical axis that is None or absent from the rules is replicated. With `shape` and `mesh`, mesh
    axes of size 1 are left out and a dimension keeps only the longest prefix of its mesh axes whose
    product divides its size.
    """
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for i, name in enumerate(axes):
        target = table.get(name) if name is not None else None
        mesh_axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
        mesh_axes = tuple(a for a in mesh_axes if a not in used)
        if shape is not None and mesh is not None:
            kept, product = [], 1
            for a in (a for a in mesh_axes if mesh.shape[a] > 1):  # size-1 axes split nothing
                if shape[i] % (product * mesh.shape[a]):
                    break
                product *= mesh.shape[a]
                kept.append(a)
            mesh_axes = tuple(kept)
        used.update(mesh_axes)
        spec.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def named_sharding(
    axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Rules
) -> NamedSharding:
    """The NamedSharding of one array (a weight, an activation, a batch) with logical `axes`."""
    return NamedSharding(mesh, logical_to_spec(axes, rules, shape, mesh))


def batch_shardings(batch: Mapping, mesh: Mesh, rules: Rules) -> dict:
    """Shardings of [m, b, ...] batch arrays (or their shapes): micro-batches on every device, rows split
    along 'batch'."""
    return {
        k: named_sharding((None, "batch") + (None,) * (len(v.shape) - 2), v.shape, mesh, rules)
        for k, v in batch.items()
    }


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules: Rules) -> dict:
    """A pytree of NamedSharding with the structure of the params, from the declarations table."""
    return jax.tree.map(
        lambda decl: named_sharding(decl.axes, decl.shape, mesh, rules), params.declarations(cfg)
    )


def init_sharded(key: jax.Array, cfg: ModelConfig, mesh: Mesh, rules: Rules) -> dict:
    """model.init, jitted with out_shardings, so each device only ever holds its own shards.

    Shapes come from jax.eval_shape (nothing allocated) and must match the declarations table.
    """
    shapes = jax.eval_shape(lambda k: model.init(k, cfg), key)
    shardings = param_shardings(cfg, mesh, rules)
    if jax.tree.structure(shapes) != jax.tree.structure(shardings):
        raise ValueError("the params of model.init do not match composer.params.declarations")
    return jax.jit(model.init, static_argnums=1, out_shardings=shardings)(key, cfg)


def cache_shardings(cache: kv_cache.KVCache, mesh: Mesh, rules: Rules) -> kv_cache.KVCache:
    """Shardings of a KV cache (or of its jax.eval_shape): k, v by CACHE_AXES, lengths by 'batch'."""
    kv = named_sharding(kv_cache.CACHE_AXES, cache.k.shape, mesh, rules)
    lengths = named_sharding(("batch",), cache.lengths.shape, mesh, rules)
    return kv_cache.KVCache(k=kv, v=kv, lengths=lengths)
