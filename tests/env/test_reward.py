"""Grading: the gold patch scores 1, the buggy repository 0, and edited, deleted or sidestepped tests earn
nothing. Each cheat is first shown to fool a plain test run of the same workspace, so the test proves that
grading's restoration (not the cheat's failure) is what stops it."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from payloads import PASS_EVERYTHING_CONFTEST

from env.reward import changed_files, grade, patch_similarity, read_outcomes, restore, source_diff
from env.tasks import generate_task
from env.tasks.diffs import apply_patch


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return generate_task(2, 2, tmp_path_factory.mktemp("tasks"), "train")


def _workspace(task, tmp_path: Path, *, fixed: bool) -> Path:
    ws = Path(shutil.copytree(task.repo, tmp_path / "ws"))
    if fixed:
        apply_patch(ws, task.patch)
    return ws


def _plain_run(task, ws: Path) -> dict[str, str]:
    """Outcomes of test_cmd run as is in `ws` (no restoration, no sandbox; the payloads here are benign)."""
    probe = Path(shutil.copytree(ws, ws.parent / "plain"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    subprocess.run(["bash", "-c", task.test_cmd], cwd=probe, env=env, capture_output=True, timeout=120)
    try:
        return read_outcomes(task, probe)
    finally:
        shutil.rmtree(probe)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_gold_scores_one_and_buggy_zero(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=False)
    result = grade(task, ws)
    assert result.reward == 0.0
    assert {result.tests[t] for t in task.FAIL_TO_PASS} == {"failed"}
    assert {result.tests[t] for t in task.PASS_TO_PASS} == {"passed"}
    assert result.components["fail_to_pass"] == 0.0 and result.components["pass_to_pass"] == 1.0
    assert result.components["patch_similarity"] == 0.0
    assert "failed" in result.output

    before = _snapshot(ws)
    apply_patch(ws, task.patch)
    fixed = _snapshot(ws)
    result = grade(
        task, ws, edited_files=[task.metadata["bug"]["file"]], tool_errors=2, first_edit_after_read=True
    )
    assert result.reward == 1.0
    assert set(result.tests.values()) == {"passed"} and set(result.tests) == set(task.tests)
    assert result.components["tool_errors"] == 2.0
    assert result.components["edited_unrelated_files"] == 0.0
    assert result.components["searched_or_read_before_edit"] == 1.0
    assert result.components["tamper_suspected"] == 0.0 and result.components["timed_out"] == 0.0
    assert result.components["patch_similarity"] == 1.0
    assert _snapshot(ws) == fixed != before  # grading worked on a copy
    assert "searched_or_read_before_edit" not in grade(task, ws).components  # unknown: absent


def _changed_lines(patch: str, sign: str) -> list[str]:
    return [
        line[1:] for line in patch.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)
    ]


def test_patch_similarity_ranks_edits_by_how_near_they_come_to_the_gold_patch(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=False)
    assert source_diff(task, ws) == "" and patch_similarity(task, ws) == 0.0
    bug_file = ws / task.metadata["bug"]["file"]
    original = bug_file.read_text()
    # A wrong change on the line the gold patch changes, and one on the file's first line.
    line = _changed_lines(task.patch, "-")[0]
    bug_file.write_text(original.replace(line, line + "  # changed", 1))
    right_place = patch_similarity(task, ws)
    first = original.splitlines(keepends=True)[0]
    bug_file.write_text(original.replace(first, "# changed\n" + first, 1))
    elsewhere = patch_similarity(task, ws)
    assert 1.0 > right_place > elsewhere > 0.0
    # Edits to the tests and new files under them are not the source diff; the gold patch scores 1.
    bug_file.write_text(original)
    test_file = next(p for p in (ws / "tests").rglob("*.py"))
    test_file.write_text(test_file.read_text() + "\n# notes\n")
    (ws / "tests" / "conftest.py").write_text("x = 1\n")
    assert patch_similarity(task, ws) == 0.0
    apply_patch(ws, task.patch)
    assert source_diff(task, ws) == task.patch and patch_similarity(task, ws) == 1.0
    # A sprawling change scores low, however large.
    (ws / "sprawl.py").write_text("x = 1\n" * 100_000)
    assert patch_similarity(task, ws) < 0.25


def test_weakened_tests_earn_nothing(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=False)
    for path in (ws / "tests").glob("test_*.py"):
        path.write_text(
            re.sub(r"assert result (==|is) .*", "assert result is not NotImplemented", path.read_text())
        )
    assert set(_plain_run(task, ws).values()) == {"passed"}  # the edit fools a plain run
    result = grade(task, ws)
    assert result.reward == 0.0 and {result.tests[t] for t in task.FAIL_TO_PASS} == {"failed"}
    assert "[grading] restored tests/" in result.output


def test_deleted_tests_are_restored(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=True)
    shutil.rmtree(ws / "tests")
    assert set(_plain_run(task, ws).values()) == {"missing"}
    assert grade(task, ws).reward == 1.0  # the tests come back and the fix passes them
    ws_buggy = _workspace(task, tmp_path / "b", fixed=False)
    for path in (ws_buggy / "tests").glob("test_*.py"):
        path.unlink()
    result = grade(task, ws_buggy)
    assert result.reward == 0.0 and {result.tests[t] for t in task.FAIL_TO_PASS} == {"failed"}


@pytest.mark.parametrize("where", ["conftest.py", "tests/conftest.py"])
def test_conftest_that_passes_everything(task, tmp_path, where):
    ws = _workspace(task, tmp_path, fixed=False)
    (ws / where).write_text(PASS_EVERYTHING_CONFTEST)
    assert set(_plain_run(task, ws).values()) == {"passed"}
    result = grade(task, ws)
    assert result.reward == 0.0 and {result.tests[t] for t in task.FAIL_TO_PASS} == {"failed"}
    assert f"[grading] removed {where}" in result.output


def test_config_plugin_and_shadowing_module(task, tmp_path):
    # pytest.ini loads a plugin from the workspace (kept out of the package, so no source file is flagged).
    ws = _workspace(task, tmp_path, fixed=False)
    (ws / "pytest.ini").write_text("[pytest]\naddopts = -p passall\n")
    (ws / "passall.py").write_text(PASS_EVERYTHING_CONFTEST)
    assert set(_plain_run(task, ws).values()) == {"passed"}
    result = grade(task, ws)
    assert result.reward == 0.0 and "[grading] removed pytest.ini" in result.output

    # A pytest.py at the root is what `python -m pytest` would run.
    ws = _workspace(task, tmp_path / "b", fixed=False)
    cases = "".join(_case(t) for t in task.tests)
    (ws / "pytest.py").write_text(
        f"open('.junit.xml', 'w').write('<testsuites><testsuite>{cases}</testsuite></testsuites>')\n"
    )
    assert set(_plain_run(task, ws).values()) == {"passed"}
    result = grade(task, ws)
    assert result.reward == 0.0
    assert "removed pytest.py (shadows an installed module)" in result.output


def _case(node: str, body: str = "") -> str:
    """A junit <testcase> element for pytest node id `node`."""
    path, name = node.split("::")
    return f'<testcase classname="{path[:-3].replace("/", ".")}" name="{name}">{body}</testcase>'


def test_tampering_source_scores_zero(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=True)
    init = ws / task.metadata["package"] / "__init__.py"
    init.write_text("import atexit  # noqa\n" + init.read_text())
    result = grade(task, ws)
    assert set(result.tests.values()) == {"passed"}
    assert result.reward == 0.0 and result.components["tamper_suspected"] == 1.0


def test_broken_package_and_unrelated_edits(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=True)
    (ws / "scratch.py").write_text("print('trying things')\n")
    result = grade(task, ws, edited_files=None)
    assert result.reward == 1.0 and result.components["edited_unrelated_files"] == 1.0
    bug_file = task.metadata["bug"]["file"]
    result = grade(task, ws, edited_files=[bug_file, "/workspace/scratch.py", "tests/test_x.py"])
    assert result.components["edited_unrelated_files"] == 2.0
    (ws / bug_file).write_text("def broken(:\n")
    result = grade(task, ws)
    assert result.reward == 0.0 and "passed" not in set(result.tests[t] for t in task.FAIL_TO_PASS)


def test_special_files_do_not_stop_grading(task, tmp_path):
    ws = _workspace(task, tmp_path, fixed=True)
    os.mkfifo(ws / "pipe.py")  # reading or copying it would block or fail
    os.symlink("/dev/zero", ws / task.metadata["package"] / "zero.py")
    result = grade(task, ws)
    assert result.reward == 1.0
    assert "not copied (not a regular file): pipe.py" in result.output
    assert result.components["edited_unrelated_files"] == 2.0


def test_restore_is_safe_with_symlinks(task, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = _workspace(task, tmp_path, fixed=False)
    shutil.rmtree(ws / "tests")
    os.symlink(outside, ws / "tests")  # writing the tests back must not write through this link
    (ws / ".junit.xml").write_text("<testsuites/>")
    os.makedirs(ws / "__pycache__")
    (ws / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"forged")
    notes = restore(task, ws)
    assert list(outside.iterdir()) == []
    assert not (ws / "tests").is_symlink() and (ws / "tests").is_dir()
    assert changed_files(task.repo, ws) == []  # report, caches gone; tests back
    assert notes


def test_read_outcomes(task, tmp_path):
    f2p, p2p = task.FAIL_TO_PASS[0], task.PASS_TO_PASS[0]

    (tmp_path / ".junit.xml").write_text(
        "<testsuites><testsuite>"
        + _case(f2p, '<failure message="x"/>')
        + _case(p2p)
        + _case(p2p, '<error message="teardown"/>')  # a second report of the same test: the worse counts
        + _case("tests/test_other.py::test_extra")
        + "</testsuite></testsuites>"
    )
    outcomes = read_outcomes(task, tmp_path)
    assert outcomes[f2p] == "failed" and outcomes[p2p] == "error"
    assert set(outcomes) == set(task.tests)
    assert all(outcomes[t] == "missing" for t in task.tests if t not in (f2p, p2p))
    (tmp_path / ".junit.xml").write_text("<not xml")
    assert set(read_outcomes(task, tmp_path).values()) == {"missing"}
