"""The rollout pool for real: spawn workers, sandboxes, tools, grading; expert replays; a killed worker."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from env import chat, expert
from env import tokenizer as tk
from env.chat import CallError, ToolCall
from env.rollout import LocalPool, RolloutLimits, run_episodes
from env.rollout.driver import default_prompt
from env.rollout.engines import ScriptedEngine, expert_script, turn_ids
from env.tasks import generate_suite

REPO = Path(__file__).resolve().parents[3]
LIMITS = RolloutLimits(
    max_turns=20, max_episode_tokens=1 << 16, max_turn_tokens=4096, episode_timeout_s=120.0
)


def _sleep(seconds: float) -> ToolCall:
    return ToolCall("run_terminal_cmd", {"command": f"sleep {seconds}", "is_background": False})


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """Two generated tasks."""
    return generate_suite(tmp_path_factory.mktemp("tasks"), count=2, seed=0, difficulty=1, split="train")


@pytest.fixture(scope="module")
def suite(tasks):
    """The tasks, the expert's solution of each (~10 s a task here) and a tokenizer trained on them."""
    trajectories = [expert.solve(t) for t in tasks]
    assert all(tr.reward == 1.0 for tr in trajectories)
    texts = [chat.render_text(tr.messages) for tr in trajectories]
    texts += [chat.render_text(default_prompt(t)) for t in tasks]
    tok = tk.train_tokenizer(texts, vocab_size=600)
    return tasks, trajectories, tok


@pytest.fixture(scope="module")
def pool():
    with LocalPool(2) as p:
        yield p


def _assistant_turns(trajectory, skip_tests=False):
    turns = [m for m in trajectory.messages if m.role == "assistant"]
    if skip_tests:  # the expert's test runs (the slow calls): grading runs the tests anyway
        turns = [m for m in turns if not any(c.name == "run_terminal_cmd" for c in m.tool_calls)]
    return turns


def _replay(tasks, trajectories, tok, prefix=(), skip_tests=False, **kw) -> ScriptedEngine:
    """An engine that plays `prefix` turns, then each task's expert assistant turns, as generated ids."""
    openings = [list(tk.render_prompt(default_prompt(t), tok)) for t in tasks]
    turns = [[turn_ids(m, tok) for m in [*prefix, *_assistant_turns(tr, skip_tests)]] for tr in trajectories]
    return ScriptedEngine(expert_script(openings, turns, tok), **kw)


def _wait(pool, episode_id, kind, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ev in pool.poll(0.05):
            assert ev.episode_id == episode_id, ev
            if ev.kind == kind:
                return ev
            assert ev.kind == "started", ev
    raise AssertionError(f"no {kind!r} event for {episode_id} within {timeout} s")


@pytest.mark.slow
def test_expert_replay_solves_generated_tasks(suite, pool):
    tasks, trajectories, tok = suite
    engine = _replay(tasks, trajectories, tok)
    results = run_episodes(tasks, engine, pool, tokenizer=tok, group_size=1, limits=LIMITS)
    assert [(r.group, r.member) for r in results] == [(0, 0), (1, 0)]
    for r, tr in zip(results, trajectories):
        assert r.reward == 1.0 and r.error is None and not r.truncated and r.restarts == 0, r
        assert r.grade.reward == 1.0 and r.components == r.grade.components
        assert r.n_tool_errors == 0 and r.searched_before_edit is True and r.n_parallel_turns >= 1
        assert r.components["searched_or_read_before_edit"] == 1.0 and r.components["tool_errors"] == 0.0
        # The same conversation as the expert's (tool outputs aside: they hold timings), as one exact stream.
        assert r.messages[:2] == tr.messages[:2]  # default_prompt is the expert's opening
        assert [m for m in r.messages if m.role == "assistant"] == [
            m for m in tr.messages if m.role == "assistant"
        ]
        assert tok.decode(r.ids) + "\n" == chat.render_text(r.messages)


@pytest.mark.slow
def test_worker_killed_mid_episode_is_replaced_and_the_episode_completes(suite):
    tasks, trajectories, tok = suite
    slow = chat.Message("assistant", "Checking the environment first.", [_sleep(1.5)])
    engine = _replay(tasks[:1], trajectories[:1], tok, prefix=[slow], skip_tests=True)
    killed, workspaces, slow = [], [], []

    class KillOnce(LocalPool):
        """Kills the episode's worker 0.3 s into its first slow call (once its workspace is ready, so the
        call is running); notes the workspaces made."""

        def submit_calls(self, episode_id, calls):
            super().submit_calls(episode_id, calls)
            if calls == [_sleep(1.5)]:
                slow.append(episode_id)

        def poll(self, timeout):
            events = super().poll(timeout)
            workspaces.extend(Path(e.payload["workspace"]) for e in events if e.kind == "started")
            if slow and len(workspaces) == 1 and not killed:
                killed.append(self.worker_pid(slow[0]))
                threading.Timer(0.3, os.kill, (killed[0], signal.SIGKILL)).start()
            return events

    with KillOnce(1) as pool:
        (r,) = run_episodes(tasks[:1], engine, pool, tokenizer=tok, group_size=1, limits=LIMITS)
        m = pool.metrics()
        assert pool.pids[0] != killed[0]
    assert r.reward == 1.0 and r.restarts == 1 and r.error is None and r.episode_id.endswith("#1")
    assert m["worker_restarts"] == 1 and m["episodes_restarted"] == 1
    assert len(workspaces) == 2 and not any(w.exists() for w in workspaces)  # the dead one's removed too
    # The rerun started from scratch: one stream, the slow turn once, then the expert's turns.
    assert tok.decode(r.ids) + "\n" == chat.render_text(r.messages)
    assert r.n_turns == 1 + len(_assistant_turns(trajectories[0], skip_tests=True))


def test_parallel_calls_of_one_turn_overlap(tasks, pool):
    pool.start_episode("overlap", str(tasks[0].path))
    _wait(pool, "overlap", "started")
    t0 = time.monotonic()
    pool.submit_calls("overlap", [_sleep(1), _sleep(1)])
    ev = _wait(pool, "overlap", "tool_results")
    wall = time.monotonic() - t0
    pool.finish_episode("overlap", grade=False)
    _wait(pool, "overlap", "graded")
    assert [r.is_error for r in ev.payload["results"]] == [False, False]
    assert all("Exit code: 0" in r.text for r in ev.payload["results"])
    assert 0.95 < wall < 1.6, wall


def test_episodes_on_one_worker_run_concurrently(tasks):
    with LocalPool(1) as pool:
        ids = [f"e{i}" for i in range(3)]
        for eid in ids:
            pool.start_episode(eid, str(tasks[0].path))
        started = set()
        while len(started) < 3:
            started |= {ev.episode_id for ev in pool.poll(1.0) if ev.kind == "started"}
        t0 = time.monotonic()
        for eid in ids:
            pool.submit_calls(eid, [_sleep(1)])
        got = set()
        while len(got) < 3 and time.monotonic() - t0 < 10:
            got |= {ev.episode_id for ev in pool.poll(0.1) if ev.kind == "tool_results"}
        wall = time.monotonic() - t0
        assert got == set(ids) and wall < 1.6, wall


def test_malformed_calls_come_back_as_error_results_and_the_episode_goes_on(tasks, pool):
    pool.start_episode("bad", str(tasks[0].path))
    bad = [
        CallError("invalid JSON: Expecting value", "<tool_call>\n{oops\n</tool_call>"),
        ToolCall("nope", {}),
    ]
    pool.submit_calls("bad", bad)
    errors = _wait(pool, "bad", "tool_results").payload["results"]
    assert [r.is_error for r in errors] == [True, True]
    assert "invalid JSON" in errors[0].text and "nope" in errors[1].text
    pool.submit_calls("bad", [ToolCall("list_dir", {"target_directory": "."})])
    (ok,) = _wait(pool, "bad", "tool_results").payload["results"]
    assert not ok.is_error and "tests/" in ok.text
    pool.finish_episode("bad", grade=True)
    graded = _wait(pool, "bad", "graded").payload["grade"]
    assert graded.reward == 0.0  # nothing was fixed; graded for real, not skipped


def test_workers_offer_only_the_pools_tools(tasks):
    with LocalPool(1, tools=("read_file", "grep")) as pool:
        pool.start_episode("subset", str(tasks[0].path))
        pool.submit_calls(
            "subset", [ToolCall("list_dir", {"target_directory": "."}), ToolCall("grep", {"pattern": "def "})]
        )
        refused, ok = _wait(pool, "subset", "tool_results").payload["results"]
        pool.finish_episode("subset", grade=False)
        _wait(pool, "subset", "graded")
    assert refused.is_error and "unknown tool 'list_dir'. Valid tools: read_file, grep" in refused.text
    assert not ok.is_error and "def " in ok.text


def test_workers_do_not_run_the_main_script_or_import_jax(tmp_path):
    marker = tmp_path / "imports.txt"
    script = tmp_path / "main_script.py"
    script.write_text(
        textwrap.dedent(f"""
        import os
        with open({str(marker)!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{__name__}}\\n")
        import jax  # what a training script has loaded; a worker must not inherit or re-import it
        from env.rollout import LocalPool
        if __name__ == "__main__":
            with LocalPool(1) as pool:
                pool.wait_ready(60)
                print("workers_with_jax", pool.metrics()["workers_with_jax"])
        """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "workers_with_jax 0" in out.stdout
    (line,) = marker.read_text().splitlines()  # the script ran once: as the parent's __main__
    assert line.endswith(" __main__")


def test_wait_ready_names_the_pools_workers_when_they_are_late():
    # wait_ready is shared with RayPool, whose error says "actors"; a deadline already past fails at once.
    with LocalPool(1) as pool, pytest.raises(TimeoutError, match="rollout workers not ready"):
        pool.wait_ready(-1.0)
