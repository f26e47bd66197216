"""The Ray rollout backend: expert replays score 1; a killed actor's episode is rerun and completes."""

import threading
from pathlib import Path

import ml_collections
import pytest

ray = pytest.importorskip("ray")

from env import chat, expert  # noqa: E402
from env import tokenizer as tk  # noqa: E402
from env.chat import ToolCall  # noqa: E402
from env.rollout import RolloutLimits, make_pool, run_episodes  # noqa: E402
from env.rollout.driver import default_prompt  # noqa: E402
from env.rollout.engines import ScriptedEngine, expert_script, turn_ids  # noqa: E402
from env.rollout.ray_pool import RayPool  # noqa: E402
from env.tasks import generate_suite  # noqa: E402

LIMITS = RolloutLimits(
    max_turns=20, max_episode_tokens=1 << 16, max_turn_tokens=4096, episode_timeout_s=120.0
)
SLOW = ToolCall("run_terminal_cmd", {"command": "sleep 1.5", "is_background": False})


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One generated task, the expert's solution and a tokenizer trained on it."""
    tasks = generate_suite(tmp_path_factory.mktemp("tasks"), count=1, seed=0, difficulty=1, split="train")
    trajectories = [expert.solve(t) for t in tasks]
    assert all(tr.reward == 1.0 for tr in trajectories)
    texts = [chat.render_text(tr.messages) for tr in trajectories]
    texts += [chat.render_text(default_prompt(t)) for t in tasks]
    return tasks, trajectories, tk.train_tokenizer(texts, vocab_size=600)


@pytest.fixture(scope="module")
def pool():
    with RayPool(1) as p:  # starts (and at the end stops) a local Ray cluster
        p.wait_ready(60.0)
        yield p


def _replay(tasks, trajectories, tok, prefix=()) -> ScriptedEngine:
    """Plays `prefix` turns, then the expert's assistant turns without its test runs (grading runs them)."""
    openings = [list(tk.render_prompt(default_prompt(t), tok)) for t in tasks]
    turns = []
    for tr in trajectories:
        expert_turns = [m for m in tr.messages if m.role == "assistant"]
        expert_turns = [
            m for m in expert_turns if not any(c.name == "run_terminal_cmd" for c in m.tool_calls)
        ]
        turns.append([turn_ids(m, tok) for m in [*prefix, *expert_turns]])
    return ScriptedEngine(expert_script(openings, turns, tok))


def test_expert_replay_scores_one_through_ray(suite, pool):
    tasks, trajectories, tok = suite
    (r,) = run_episodes(
        tasks, _replay(tasks, trajectories, tok), pool, tokenizer=tok, group_size=1, limits=LIMITS
    )
    assert r.reward == 1.0 and r.error is None and r.restarts == 0 and r.grade.reward == 1.0, r
    assert [m for m in r.messages if m.role == "assistant"][-1] == [
        m for m in trajectories[0].messages if m.role == "assistant"
    ][-1]
    m = pool.metrics()
    assert m["episodes_graded"] >= 1 and m["workers_with_jax"] == 0  # actors never load JAX


@pytest.mark.slow
def test_actor_killed_mid_episode_is_replaced_and_the_episode_completes(suite, pool):
    tasks, trajectories, tok = suite
    slow_turn = chat.Message("assistant", "Checking the environment first.", [SLOW])
    engine = _replay(tasks, trajectories, tok, prefix=[slow_turn])
    killed, workspaces, started, target = [], [], set(), []
    submit, poll = pool.submit_calls, pool.poll

    def kill_when_running():
        """Kills the target's actor 0.3 s after its slow call was sent and its workspace reported: the
        call is running then. (Killed before the 'started' event, the actor takes its half-made workspace
        with it, which make_workspace sweeps later, and there is no first workspace to check.)"""
        if target and not killed and target[0] in started:
            killed.append(pool.worker_pid(target[0]))
            threading.Timer(0.3, ray.kill, (pool.actor_of(target[0]),)).start()

    def submit_and_kill(episode_id, calls):
        submit(episode_id, calls)
        if calls == [SLOW] and not target:
            target.append(episode_id)
            kill_when_running()

    def poll_and_note(timeout):
        events = poll(timeout)
        for e in events:
            if e.kind == "started":
                workspaces.append(Path(e.payload["workspace"]))
                started.add(e.episode_id)
        kill_when_running()
        return events

    before = pool.metrics()
    pool.submit_calls, pool.poll = submit_and_kill, poll_and_note
    try:
        (r,) = run_episodes(tasks, engine, pool, tokenizer=tok, group_size=1, limits=LIMITS)
    finally:
        del pool.submit_calls, pool.poll
    m = pool.metrics()
    assert killed and r.reward == 1.0 and r.restarts == 1 and r.error is None, r
    assert m["worker_restarts"] - before["worker_restarts"] == 1
    assert m["episodes_restarted"] - before["episodes_restarted"] == 1
    assert pool.pids[0] != killed[0]
    assert len(workspaces) == 2 and not any(w.exists() for w in workspaces)  # the dead one's removed too
    # The rerun started from scratch: one exact stream, the slow turn once.
    assert tok.decode(r.ids) + "\n" == chat.render_text(r.messages)
    assert sum(m.tool_calls == [SLOW] for m in r.messages if m.role == "assistant") == 1


def test_make_pool_picks_ray_by_config(pool):
    del pool  # the module's cluster is running: make_pool's pool joins it
    config = ml_collections.ConfigDict(
        {
            "env": {
                "rollout_backend": "ray",
                "n_workers": 2,
                "isolation": "auto",
                "command_timeout_s": 5.0,
                "ray_address": "",
                "tools": "grep,read_file",
                "search_model": "",
            }
        }
    )
    with make_pool(config) as p:
        assert isinstance(p, RayPool)
        assert p._options.tools == ("read_file", "grep")  # handed to every actor's worker
        p.wait_ready(60.0)
        assert len(set(p.pids)) == 2 and p.metrics()["workers"] == 2
    assert ray.is_initialized()  # it did not start the cluster, so it leaves it running
