"""Sharding on 8 fake CPU devices: rules to specs, params born sharded, sharded forward == single device."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from composer import kv_cache, model, sharding
from composer.model_config import ModelConfig
from experiments.composer import DEFAULT_RULES

FORWARD = jax.jit(model.forward, static_argnums=3)

CFG = ModelConfig(n_layers=3, n_dense_layers=1, shared_expert_d_ff=32)
MESHES = {"data8": dict(data=-1), "fsdp2_expert4": dict(data=1, fsdp=2, expert=4)}


def _mesh_config(**sizes) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1, **sizes})


def test_logical_to_spec_rules():
    rules = DEFAULT_RULES
    assert sharding.logical_to_spec(("layers", "exp", "embed", "mlp"), rules) == PartitionSpec(
        None, "expert", "fsdp", "tensor"
    )
    # 'fsdp' is taken by 'batch', so 'embed' (also fsdp) stays replicated; unknown names replicate.
    assert sharding.logical_to_spec(("batch", "embed", "norm", None), rules) == PartitionSpec(
        ("data", "fsdp"), None, None, None
    )


def test_indivisible_dims_fall_back():
    mesh = sharding.make_mesh(_mesh_config(data=2, fsdp=4), jax.devices()[:8])
    rules = DEFAULT_RULES
    # batch 2 keeps only 'data' (2 divides 2, 2*4 does not); embed 6 is not divisible by fsdp=4.
    assert sharding.logical_to_spec(("batch", "seq"), rules, (2, 5), mesh) == PartitionSpec("data", None)
    # vocab -> tensor, of size 1 here: a size-1 axis splits nothing and is left out.
    assert sharding.logical_to_spec(("vocab", "embed"), rules, (10, 6), mesh) == PartitionSpec(None, None)
    assert sharding.logical_to_spec(("vocab", "embed"), rules, (10, 8), mesh) == PartitionSpec(None, "fsdp")
    assert sharding.logical_to_spec(("batch",), rules, (3,), mesh) == PartitionSpec(None)


def test_mesh_shape():
    assert sharding.mesh_shape(_mesh_config(data=-1, fsdp=2), 8) == (4, 2, 1, 1)
    with pytest.raises(ValueError, match="at most one"):
        sharding.mesh_shape(_mesh_config(data=-1, fsdp=-1), 8)
    with pytest.raises(ValueError, match="needs 4 devices"):
        sharding.mesh_shape(_mesh_config(data=2, fsdp=2), 8)
    mesh = sharding.make_mesh(_mesh_config(data=-1, expert=2))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "expert": 2, "tensor": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


@pytest.mark.slow  # ~12 s of CPU, mostly compiling init and forward for 8 devices
@pytest.mark.parametrize(
    "mesh_name,dispatch",
    [("data8", "capacity"), ("fsdp2_expert4", "capacity"), ("fsdp2_expert4", "ragged_dot")],
)
def test_sharded_init_and_forward_equal_single_device(mesh_name, dispatch):
    assert len(jax.devices()) == 8, "tests/conftest.py should give 8 fake CPU devices"
    cfg = dataclasses.replace(CFG, dispatch=dispatch, capacity_factor=CFG.n_experts / CFG.top_k)
    mesh = sharding.make_mesh(_mesh_config(**MESHES[mesh_name]))
    rules = DEFAULT_RULES
    key = jax.random.key(0)

    params = model.init(key, cfg)
    sharded = sharding.init_sharded(key, cfg, mesh, rules)
    # Same values (threefry is partitionable: random bits do not depend on the sharding), up to the
    # last bit of the float transforms, which XLA may fuse differently per sharding.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), sharded, params)
    shardings = sharding.param_shardings(cfg, mesh, rules)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, s: a.sharding == s, sharded, shardings)))

    w_up = sharded["moe_layers"]["moe"]["w_up"]  # [L, e, d, f]
    if mesh_name == "fsdp2_expert4":
        assert w_up.sharding.spec[1] == "expert" and w_up.sharding.spec[2] == "fsdp"
        assert w_up.addressable_shards[0].data.shape == (2, 1, 32, 64)  # [L, e/4, d/2, f]
    else:
        assert w_up.sharding.is_fully_replicated

    b, t = 8, 6
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, cfg.vocab_size)
    positions = jnp.where(jnp.arange(t)[None, :] < (jnp.arange(b) % t + 1)[:, None], jnp.arange(t), -1)
    batch = sharding.named_sharding(("batch", "seq"), (b, t), mesh, rules)
    fwd = jax.jit(model.forward, static_argnums=3, in_shardings=(shardings, batch, batch))
    logits_s, _, aux_s = fwd(sharded, tokens, positions, cfg)
    logits, _, aux = FORWARD(params, tokens, positions, cfg)
    np.testing.assert_allclose(logits_s, logits, atol=1e-5, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), aux_s, aux)


def test_sharded_cache_prefill_equals_single_device():
    cfg = dataclasses.replace(CFG, dispatch="ragged_dot")
    mesh = sharding.make_mesh(_mesh_config(**MESHES["fsdp2_expert4"]))
    rules = DEFAULT_RULES
    params = model.init(jax.random.key(0), cfg)
    b, t, s = 4, 5, 8
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, cfg.vocab_size)
    positions = jnp.where(jnp.arange(t)[None, :] < jnp.array([[5], [2], [4], [1]]), jnp.arange(t), -1)
    cache = kv_cache.init_cache(cfg, b, s)
    cache_sh = sharding.cache_shardings(cache, mesh, rules)
    assert cache_sh.k.spec == PartitionSpec(None, "fsdp", None, None, None)  # batch: (data, fsdp), data=1
    batch = NamedSharding(mesh, sharding.logical_to_spec(("batch", "seq"), rules, (b, t), mesh))
    fwd = jax.jit(
        model.forward,
        static_argnums=3,
        in_shardings=(sharding.param_shardings(cfg, mesh, rules), batch, batch, cache_sh),
        donate_argnums=4,
    )
    logits_s, cache_s, _ = fwd(
        sharding.init_sharded(jax.random.key(0), cfg, mesh, rules), tokens, positions, cfg, cache
    )
    logits, cache_1, _ = FORWARD(params, tokens, positions, cfg, kv_cache.init_cache(cfg, b, s))
    np.testing.assert_allclose(logits_s, logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(cache_s.k, cache_1.k, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(cache_s.lengths, [5, 2, 4, 1])
