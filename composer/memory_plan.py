"""The memory plan (`--mode=plan`): a config's memory per device, without weights and without an accelerator.

    python launch.py --config=experiments/composer.py:gpu --mode=plan [--config.plan.device=h200]

The parts of the RL phase, its peak (SFT's learner is planned too; the larger phase is the run's peak):

    params, master, optimizer   shapes and shardings of the train state: bf16 params carry an f32 master
                                copy (composer/train.py), AdamW's two moments are f32 beside it;
    gradients, activations,     the compiled train step's temporaries (XLA's memory analysis of the real
    optimizer update            step, jitted on the config's mesh, at full size, on abstract inputs): the
                                f32 gradient accumulator; the backward pass of one micro-batch alone (its
                                activations, and its gradient before it joins the sum); what the update
                                adds beyond those;
    sampler weights             the sampler's copy of the params (its unstacked layout, sharded like them);
    kv cache                    decode slots x (env.max_episode_tokens + sampling.max_turn_tokens) on one
                                device (the sampler's), slots bounded by sampling.kv_cache_gib;
    eval sampler                the held-out curve's sampler during RL: its cache (the weights are the RL
                                sampler's);
    reference                   the KL term's frozen model (rl.kl_coef > 0).

The step compiles for XLA:CPU over fake CPU devices standing in for the mesh. On a GPU or TPU the kernels
that XLA:CPU cannot lower as they run there are planned by their memory twins (composer/memory_twins.py):
the flash attention kernel ('pallas') and the grouped matmul of the dropless dispatch. Fusion differs
between backends, so the activations are an estimate: docs/scaling.md compares it with a measured peak.
"""

import dataclasses
import functools
import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from composer import copy_head, distributed, model, sharding, train
from composer.batching import bucket_length
from composer.sampler_device import cache_bytes_per_slot

GIB = 2**30
# Device kind -> (memory in bytes as its vendor states it, backend its kernels are chosen for).
DEVICES = {
    "a100": (80e9, "gpu"),
    "h100": (80e9, "gpu"),
    "h200": (141e9, "gpu"),
    "b200": (180e9, "gpu"),
    "tpu-v5e": (16e9, "tpu"),
    "tpu-v5p": (95e9, "tpu"),
    "tpu-v6e": (32e9, "tpu"),
}
# Dispatches that run a grouped matmul on an accelerator (planned by its twin there).
_GROUPED = ("ragged_dot", "gmm", "gmm_fp8", "ep_ragged_dot")


def mesh_devices(mesh_config: ml_collections.ConfigDict) -> int:
    """Devices the config's mesh names (an axis of -1, 'the rest', counts 1)."""
    return math.prod(max(int(mesh_config[axis]), 1) for axis in sharding.MESH_AXES)


def use_cpu_devices(n: int) -> None:
    """Plans compile for XLA:CPU over `n` fake devices: set before JAX starts its backend."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    jax.config.update("jax_platforms", "cpu")


def model_config(config: ml_collections.ConfigDict, backend: str) -> model.ModelConfig:
    """The run's model config as on `backend` (init_from: the checkpoint's config.json, no weights)."""
    if config.model.init_from:
        from composer.checkpoints.pretrained import pretrained_model_config

        return pretrained_model_config(config, backend)[0]
    return model.ModelConfig.from_config(config, backend)


def with_twins(cfg: model.ModelConfig, backend: str) -> model.ModelConfig:
    """`cfg` with the kernels XLA:CPU cannot plan replaced by their memory twins (module docstring)."""
    changes = {}
    if cfg.attention_impl == "pallas":
        changes["attention_impl"] = "twin"
    if cfg.dispatch in _GROUPED and backend != "cpu":
        changes["dispatch"] = "twin"
    return dataclasses.replace(cfg, **changes)


def _bytes(tree) -> int:
    """Bytes per device of a pytree of ShapeDtypeStructs with shardings (the largest shard of each)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
    return total


def _with(shapes, shardings):
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """One update's batch: m micro-batches of b rows of t tokens."""

    m: int
    b: int
    t: int


def step_shape(
    config: ml_collections.ConfigDict, sequences: int, length: int, batch_devices: int
) -> StepShape:
    """The [m, b, t] of an update on `sequences` of `length` tokens, split as learner.pack splits them
    (optim.micro_batches, micro_batch_rows, micro_batch_tokens), rows a multiple of the batch axis."""
    optim = config.optim
    t = bucket_length(length, max_len=config.model.max_seq_len)
    b = max(sequences // optim.micro_batches, 1)
    if optim.micro_batch_rows > 0:
        b = min(b, optim.micro_batch_rows)
    if optim.micro_batch_tokens > 0:
        b = min(b, max(optim.micro_batch_tokens // t, 1))
    b = -(-b // batch_devices) * batch_devices
    return StepShape(-(-sequences // b), b, t)


def _batch(shape: StepShape, fields: dict[str, tuple[str, object]]) -> dict:
    """Abstract [m, b(, t)] arrays: fields maps name -> ('bt' | 'b', dtype)."""
    dims = {"bt": (shape.m, shape.b, shape.t), "b": (shape.m, shape.b)}
    return {k: jax.ShapeDtypeStruct(dims[kind], dtype) for k, (kind, dtype) in fields.items()}


_TOKENS = {"tokens": ("bt", jnp.int32), "positions": ("bt", jnp.int32), "loss_mask": ("bt", jnp.float32)}


def _rl_fields(config: ml_collections.ConfigDict) -> dict:
    rl = config.rl
    fields = dict(_TOKENS, sampler_logprobs=("bt", jnp.float32), truncated=("b", jnp.bool_))
    fields.update(rewards=("b", jnp.float32), off_policy=("b", jnp.float32))
    fields["advantages"] = ("bt", jnp.float32) if rl.algorithm == "gae" else ("b", jnp.float32)
    if rl.algorithm == "gae":
        fields.update(returns=("bt", jnp.float32), old_values=("bt", jnp.float32))
    if rl.epochs * rl.minibatches > 1:
        fields["old_logprobs"] = ("bt", jnp.float32)
    if rl.kl_coef > 0:
        fields["ref_logprobs"] = ("bt", jnp.float32)
    return fields


def rl_sequences(config: ml_collections.ConfigDict) -> int:
    """Sequences of one RL update: the step's episodes (and guide members), over rl.minibatches."""
    rl = config.rl
    episodes = rl.tasks_per_step * (rl.group_size + (1 if rl.expert_guidance else 0))
    return -(-episodes // rl.minibatches)


def compiled_backward(loss_fn, params, batch: dict, mesh, rules, *, cfg, hp, line_tokens):
    """XLA's compiled gradient accumulation alone (the step without its optimizer update): its
    temporaries are the activations of one micro-batch (the accumulated grads are its output)."""
    fn = functools.partial(train.accumulate_grads, loss_fn, cfg=cfg, hp=hp, line_tokens=line_tokens)
    param_sh = jax.tree.map(lambda p: p.sharding, params)
    with jax.set_mesh(mesh):
        jitted = jax.jit(
            fn,
            in_shardings=(param_sh, sharding.batch_shardings(batch, mesh, rules)),
            out_shardings=(param_sh, None),
        )
        return jitted.lower(params, batch).compile()


def compiled_step(step_fn, state, batch: dict, mesh, rules, **static):
    """XLA's compiled train step on abstract state and batch (nothing allocated, nothing run)."""
    key = jax.eval_shape(lambda: jax.random.key(0))
    with jax.set_mesh(mesh):
        jitted = train.jit_step(step_fn, state, batch, mesh, rules, **static)
        return jitted.lower(state, batch, key).compile()


def plan(config: ml_collections.ConfigDict) -> dict:
    """The plan's parts in bytes per device, its peak and whether it fits config.plan.device."""
    from composer.pipeline import rollouts

    if config.plan.device not in DEVICES:
        raise ValueError(f"plan.device {config.plan.device!r} is not one of {sorted(DEVICES)}")
    device_bytes, backend = DEVICES[config.plan.device]
    cfg = model_config(config, backend)
    rl = config.rl
    if rl.algorithm == "gae":
        cfg = dataclasses.replace(cfg, value_head=True)
    planned = with_twins(cfg, backend)
    n_devices = mesh_devices(config.mesh)
    if jax.device_count() < n_devices:
        raise RuntimeError(
            f"the mesh needs {n_devices} devices, JAX has {jax.device_count()}: plan with launch.py"
        )
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:n_devices])
    rules = tuple(config.mesh.rules)
    params = _with(
        jax.eval_shape(lambda: model.init(jax.random.key(0), cfg)), sharding.param_shardings(cfg, mesh, rules)
    )
    optimizer = train.make_optimizer(config.optim, rl.learning_rate, max(rl.steps, 1))
    shapes = jax.eval_shape(lambda p: train.init_state(p, optimizer), params)
    state = _with(shapes, distributed.state_shardings(params, optimizer, mesh))
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    length = config.env.max_episode_tokens
    rl_shape = step_shape(config, rl_sequences(config), length, batch_devices)
    sft_shape = step_shape(config, config.sft.batch_size, length, batch_devices)
    if rl.algorithm == "gae":
        rl_fn, rl_loss, hp = train.ppo_step, train.ppo_loss, train.PPOHParams.from_config(config)
    else:
        rl_fn, rl_loss, hp = train.rl_step, train.rl_loss, train.RLHParams.from_config(config)
    logging.info("plan: compiling the RL step %s and the SFT step %s", rl_shape, sft_shape)
    # The copy head's line keys take the chat template's token ids; any ids have the same memory.
    line_tokens = copy_head.LineTokens(1, 2, 3, (4,)) if copy_head.uses_line_keys(cfg) else None
    static = dict(cfg=planned, optimizer=optimizer, line_tokens=line_tokens)
    rl_batch = _batch(rl_shape, _rl_fields(config))
    rl_temp = (
        compiled_step(rl_fn, state, rl_batch, mesh, rules, hp=hp, **static)
        .memory_analysis()
        .temp_size_in_bytes
    )
    backward = compiled_backward(
        rl_loss, params, rl_batch, mesh, rules, cfg=planned, hp=hp, line_tokens=line_tokens
    )
    activations = backward.memory_analysis().temp_size_in_bytes
    sft_temp = 0  # a run without SFT (sft.steps 0) has no SFT phase to plan
    if config.sft.steps > 0:
        sft_step = compiled_step(train.sft_step, state, _batch(sft_shape, _TOKENS), mesh, rules, **static)
        sft_temp = sft_step.memory_analysis().temp_size_in_bytes
    gradients = _bytes(
        jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.float32, sharding=p.sharding), params)
    )
    weights = _bytes(params)
    slots = rollouts.decode_slots(config, cfg)
    kv = slots * cache_bytes_per_slot(cfg, rollouts.max_len(config))
    curve = config.eval.every_steps > 0 and config.eval.curve_tasks > 0
    parts = {
        "params": weights,
        "master": _bytes(state.master) if state.master is not None else 0,
        "optimizer": _bytes(state.opt_state),
        "gradients": gradients,
        "activations": activations,
        # What the optimizer update adds to the step's peak beyond the backward pass and the gradients.
        "optimizer_update": max(rl_temp - gradients - activations, 0),
        "sampler_weights": weights,
        "kv_cache": kv,
        "eval_sampler": kv if curve else 0,  # its own cache; the RL sampler's weights (rl.py)
        "reference": weights if rl.kl_coef > 0 else 0,
    }
    state_bytes = parts["params"] + parts["master"] + parts["optimizer"]
    rl_phase = sum(parts.values())
    sft_phase = state_bytes + sft_temp
    peak = max(rl_phase, sft_phase)
    return {
        "device": config.plan.device,
        "device_gib": device_bytes / GIB,
        "per_device_gib": peak / GIB,
        "fits": peak <= device_bytes,
        "spare": 1 - peak / device_bytes,
        "mesh": dict(mesh.shape),
        "parts": {k: v / GIB for k, v in parts.items()},
        "sft_phase_gib": sft_phase / GIB,
        "decode_slots": slots,
        "rl_step": dataclasses.asdict(rl_shape),
        "sft_step": dataclasses.asdict(sft_shape),
        "model": {"params": model.param_counts(cfg)[0], "active": model.param_counts(cfg)[1]},
    }


_WHAT = {
    "params": "params ({dtype})",
    "master": "f32 master copy",
    "optimizer": "AdamW moments",
    "gradients": "gradients (f32 accumulator)",
    "activations": "backward pass (micro-batch {rl_step})",
    "optimizer_update": "optimizer update's temporaries",
    "sampler_weights": "sampler's weights",
    "kv_cache": "KV cache ({decode_slots} slots)",
    "eval_sampler": "held-out curve's sampler",
    "reference": "KL reference",
}


def report(result: dict, param_dtype: str) -> str:
    """The plan as a table, then its JSON line (device, device_gib, per_device_gib, fits, parts)."""
    step = result["rl_step"]
    fill = dict(dtype=param_dtype, decode_slots=result["decode_slots"], rl_step=f"{step['b']} x {step['t']}")
    lines = [f"memory plan: {result['device']} ({result['device_gib']:.1f} GiB), mesh {result['mesh']}"]
    lines += [f"  {_WHAT[k].format(**fill):<44} {v:8.2f} GiB" for k, v in result["parts"].items()]
    lines.append(f"  {'RL phase, per device':<44} {sum(result['parts'].values()):8.2f} GiB")
    lines.append(f"  {'SFT phase, per device':<44} {result['sft_phase_gib']:8.2f} GiB")
    verdict = "fits" if result["fits"] else "does NOT fit"
    lines.append(f"  peak {result['per_device_gib']:.2f} GiB: {verdict} ({100 * result['spare']:.0f}% spare)")
    keys = ("device", "device_gib", "per_device_gib", "fits", "parts")
    lines.append(json.dumps({k: _round(result[k]) for k in keys}))
    return "\n".join(lines)


def _round(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value
