"""The memory plan's learner against a measured peak: plan the RL train step of a config, then run that step
on the CPU and measure the memory it takes.

    python benchmarks/memory_plan_check.py [--config.model.d_model=256 ...]

Planned: the plan's backward pass, gradients and optimizer update (composer/memory_plan.py). Measured: the
process's peak resident memory while the compiled step runs, above what it held before (the train state
and the batch already in place; Linux's VmHWM, reset through /proc/self/clear_refs). XLA:CPU on one device,
so the plan's compile and the step's are the same backend. The last line is one JSON object:
{"planned_gib", "measured_gib", "ratio", ...}.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from composer import xla_flags  # noqa: E402

xla_flags.apply()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from composer import copy_head, distributed, memory_plan, model, sharding, train  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/composer.py", "Experiment config.")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _concrete_batch(shape: memory_plan.StepShape, fields: dict, vocab: int) -> dict:
    """A batch of `shape` with every row full (real tokens at positions 0..t-1, loss on all of them)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, spec in memory_plan._batch(shape, fields).items():
        if name == "tokens":
            out[name] = rng.integers(0, vocab, spec.shape).astype(np.int32)
        elif name == "positions":
            out[name] = np.broadcast_to(np.arange(shape.t, dtype=np.int32), spec.shape).copy()
        elif name in ("loss_mask",):
            out[name] = np.ones(spec.shape, np.float32)
        elif name == "advantages":
            out[name] = rng.choice([-1.0, 1.0], spec.shape).astype(np.float32)
        elif name == "sampler_logprobs":
            out[name] = np.full(spec.shape, -np.log(vocab), np.float32)
        else:
            out[name] = np.zeros(spec.shape, spec.dtype)
    return out


def main(argv) -> None:
    del argv
    config = _CONFIG.value
    if jax.device_count() != 1 or memory_plan.mesh_devices(config.mesh) != 1:
        raise SystemExit("run on one CPU device (the plan's mesh of one)")
    result = memory_plan.plan(config)
    parts = result["parts"]
    planned = parts["gradients"] + parts["activations"] + parts["optimizer_update"]

    cfg = model.ModelConfig.from_config(config, "cpu")
    mesh = sharding.make_mesh(config.mesh)
    rules = tuple(config.mesh.rules)
    optimizer = train.make_optimizer(config.optim, config.rl.learning_rate, config.rl.steps)
    params = sharding.init_sharded(jax.random.key(0), cfg, mesh, rules)
    state = distributed.init_state(params, optimizer, mesh)
    shape = memory_plan.StepShape(**result["rl_step"])
    batch = _concrete_batch(shape, memory_plan._rl_fields(config), cfg.vocab_size)
    batch = jax.device_put(batch, sharding.batch_shardings(batch, mesh, rules))
    line_tokens = copy_head.LineTokens(1, 2, 3, (4,)) if copy_head.uses_line_keys(cfg) else None
    hp = train.RLHParams.from_config(config)
    static = dict(cfg=cfg, optimizer=optimizer, line_tokens=line_tokens, hp=hp)
    key = jax.random.key(1)
    compiled = (
        train.jit_step(train.rl_step, state, batch, mesh, rules, **static).lower(state, batch, key).compile()
    )
    jax.block_until_ready((state, batch))
    before_kib = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.time()
    state, metrics = compiled(state, batch, key)
    jax.block_until_ready((state, metrics))
    seconds = time.time() - t0
    measured = (_status_kib("VmHWM") - before_kib) / 2**20
    print(
        f"planned {planned:.3f} GiB (gradients {parts['gradients']:.3f}, backward "
        f"{parts['activations']:.3f}, update {parts['optimizer_update']:.3f}); measured {measured:.3f} GiB; "
        f"step {seconds:.1f} s"
    )
    out = {
        "planned_gib": round(planned, 4),
        "measured_gib": round(measured, 4),
        "ratio": round(planned / measured, 4),
        "rl_step": result["rl_step"],
        "step_s": round(seconds, 2),
        "loss": float(jnp.asarray(metrics["loss"])),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    app.run(main)
