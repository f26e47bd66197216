"""The task format (loader validation, save/load round trip) and the `python -m env.tasks` command line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from env.tasks import Task, TaskError, generate_task, load_suite, load_task, save_task
from env.tasks.__main__ import main
from env.tasks.task import junit_path

ROOT = Path(__file__).resolve().parents[3]


def _valid(tmp_path: Path) -> Path:
    path = tmp_path / "t1"
    (path / "repo" / "pkg").mkdir(parents=True)
    (path / "repo" / "pkg" / "__init__.py").write_text("X = 1\n")
    task = Task(
        instance_id="t1",
        problem_statement="X is wrong",
        test_cmd="python -m pytest -q --junitxml=.junit.xml tests",
        FAIL_TO_PASS=["tests/test_x.py::test_x"],
        PASS_TO_PASS=["tests/test_x.py::test_y"],
        patch="",
        test_patch="",
        timeout_s=10,
        path=path,
        metadata={"family": "wrong_constant"},
    )
    save_task(task)
    return path


def _edit(path: Path, **changes) -> None:
    data = json.loads((path / "task.json").read_text())
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    (path / "task.json").write_text(json.dumps(data))


def test_round_trip(tmp_path):
    path = _valid(tmp_path)
    task = load_task(path)
    assert task.instance_id == "t1" and task.timeout_s == 10.0 and isinstance(task.timeout_s, float)
    assert task.repo == path / "repo"
    assert task.tests == ["tests/test_x.py::test_x", "tests/test_x.py::test_y"]
    assert task.metadata == {"family": "wrong_constant"}
    assert list(json.loads((path / "task.json").read_text())) == [
        "instance_id",
        "problem_statement",
        "test_cmd",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "patch",
        "test_patch",
        "timeout_s",
        "metadata",
    ]


@pytest.mark.parametrize(
    "field",
    [
        "instance_id",
        "problem_statement",
        "test_cmd",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "patch",
        "test_patch",
        "timeout_s",
    ],
)
def test_missing_field_is_named(tmp_path, field):
    path = _valid(tmp_path)
    _edit(path, **{field: ...})
    with pytest.raises(TaskError, match=f"missing field '{field}'"):
        load_task(path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("instance_id", 3),
        ("problem_statement", ["a"]),
        ("FAIL_TO_PASS", "tests/test_x.py::test_x"),
        ("PASS_TO_PASS", {"a": 1}),
        ("timeout_s", "10"),
        ("timeout_s", True),
        ("patch", None),
        ("metadata", []),
        ("environment", "python3.11"),
        ("FAIL_TO_PASS", '{"a": 1}'),
        ("PASS_TO_PASS", '"tests/test_x.py::test_y"'),
    ],
)
def test_wrong_type_is_named(tmp_path, field, value):
    path = _valid(tmp_path)
    _edit(path, **{field: value})
    with pytest.raises(TaskError, match=f"field '{field}' must be"):
        load_task(path)


def test_other_invalid_tasks(tmp_path):
    path = _valid(tmp_path)
    shutil.rmtree(path / "repo")
    with pytest.raises(TaskError, match="missing repo/"):
        load_task(path)
    path = _valid(tmp_path / "b")
    _edit(path, FAIL_TO_PASS=[])
    with pytest.raises(TaskError, match="'FAIL_TO_PASS' is empty"):
        load_task(path)
    _edit(path, FAIL_TO_PASS=["tests/test_x.py::test_y"])
    with pytest.raises(TaskError, match="share node ids"):
        load_task(path)
    _edit(path, FAIL_TO_PASS=["tests/test_x.py::test_x"], test_cmd="pytest --junitxml=/tmp/r.xml")
    with pytest.raises(TaskError, match="inside the repository"):
        load_task(path)
    _edit(path, test_cmd="pytest --junitxml=r.xml", timeout_s=0)
    with pytest.raises(TaskError, match="'timeout_s' must be positive"):
        load_task(path)
    (path / "task.json").write_text("{not json")
    with pytest.raises(TaskError, match="not valid JSON"):
        load_task(path)
    with pytest.raises(TaskError, match="not a directory"):
        load_task(tmp_path / "nowhere")
    os.remove(path / "task.json")
    with pytest.raises(TaskError, match="missing task.json"):
        load_task(path)
    assert isinstance(TaskError("x"), ValueError)


def test_swe_bench_style_task(tmp_path):
    # A plain pytest command, node ids as JSON strings, SWE-bench's own fields and an environment.
    path = _valid(tmp_path)
    environment = {"python": "3.11", "requirements": ["pytest==8.3.3"], "install": ["pip install -e ."]}
    _edit(
        path,
        test_cmd="python -m pytest -rA tests/test_x.py",
        FAIL_TO_PASS='["tests/test_x.py::test_x"]',
        PASS_TO_PASS="[]",
        repo="owner/project",
        base_commit="abc123",
        version="1.2",
        hints_text="",
        metadata={"family": "real", "version": "1.2-explicit"},
        environment=environment,
    )
    task = load_task(path)
    assert task.FAIL_TO_PASS == ["tests/test_x.py::test_x"] and task.PASS_TO_PASS == []
    assert task.environment == environment
    assert task.metadata == {
        "repo": "owner/project",
        "base_commit": "abc123",
        "version": "1.2-explicit",  # the explicit metadata key wins
        "hints_text": "",
        "family": "real",
    }
    save_task(task)
    saved = json.loads((path / "task.json").read_text())
    assert saved["environment"] == environment and saved["FAIL_TO_PASS"] == ["tests/test_x.py::test_x"]
    assert load_task(path) == task
    # Without an environment (the project's interpreter) none is written back.
    task.environment = {}
    save_task(task)
    assert "environment" not in json.loads((path / "task.json").read_text())
    assert load_task(path).environment == {}


def test_load_suite(tmp_path):
    _valid(tmp_path / "suite")
    (tmp_path / "suite" / "notes").mkdir()
    assert [t.instance_id for t in load_suite(tmp_path / "suite")] == ["t1"]


def test_junit_path():
    assert junit_path("python -m pytest -q --junitxml=.junit.xml tests") == ".junit.xml"
    assert junit_path("pytest --junitxml /tmp/r.xml") == "/tmp/r.xml"
    assert junit_path("pytest tests") is None


# ------------------------------------------------------------------------------------------------- CLI


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "env.tasks", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def test_cli_generate_and_grade(tmp_path):
    out = tmp_path / "suite"
    proc = _cli(
        "generate",
        "--out",
        str(out),
        "--count",
        "2",
        "--seed",
        "3",
        "--difficulty",
        "2",
        "--split",
        "heldout",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert (
        lines[0].startswith("[1/2] ") and lines[1].startswith("[2/2] ") and lines[2].startswith("generated 2")
    )
    tasks = load_suite(out)
    assert len(tasks) == 2
    assert all(t.metadata["split"] == "heldout" and t.metadata["difficulty"] == 2 for t in tasks)
    # The same seeds through the library give the same tasks.
    again = generate_task(tasks[0].metadata["seed"], 2, tmp_path / "again", "heldout")
    assert (again.path / "task.json").read_bytes() == (tasks[0].path / "task.json").read_bytes()

    task = tasks[0]
    proc = _cli("grade", "--task", str(task.path), "--workspace", str(task.repo))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON object
    assert result["reward"] == 0.0 and result["instance_id"] == task.instance_id
    assert set(result["tests"]) == set(task.tests)
    assert all(result["tests"][t] == "failed" for t in task.FAIL_TO_PASS)
    assert all(result["tests"][t] == "passed" for t in task.PASS_TO_PASS)

    proc = _cli("grade", "--task", str(tmp_path / "nope"), "--workspace", str(task.repo))
    assert proc.returncode == 2 and "error:" in proc.stderr


def test_cli_grades_a_swe_bench_style_task(tmp_path, capsys):
    # As SWE-bench ships a task: a plain pytest command, node ids as JSON strings, fields of its own; the
    # tests live inside the package.
    task_dir = tmp_path / "proj__proj-1"
    repo = task_dir / "repo"
    (repo / "proj" / "tests").mkdir(parents=True)
    (repo / "proj" / "__init__.py").write_text("")
    (repo / "proj" / "tests" / "__init__.py").write_text("")
    (repo / "proj" / "mean.py").write_text("def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n")
    (repo / "proj" / "tests" / "test_mean.py").write_text(
        "from proj.mean import mean\n\n\ndef test_mean():\n    assert mean([1, 3]) == 2\n\n\n"
        "def test_empty_raises():\n    import pytest\n\n    with pytest.raises(ZeroDivisionError):\n"
        "        mean([])\n"
    )
    patch = (
        "diff --git a/proj/mean.py b/proj/mean.py\n--- a/proj/mean.py\n+++ b/proj/mean.py\n"
        "@@ -1,2 +1,2 @@\n def mean(xs):\n-    return sum(xs) / (len(xs) + 1)\n"
        "+    return sum(xs) / len(xs)\n"
    )
    task = {
        "repo": "proj/proj",
        "instance_id": "proj__proj-1",
        "base_commit": "0123abc",
        "patch": patch,
        "test_patch": "",
        "problem_statement": "mean([1, 3]) is 1.33, expected 2",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": '["proj/tests/test_mean.py::test_mean"]',
        "PASS_TO_PASS": '["proj/tests/test_mean.py::test_empty_raises"]',
        "environment_setup_commit": "0123abc",
        "test_cmd": "python -m pytest proj/tests/test_mean.py",
        "timeout_s": 60,
    }
    (task_dir / "task.json").write_text(json.dumps(task))
    gold = Path(shutil.copytree(repo, tmp_path / "gold"))
    (gold / "proj" / "mean.py").write_text("def mean(xs):\n    return sum(xs) / len(xs)\n")
    results = {}
    for name, workspace in (("empty", repo), ("gold", gold)):
        assert main(["grade", "--task", str(task_dir), "--workspace", str(workspace)]) == 0
        results[name] = json.loads(capsys.readouterr().out)
    assert results["gold"]["reward"] == 1.0, results["gold"]["output"]
    assert results["gold"]["tests"] == {
        "proj/tests/test_mean.py::test_mean": "passed",
        "proj/tests/test_mean.py::test_empty_raises": "passed",
    }
    assert results["empty"]["reward"] == 0.0
    assert results["empty"]["tests"]["proj/tests/test_mean.py::test_mean"] == "failed"
    assert load_task(task_dir).metadata["base_commit"] == "0123abc"


def test_cli_generate_families(tmp_path):
    out = tmp_path / "suite"
    proc = _cli("generate", "--out", str(out), "--count", "1", "--seed", "0", "--families", "early_return")
    assert proc.returncode == 0, proc.stderr
    assert [t.metadata["family"] for t in load_suite(out)] == ["early_return"]
    proc = _cli(
        "generate", "--out", str(tmp_path / "bad"), "--count", "1", "--seed", "0", "--families", "nope"
    )
    assert proc.returncode == 2 and "nope" in proc.stderr


@pytest.mark.slow
def test_cli_solve(tmp_path):
    task = generate_task(5, 1, tmp_path, "train")
    proc = _cli("solve", "--task", str(task.path))
    assert proc.returncode == 0, proc.stderr
    *conversation, last = proc.stdout.strip().splitlines()
    summary = json.loads(last)
    assert summary["reward"] == 1.0 and summary["instance_id"] == task.instance_id
    text = "\n".join(conversation)
    assert "### system" in text and "### user" in text and "-> search_replace" in text
    assert task.problem_statement.splitlines()[0] in text
