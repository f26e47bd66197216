"""SFT and RL steps under meshes mixing data, fsdp, expert and tensor equal the single-device steps."""

import dataclasses
import math

import jax
import numpy as np
import pytest
from step_batches import random_batch

from composer import distributed, model, sharding, train
from experiments import composer as composer_config

# capacity_factor = n_experts / top_k: no token is dropped, so expert-parallel capacity dispatch and the
# single-device capacity dispatch compute the same function.
CFG = model.ModelConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=32, capacity_factor=2.0
)
MESHES = [{"data": 2, "fsdp": 2, "expert": 2}, {"fsdp": 2, "expert": 2, "tensor": 2}]
STEPS = {"sft": (train.sft_step, {}), "rl": (train.rl_step, {"hp": train.RLHParams()})}


def _batch(key, m, b, t, rl=False):
    return random_batch(key, m, b, t, vocab_size=CFG.vocab_size, rl=rl)


def _run(kind: str, sizes: dict, dispatch: str):
    """One jitted step (train.jit_step) on a mesh of `sizes`; returns (state, metrics)."""
    config = composer_config.get_config("tiny")
    for axis in sharding.MESH_AXES:
        config.mesh[axis] = sizes.get(axis, 1)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[: math.prod(sizes.values())])
    rules = tuple(config.mesh.rules)
    cfg = dataclasses.replace(CFG, dispatch=dispatch)
    optimizer = train.make_optimizer(config.optim, 1e-2, 10)
    step_fn, static = STEPS[kind]
    batch = _batch(jax.random.key(4), 2, 8, 16, rl=kind == "rl")
    # The expert-parallel dispatch finds the mesh in context when the step is traced.
    with jax.set_mesh(mesh):
        params = sharding.init_sharded(jax.random.key(0), cfg, mesh, rules)
        state = distributed.init_state(params, optimizer, mesh)
        step = train.jit_step(step_fn, state, batch, mesh, rules, cfg=cfg, optimizer=optimizer, **static)
        state, metrics = step(state, batch, jax.random.key(0))
    return state, metrics


def _spec(leaf) -> tuple:
    """The leaf's PartitionSpec as a tuple without trailing Nones (P(a, None) and P(a) are one layout)."""
    spec = tuple(leaf.sharding.spec)
    while spec and spec[-1] is None:
        spec = spec[:-1]
    return spec


def _leaf(tree, *keys):
    """Leaves of `tree` whose path ends with the dict keys `keys` (e.g. params and Adam's mu / nu)."""
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = tuple(getattr(k, "key", None) for k in path[-len(keys) :])
        if names == keys:
            found.append(leaf)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_sharded_step_equals_single_device(kind):
    ref_state, ref_metrics = _run(kind, {"data": 1}, "capacity")
    ref_params = jax.device_get(ref_state.params)
    # The step moved the weights (by about the learning rate): comparing params is not comparing inits.
    init = jax.device_get(model.init(jax.random.key(0), dataclasses.replace(CFG, dispatch="capacity")))
    pairs = zip(jax.tree.leaves(ref_params), jax.tree.leaves(init), strict=True)
    assert max(float(np.abs(a - b).max()) for a, b in pairs) > 1e-3
    for sizes in MESHES:
        state, metrics = _run(kind, sizes, "ep_capacity")
        for name in ("loss", "grad_norm", "load_balance_loss"):
            np.testing.assert_allclose(metrics[name], ref_metrics[name], rtol=2e-5, err_msg=f"{sizes} {name}")
        flat_ref = jax.tree.leaves(ref_params)
        # Adam's first step moves each weight by about the learning rate (1.7e-3 here) times sign(grad); where
        # a gradient is near zero, f32 summation-order noise changes that step by a few 1e-6. A wrong
        # sharding changes steps by their whole size, so 3e-5 (2% of a step) still catches it.
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(state.params)[0], flat_ref, strict=True):
            np.testing.assert_allclose(
                a, b, rtol=1e-4, atol=3e-5, err_msg=f"{sizes} {jax.tree_util.keystr(path)}"
            )

        # No silent replication: expert weights and their Adam moments stay split over 'expert' (and
        # 'fsdp' / 'tensor' where the mesh has them), exactly as the rules table places them.
        expected = (None, "expert", "fsdp", "tensor") if "tensor" in sizes else (None, "expert", "fsdp")
        w_gate = _leaf(state.params, "moe_layers", "moe", "w_gate")
        moments = _leaf(state.opt_state, "moe_layers", "moe", "w_gate")
        assert len(w_gate) == 1 and len(moments) == 2  # mu and nu
        for leaf in w_gate + moments:
            assert _spec(leaf) == expected, (sizes, leaf.sharding.spec)
            n_devices = math.prod(sizes.values())
            assert leaf.addressable_shards[0].data.size * (n_devices // sizes.get("data", 1)) == leaf.size
        embed = _leaf(state.params, "embed")[0]
        assert _spec(embed) == ("tensor" if "tensor" in sizes else None, "fsdp")
