"""EVAL on any suite: the pass@k estimator, the summary line, and `--mode=eval --config.eval.tasks=DIR`."""

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from composer.pipeline import eval_suite
from experiments import composer as composer_config

ROOT = Path(__file__).resolve().parents[3]


def _brute_force(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (c of them correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_chance_that_k_of_the_samples_hold_a_correct_one(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert math.isclose(eval_suite.pass_at_k(n, c, k), _brute_force(n, c, k), abs_tol=1e-12)
    assert eval_suite.pass_at_k(n, 1, 1) == pytest.approx(1 / n)
    with pytest.raises(ValueError):
        eval_suite.pass_at_k(n, n + 1, 1)


def test_k_is_1_and_the_powers_of_2_up_to_the_samples():
    assert eval_suite.ks(1) == [1]
    assert eval_suite.ks(6) == [1, 2, 4]
    assert eval_suite.ks(8) == [1, 2, 4, 8]


def test_the_summary_counts_a_task_solved_when_any_sample_is():
    summary = eval_suite.summarize(
        {"a": [1.0, 0.0, 0.0, 0.0], "b": [0.0, 0.0, 0.0, 0.0], "c": [1.0, 1.0, None, 0.0]}
    )
    assert summary["tasks"] == 3 and summary["solved"] == 2 and summary["solve_rate"] == pytest.approx(2 / 3)
    assert summary["pass_at_k"]["1"] == pytest.approx((1 / 4 + 0 + 2 / 4) / 3)  # None: not solved
    assert summary["pass_at_k"]["4"] == pytest.approx(2 / 3)
    assert list(summary["pass_at_k"]) == ["1", "2", "4"]


def test_more_than_one_greedy_sample_is_refused():
    config = composer_config.get_config("tiny")
    config.eval.samples_per_task = 4
    with pytest.raises(ValueError, match="eval.temperature"):
        eval_suite.check(config)
    config.eval.temperature = 0.6
    eval_suite.check(config)


@pytest.mark.slow
def test_eval_of_the_random_init_on_a_suite_ends_with_the_json_line(tmp_path):
    suite, workdir = tmp_path / "suite", tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "env.tasks", "generate", "--out", str(suite), "--count", "3", "--seed", "0"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    r = subprocess.run(
        [sys.executable, "launch.py", "--config=experiments/composer.py:tiny", "--mode=eval",
         f"--config.eval.tasks={suite}", "--config.eval.samples_per_task=2", "--config.eval.temperature=0.6",
         "--config.env.max_turns=2", f"--workdir={workdir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-5000:]
    assert "the model is the random init" in r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["tasks"] == 3 and 0 <= last["solved"] <= 3 and list(last["pass_at_k"]) == ["1", "2"]
    out = workdir / "eval_suites" / "suite-random_init"
    results = json.loads((out / "results.json").read_text())
    assert {k: results[k] for k in last} == last and results["stats"]["episodes"] == 6
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["instance_id"] for t in tasks) == sorted(p.parent.name for p in suite.glob("*/task.json"))
    assert all(len(t["rewards"]) == 2 for t in tasks)
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 6 and {e["sample"] for e in episodes} == {0, 1}
    assert not (workdir / "tokenizer.json").exists()  # the workdir's DATA would otherwise take it
