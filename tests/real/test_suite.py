"""The real suite as a user meets it: what the builder wrote, `validate`, `grade` and a tiny `--mode=eval`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from env.tasks import environments
from env.tasks.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = {"toolz": ("package", "toolz/tests/"), "cachetools": ("src", "tests/")}


def _last_json(capsys) -> tuple[dict, str]:
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1]), out


def test_the_builder_wrote_the_tasks_asked_for(real_tasks):
    for name, tasks in real_tasks.items():
        assert [t.instance_id.rsplit("-", 1)[1] for t in tasks] == ["0", "1", "2"]
        layout, test_dir = LAYOUTS[name]
        for task in tasks:
            assert task.metadata["layout"] == layout and task.metadata["build_seed"] == 1
            assert all(t.startswith(test_dir) for t in task.tests)
            assert task.FAIL_TO_PASS and "--junitxml" not in task.test_cmd  # the grader adds its own
            assert environments.python_env(task) is not None  # built by the fixture


def test_validate_passes_every_task(real_suite, capsys):
    code = main(["validate", str(real_suite), "--workers", "2"])
    summary, out = _last_json(capsys)
    assert code == 0, out
    assert summary["tasks"] == summary["valid"] == 6 and summary["invalid"] == {}, out


@pytest.mark.parametrize("package", ["toolz", "cachetools"])
def test_grade_gives_the_gold_patch_1_and_the_empty_patch_0(real_tasks, workspace_of, package, capsys):
    task = real_tasks[package][0]
    for fixed, reward in ((False, 0.0), (True, 1.0)):
        ws = workspace_of(task, fixed=fixed)
        code = main(["grade", "--task", str(task.path), "--workspace", str(ws)])
        result, out = _last_json(capsys)
        assert code == 0 and result["instance_id"] == task.instance_id
        assert result["reward"] == reward, result["output"][-3000:]
        assert set(result["tests"]) == set(task.tests)
        f2p = {result["tests"][t] for t in task.FAIL_TO_PASS}
        assert f2p == {"passed"} if fixed else f2p <= {"failed", "error"}
        assert {result["tests"][t] for t in task.PASS_TO_PASS} == {"passed"}
        assert "[grading] restored" not in result["output"]  # nothing put back over the source


def test_eval_of_the_random_init_on_the_real_suite_ends_with_the_json_line(real_suite, tmp_path):
    workdir = tmp_path / "run"
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's run; the compilation cache is the config's
    r = subprocess.run(
        [sys.executable, "launch.py", "--config=experiments/composer.py:tiny", "--mode=eval",
         f"--config.eval.tasks={real_suite}", "--config.eval.n_tasks=6", "--config.env.max_turns=2",
         f"--workdir={workdir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-5000:]
    assert "the model is the random init" in r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(last) == {"tasks", "solved", "solve_rate", "pass_at_k"}
    assert last["tasks"] == 6 and 0 <= last["solved"] <= 6 and list(last["pass_at_k"]) == ["1"]
    assert last["solve_rate"] == pytest.approx(last["solved"] / 6)
    out = workdir / "eval_suites" / f"{real_suite.name}-random_init"
    tasks = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    assert sorted(t["instance_id"] for t in tasks) == sorted(
        p.parent.name for p in real_suite.glob("*/task.json")
    )
