"""Expert parallelism on 8 fake CPU devices: the MoE layer under shard_map equals the single-device layer."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from composer import expert_parallel, model, moe, params, sharding
from composer.model_config import ModelConfig
from experiments import composer as composer_config

# capacity_factor = n_experts / top_k gives every expert m slots: nothing is ever dropped, so the dense
# capacity path and the dropless path compute the same function.
CFG = ModelConfig(d_model=32, d_ff=32, n_experts=8, top_k=2, capacity_factor=4.0)
RULES = composer_config.DEFAULT_RULES
MESHES = [
    {"expert": 8},
    {"data": 2, "expert": 4},
    {"fsdp": 2, "expert": 2, "tensor": 2},
]
# Token count 2 * 11 = 22 is not a multiple of 8 shards: the padding path is exercised too.
B, T = 2, 11
LENGTHS = (11, 7)


def _mesh(**sizes) -> jax.sharding.Mesh:
    config = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "expert": 1, "tensor": 1})
    config.update(sizes)
    n = math.prod(sizes.values())
    return sharding.make_mesh(config, jax.devices()[:n])


@functools.cache
def _params() -> dict:
    return jax.tree.map(lambda w: w[0], model.init(jax.random.key(0), CFG)["moe_layers"]["moe"])


def _place(p: dict, mesh: jax.sharding.Mesh) -> dict:
    """The layer's weights sharded by the rules table, as the learner places them."""
    decls = params.declarations(CFG)["moe_layers"]["moe"]
    return jax.tree.map(
        lambda w, decl: jax.device_put(w, sharding.named_sharding(decl.axes[1:], w.shape, mesh, RULES)),
        p,
        decls,
    )


def _inputs():
    x_btd = jax.random.normal(jax.random.key(1), (B, T, CFG.d_model), jnp.float32)
    valid_bt = jnp.arange(T)[None, :] < jnp.array(LENGTHS)[:, None]
    return x_btd, valid_bt


def _loss(p, x_btd, valid_bt, cfg):
    y_btd, aux = moe.moe_layer(p, x_btd, valid_bt, cfg)
    # A non-linear readout, so the gradient depends on every output value.
    return jnp.sum(jnp.sin(y_btd) * valid_bt[..., None]), (y_btd, aux)


VALUE_AND_GRAD = jax.jit(jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True), static_argnames="cfg")


@pytest.fixture(autouse=True)
def _gathered_ragged(monkeypatch):
    # XLA:CPU has no ragged-all-to-all: the dropless path is tested with the all_gather exchange.
    impl = functools.partial(expert_parallel.experts_ep_ragged, exchange="gathered")
    monkeypatch.setitem(moe.DISPATCH_IMPLS, "ep_ragged_gathered", impl)


@pytest.mark.parametrize("sizes", MESHES, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
@pytest.mark.parametrize(
    "dispatch, reference", [("ep_capacity", "capacity"), ("ep_ragged_gathered", "ragged_dot")]
)
def test_expert_parallel_equals_single_device(sizes, dispatch, reference):
    x_btd, valid_bt = _inputs()
    (_, (y_ref, aux_ref)), grads_ref = VALUE_AND_GRAD(
        _params(), x_btd, valid_bt, cfg=dataclasses.replace(CFG, dispatch=reference)
    )
    mesh = _mesh(**sizes)
    with jax.set_mesh(mesh):
        (_, (y, aux)), grads = VALUE_AND_GRAD(
            _place(_params(), mesh), x_btd, valid_bt, cfg=dataclasses.replace(CFG, dispatch=dispatch)
        )
    np.testing.assert_allclose(y, y_ref, atol=2e-5, rtol=1e-5)
    for key in aux_ref:
        np.testing.assert_allclose(aux[key], aux_ref[key], atol=1e-6, rtol=1e-5)
    flat_ref = jax.tree.leaves(grads_ref)
    for (path, g), g_ref in zip(jax.tree_util.tree_flatten_with_path(grads)[0], flat_ref, strict=True):
        np.testing.assert_allclose(g, g_ref, atol=2e-5, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
    # Padding tokens get no routed output on any path.
    assert float(jnp.abs(y[1, LENGTHS[1] :]).max()) == 0.0


def test_expert_parallel_runs_an_all_to_all_over_the_expert_axis():
    """The EP dispatch really exchanges tokens (not a silent fallback to the replicated layer)."""
    x_btd, valid_bt = _inputs()
    cfg = dataclasses.replace(CFG, dispatch="ep_capacity")
    with jax.set_mesh(_mesh(data=2, expert=4)):
        text = jax.jit(moe.moe_layer, static_argnums=3).lower(_params(), x_btd, valid_bt, cfg).as_text()
    assert text.count("all_to_all") >= 2  # dispatch and return


def test_capacity_drops_are_counted_per_source_device():
    """With a small capacity factor, each (token shard, expert) pair keeps ceil(cf m_local k / e) slots."""
    cfg = dataclasses.replace(CFG, capacity_factor=0.5, dispatch="ep_capacity")
    x_btd, valid_bt = _inputs()
    mesh = _mesh(data=2, expert=4)
    with jax.set_mesh(mesh):
        _, aux = jax.jit(moe.moe_layer, static_argnums=3)(_place(_params(), mesh), x_btd, valid_bt, cfg)

    # Independent count: tokens padded to 24 and split in 8 contiguous shards of 3 (data-major order).
    expert_mk, _, _ = moe.route(x_btd.reshape(-1, CFG.d_model), _params()["router"], CFG.top_k, True)
    valid_m = np.asarray(valid_bt).reshape(-1)
    n_shards, m = 8, B * T
    m_local = math.ceil(m / n_shards)
    cap = moe.capacity(m_local, cfg)
    dropped = real = 0
    for s in range(n_shards):
        rows = [i for i in range(s * m_local, min((s + 1) * m_local, m)) if valid_m[i]]
        counts = np.bincount(np.asarray(expert_mk)[rows].reshape(-1), minlength=CFG.n_experts)
        dropped += np.maximum(counts - cap, 0).sum()
        real += len(rows) * CFG.top_k
    assert dropped > 0
    np.testing.assert_allclose(aux["dropped_fraction"], dropped / real, rtol=1e-6)


def test_gathered_exchange_matches_ragged_all_to_all_semantics():
    """Device s sends rows [in_off[r], + size[r]) to r, landing at out_off[r] in r's buffer."""
    mesh = _mesh(expert=4)
    ep, n, d = 4, 6, 2
    rng = np.random.default_rng(0)
    size_sr = rng.integers(0, 3, (ep, ep))
    in_off = np.cumsum(size_sr, 1) - size_sr
    out_off = np.cumsum(size_sr, 0) - size_sr
    operand = rng.normal(size=(ep, n, d)).astype(np.float32)

    def body(x, i, s, o):
        out = jnp.full((ep * n, d), -1.0)
        return expert_parallel.ragged_all_to_all_gathered(
            x[0], out, i[0], s[0], o[0], None, axis_name="expert"
        )[None]

    spec = jax.sharding.PartitionSpec("expert")
    got = jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec)(
        operand, jnp.asarray(in_off), jnp.asarray(size_sr), jnp.asarray(out_off)
    )
    want = np.full((ep, ep * n, d), -1.0, np.float32)
    for s in range(ep):
        for r in range(ep):
            rows = operand[s, in_off[s, r] : in_off[s, r] + size_sr[s, r]]
            want[r, out_off[s, r] : out_off[s, r] + size_sr[s, r]] = rows
    np.testing.assert_array_equal(got, want)


def test_native_ragged_path_lowers_for_gpu():
    """The ragged_all_to_all path cannot run on XLA:CPU; its forward and backward must lower for CUDA."""
    x_btd, valid_bt = _inputs()
    cfg = dataclasses.replace(CFG, dispatch="ep_ragged_dot")
    grad = jax.jit(jax.grad(lambda p, x: _loss(p, x, valid_bt, cfg)[0]))
    with jax.set_mesh(_mesh(data=2, expert=4)):
        lowered = grad.trace(_params(), x_btd).lower(lowering_platforms=("cuda",))
    assert lowered.as_text().count("ragged_all_to_all") >= 2


def test_without_expert_axis_the_ep_dispatch_is_the_single_device_one():
    x_btd, valid_bt = _inputs()
    y_ref, _ = jax.jit(moe.moe_layer, static_argnums=3)(_params(), x_btd, valid_bt, CFG)
    y, _ = jax.jit(moe.moe_layer, static_argnums=3)(
        _params(), x_btd, valid_bt, dataclasses.replace(CFG, dispatch="ep_capacity")
    )
    np.testing.assert_array_equal(y, y_ref)


def test_experts_must_divide_over_the_expert_axis():
    cfg = dataclasses.replace(CFG, n_experts=6, top_k=2, dispatch="ep_capacity")
    p = jax.tree.map(lambda w: w[0], model.init(jax.random.key(0), cfg)["moe_layers"]["moe"])
    x_btd, valid_bt = _inputs()
    with jax.set_mesh(_mesh(expert=4, data=2)), pytest.raises(ValueError, match="multiple of the expert"):
        moe.moe_layer(p, x_btd, valid_bt, cfg)
