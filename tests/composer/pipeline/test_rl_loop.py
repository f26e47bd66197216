"""The RL loop's UPDATE / SYNC / LOG / CHECKPOINT order, run inline and with the update overlapped with the
next batch's rollouts (rl.overlap_update), on a fake learner, sampler and writer."""

import collections
import threading
import time
from types import SimpleNamespace

import jax
import pytest

from composer.pipeline import rl
from composer.pipeline.rl_extras import EpisodeStarts, Extras
from experiments import composer as experiment


def _group(step: int) -> list[SimpleNamespace]:
    """A group of two episodes (one solved): signal, so every update runs."""

    def episode(i: int, reward: float) -> SimpleNamespace:
        return SimpleNamespace(
            ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], reward=reward, truncated=False,
            n_turns=2, n_tool_errors=0, n_tool_calls=1, error_spans=[], components={}, task_id=f"t{step}",
        )  # fmt: skip

    return [episode(0, 1.0), episode(1, 0.0)]


class _Learner:
    """Records when each update runs; an update takes `seconds`."""

    def __init__(self, events: list, seconds: float) -> None:
        self.events, self.seconds, self.updates = events, seconds, 0
        self.params = self.state = "params-0"

    def step(self, batch, key) -> dict:
        self.events.append(("update start", self.updates + 1, threading.current_thread().name))
        time.sleep(self.seconds)
        self.updates += 1
        self.params = self.state = f"params-{self.updates}"
        self.events.append(("update end", self.updates))
        return {"loss": float(self.updates)}


class _Sampler:
    def __init__(self, events: list) -> None:
        self.events, self.generated = events, 0

    def stats(self) -> dict:
        self.generated += 10
        keys = ("occupancy", "tokens_per_s", "prefill_share", "reused_tokens", "shared_prompts")
        return {**dict.fromkeys(keys, 0.0), "tokens_generated": self.generated}

    def update_params(self, params, version: int) -> None:
        self.events.append(("sync", version, params))


def _run(overlap: bool, steps: int = 3, collect_s: float = 0.05, update_s: float = 0.3):
    config = experiment.get_config()
    config.rl.update(steps=steps, tasks_per_step=1, overlap_update=overlap)
    config.eval.every_steps = 0
    events: list = []
    learner = _Learner(events, update_s)
    policy = rl._Policy(learner, None, None)
    progress = rl._Progress()
    records: list = []
    writer = SimpleNamespace(write=lambda phase, step, metrics: records.append((phase, step, dict(metrics))))
    ckpt = SimpleNamespace(save=lambda step, state, meta, force: events.append(("checkpoint", step, state)))
    bar = SimpleNamespace(set_postfix=lambda **_: None, update=lambda: None)
    pool = SimpleNamespace(metrics=lambda: {})

    def batches():
        for step in range(1, steps + 2):  # one batch more than the phase needs: it must not be drawn
            time.sleep(collect_s)
            progress.counts["groups"] += 1
            progress.counts["episodes"] += 2
            events.append(("collected", step))
            yield [_group(step)]

    loop = rl._Loop(config, None, None, writer, policy, _Sampler(events), progress, ckpt, bar, pool,
                    jax.random.key(0))  # fmt: skip
    loop.run(batches(), Extras(EpisodeStarts("expert_start", {}), ()), time.time())
    return events, records, progress


def test_inline_updates_run_between_collections_and_each_step_logs_its_own_batch():
    events, records, progress = _run(overlap=False)
    order = [e[:2] for e in events if e[0] != "update start"]
    assert order == [
        ("collected", 1), ("update end", 1), ("sync", 1), ("checkpoint", 1),
        ("collected", 2), ("update end", 2), ("sync", 2), ("checkpoint", 2),
        ("collected", 3), ("update end", 3), ("sync", 3), ("checkpoint", 3),
    ]  # fmt: skip
    assert all(e[2] == "MainThread" for e in events if e[0] == "update start")
    assert [(phase, step) for phase, step, _ in records] == [("rl", 1), ("rl", 2), ("rl", 3)]
    assert progress.step == 3 and progress.version == 3
    for _, step, metrics in records:
        assert metrics["loss"] == step and metrics["groups"] == 1 and metrics["episodes"] == 2
        assert metrics["groups_trained"] == 1
        assert metrics["tokens_generated"] == 10 and metrics["step_s"] > 0


def test_overlapped_updates_run_beside_the_next_collection_and_keep_the_step_order():
    events, records, progress = _run(overlap=True)
    order = [e[:2] for e in events if e[0] != "update start"]
    # The batch of step k + 1 is collected while update k runs; step k is synced, logged and checkpointed
    # once its update ends, before update k + 1 starts (which starts from its state).
    assert order == [
        ("collected", 1), ("collected", 2), ("update end", 1), ("sync", 1), ("checkpoint", 1),
        ("collected", 3), ("update end", 2), ("sync", 2), ("checkpoint", 2),
        ("update end", 3), ("sync", 3), ("checkpoint", 3),
    ]  # fmt: skip
    assert all(e[2] != "MainThread" for e in events if e[0] == "update start")
    # Each checkpoint holds the state after its own step's update.
    assert [e[2] for e in events if e[0] == "checkpoint"] == ["params-1", "params-2", "params-3"]
    assert progress.step == 3 and progress.version == 3
    for _, step, metrics in records:
        # The counts and tokens a step logs are its own batch's, not the next one's collected meanwhile.
        assert metrics["loss"] == step and metrics["groups"] == 1 and metrics["episodes"] == 2
        assert metrics["tokens_generated"] == 10


@pytest.mark.parametrize("overlap", [False, True])
def test_an_update_that_fails_stops_the_loop(overlap):
    class Broken(_Learner):
        def step(self, batch, key):
            raise RuntimeError("update failed")

    config = experiment.get_config()
    config.rl.update(steps=2, tasks_per_step=1, overlap_update=overlap)
    progress = rl._Progress()
    loop = rl._Loop(
        config, None, None, SimpleNamespace(write=lambda *a: None), rl._Policy(Broken([], 0), None, None),
        _Sampler([]), progress, None, None, SimpleNamespace(metrics=lambda: {}), jax.random.key(0),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="update failed"):
        loop.run(
            iter([[_group(1)], [_group(2)], [_group(3)]]), Extras(EpisodeStarts("s", {}), ()), time.time()
        )
    assert progress.step == 0
    assert isinstance(progress.counts, collections.Counter)
