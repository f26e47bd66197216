"""Metrics files and checkpoints."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from composer import metrics
from composer.checkpoint import Checkpointer


def test_metrics_jsonl_tensorboard_and_plot(tmp_path):
    writer = metrics.MetricsWriter(tmp_path)
    for step in range(3):
        writer.write("rl", step, {"reward": step / 2, "bad": float("nan"), "name": "x"})
    writer.write("eval", 2, {"solve_rate": 0.5})
    writer.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in lines if r["phase"] == "rl"] == [0.0, 0.5, 1.0]
    assert all("bad" not in r and "name" not in r for r in lines)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    png = metrics.plot_curves(
        tmp_path, {"reward": ("rl", "reward"), "held-out": ("eval", "solve_rate")}, "c.png"
    )
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert metrics.plot_curves(tmp_path, {"x": ("sft", "loss")}, "none.png") is None


def test_read_metrics_skips_a_torn_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"phase": "rl", "step": 1, "reward": 1.0}\n{"phase": "rl", "st')
    assert metrics.read_metrics(tmp_path, "rl") == [{"phase": "rl", "step": 1, "reward": 1.0}]


def test_checkpoint_round_trip_and_latest(tmp_path):
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "key": jax.random.key_data(jax.random.key(1))}
    with Checkpointer(tmp_path / "ck", max_to_keep=2, save_every=2) as ck:
        assert ck.latest_step() is None
        assert not ck.save(1, state, {"step": 1})  # not a multiple of save_every
        assert ck.save(2, state, {"step": 2})
        state2 = jax.tree.map(lambda x: x + 1, state)
        assert ck.save(3, state2, {"step": 3, "version": 7}, force=True)
    with Checkpointer(tmp_path / "ck") as ck:
        assert ck.latest_step() == 3
        restored, meta = ck.restore(state)
        assert meta == {"step": 3, "version": 7}
        np.testing.assert_array_equal(restored["params"]["w"], state2["params"]["w"])
        old, meta = ck.restore(state, step=2)
        np.testing.assert_array_equal(old["params"]["w"], state["params"]["w"])
