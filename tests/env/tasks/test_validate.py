"""`python -m env.tasks validate`: valid tasks pass, each kind of broken task is named."""

import json
import shutil

import pytest

from env.tasks import generate_suite, load_task, save_task
from env.tasks.__main__ import main as tasks_main
from env.tasks.validate import is_test_path, validate_task


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate") / "suite"
    generate_suite(out, 2, 0, 1, "train")
    return out


def _copy(suite, tmp_path):
    """A copy of the suite's first task, to break."""
    src = sorted(p for p in suite.iterdir() if p.is_dir())[0]
    shutil.copytree(src, tmp_path / src.name)
    return load_task(tmp_path / src.name)


def test_a_generated_suite_is_valid(suite, capsys):
    assert tasks_main(["validate", str(suite), "--workers", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["tasks"] == 2 and out["valid"] == 2 and out["invalid"] == {}
    assert sum(" ok" in line for line in lines) == 4  # a progress line and a table row per task


def test_a_gold_patch_that_does_not_fix_fails(suite, tmp_path, capsys):
    task = _copy(suite, tmp_path)
    task.patch = ""
    save_task(task)
    v = validate_task(task)
    assert "gold" in v.failed and v.gold == (0.0, 0.0)
    assert tasks_main(["validate", str(tmp_path)]) == 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["invalid"] == {
        task.instance_id: ["gold"]
    }


def test_an_already_fixed_repository_fails_empty(suite, tmp_path):
    task = _copy(suite, tmp_path)
    from env.tasks.diffs import apply_patch

    apply_patch(task.repo, task.patch)  # the shipped repo has no bug; the gold patch then cannot apply
    assert validate_task(task).failed[0] == "empty"


def test_a_statement_showing_the_fix_or_a_patch_editing_tests_fails(suite, tmp_path):
    task = _copy(suite, tmp_path)
    lines = task.patch.splitlines()
    added = next(s[1:] for s in lines if s.startswith("+") and not s.startswith("+++") and s[1:].strip())
    task.problem_statement += f"\nHint: write `{added.strip()}`."
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    task.patch += (
        f"diff --git a/{test_file} b/{test_file}\n--- a/{test_file}\n+++ b/{test_file}\n"
        f"@@ -1,0 +1,1 @@\n+# changed\n"
    )
    v = validate_task(task)
    assert "statement" in v.failed and "tests" in v.failed


@pytest.mark.parametrize(
    "path, is_test",
    [
        ("tests/test_a.py", True),
        ("pkg/tests/helpers.py", True),
        ("pkg/test_core.py", True),
        ("pkg/core_test.py", True),
        ("src/pkg/conftest.py", True),
        ("pkg/core.py", False),
        ("src/pkg/testing_utils.py", False),
    ],
)
def test_test_paths(suite, path, is_test):
    task = load_task(sorted(p for p in suite.iterdir() if p.is_dir())[0])
    assert is_test_path(path, task) is is_test
