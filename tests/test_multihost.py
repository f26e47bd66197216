"""Two JAX processes on this machine (CPU, gloo collectives) train as one: the batch split between them,
identical params afterwards, a checkpoint written by the pair restored by a new pair that continues.

The test runs this file as the worker program: `python tests/test_multihost.py PHASE PROCESS_ID PORT DIR`.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

N_PROCESSES = 2
LOCAL_DEVICES = 2
GLOBAL_BATCH = 8  # rows; each process builds 4
STEPS_BEFORE, STEPS_AFTER = 2, 1


def _config():
    from experiments import composer as composer_config

    config = composer_config.get_config("tiny")
    config.mesh.data, config.mesh.fsdp = -1, 2  # 2 x 2 over the 4 devices of both processes
    return config


def _model_config():
    from composer import model

    return model.ModelConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=32
    )


def _full_batch(step: int) -> dict[str, np.ndarray]:
    """The global batch of a step: [1, GLOBAL_BATCH, 16] arrays, the same on every process."""
    rng = np.random.default_rng(step)
    m, b, t = 1, GLOBAL_BATCH, 16
    pos = np.broadcast_to(np.arange(t), (m, b, t))
    valid = pos < rng.integers(t // 2, t + 1, (m, b))[..., None]
    return {
        "tokens": rng.integers(0, 64, (m, b, t)).astype(np.int32),
        "positions": np.where(valid, pos, -1).astype(np.int32),
        "loss_mask": (valid & (pos >= 3)).astype(np.float32),
    }


def _train(state, steps: range, mesh, rules, cfg, optimizer):
    """Runs `steps`; each process feeds only its rows of every batch."""
    import jax

    from composer import distributed, train

    rows = distributed.process_rows(GLOBAL_BATCH)
    step_fn = None
    for step in steps:
        local = {k: v[:, rows] for k, v in _full_batch(step).items()}
        batch = distributed.global_batch(local, mesh, rules)
        if step_fn is None:
            step_fn = train.jit_step(train.sft_step, state, batch, mesh, rules, cfg=cfg, optimizer=optimizer)
        state, metrics = step_fn(state, batch, jax.random.key(step))
    return state, float(metrics["loss"])


def _worker(phase: str, process_id: int, port: int, directory: Path) -> None:
    import jax
    from jax.experimental import multihost_utils

    from composer import checkpoint, distributed, sharding, train

    assert distributed.initialize(f"127.0.0.1:{port}", N_PROCESSES, process_id)
    assert jax.process_count() == N_PROCESSES and jax.device_count() == N_PROCESSES * LOCAL_DEVICES
    config, cfg = _config(), _model_config()
    mesh = sharding.make_mesh(config.mesh)
    rules = tuple(config.mesh.rules)
    optimizer = train.make_optimizer(config.optim, 1e-2, 10)
    params = sharding.init_sharded(jax.random.key(0), cfg, mesh, rules)
    state = distributed.init_state(params, optimizer, mesh)
    ckpt = checkpoint.Checkpointer(directory / "ckpt")
    if phase == "train":
        state, loss = _train(state, range(STEPS_BEFORE), mesh, rules, cfg, optimizer)
        ckpt.save(STEPS_BEFORE, state, {"step": STEPS_BEFORE}, force=True)
    else:
        state, meta = ckpt.restore(state)
        assert meta["step"] == int(state.step) == STEPS_BEFORE
        state, loss = _train(
            state, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER), mesh, rules, cfg, optimizer
        )
    ckpt.close()
    # Each process writes the full params it can gather: the test checks both are identical.
    full = multihost_utils.process_allgather(state.params, tiled=True)
    leaves = jax.tree.leaves(full)
    np.savez(directory / f"{phase}-{process_id}.npz", *leaves)
    (directory / f"{phase}-{process_id}.json").write_text(
        json.dumps({"loss": loss, "step": int(state.step), "main": distributed.is_main_process()})
    )
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(phase: str, directory: Path) -> None:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, phase, str(i), str(port), str(directory)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(N_PROCESSES)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-4000:]


def _single_device_reference(n_steps: int):
    """The same training on one device of this process, with the whole batch."""
    import jax

    from composer import distributed, sharding, train

    config, cfg = _config(), _model_config()
    config.mesh.data, config.mesh.fsdp = 1, 1
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    rules = tuple(config.mesh.rules)
    optimizer = train.make_optimizer(config.optim, 1e-2, 10)
    state = distributed.init_state(
        sharding.init_sharded(jax.random.key(0), cfg, mesh, rules), optimizer, mesh
    )
    step_fn = None
    for step in range(n_steps):
        batch = _full_batch(step)
        if step_fn is None:
            step_fn = train.jit_step(train.sft_step, state, batch, mesh, rules, cfg=cfg, optimizer=optimizer)
        state, metrics = step_fn(state, batch, jax.random.key(step))
        if step == STEPS_BEFORE - 1:
            first = jax.device_get(state.params)
    return first, jax.device_get(state.params)


def _load(directory: Path, name: str) -> list[np.ndarray]:
    with np.load(directory / f"{name}.npz") as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume(tmp_path):
    import jax

    _run_pair("train", tmp_path)
    _run_pair("resume", tmp_path)
    ref_trained, ref_resumed = _single_device_reference(STEPS_BEFORE + STEPS_AFTER)
    for phase, ref in (("train", ref_trained), ("resume", ref_resumed)):
        p0, p1 = _load(tmp_path, f"{phase}-0"), _load(tmp_path, f"{phase}-1")
        for a, b in zip(p0, p1, strict=True):
            np.testing.assert_array_equal(a, b)  # both processes hold the same params
        for a, b in zip(p0, jax.tree.leaves(ref), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)  # and they are the single-device ones
        infos = [json.loads((tmp_path / f"{phase}-{i}.json").read_text()) for i in range(N_PROCESSES)]
        assert [i["main"] for i in infos] == [True, False]
        assert infos[0]["loss"] == infos[1]["loss"]
        assert infos[0]["step"] == (STEPS_BEFORE if phase == "train" else STEPS_BEFORE + STEPS_AFTER)


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
