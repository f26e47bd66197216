"""Grading real-project layouts: tests at the root (`tests/`), inside the package (`pkg/tests/` and
`pkg/test_x.py` beside the source) and a `src/` layout, each with a plain `python -m pytest` test_cmd (the
grader collects the outcomes itself). In each, the gold patch scores 1 and the empty patch 0, and tampering
with a test file or adding a conftest.py is undone, while the package's source is never restored.

The repositories are built here, tiny, and run with the project's interpreter (no `environment`)."""

import json
import shutil
from pathlib import Path

import pytest
from payloads import PASS_EVERYTHING_CONFTEST

from env.outcomes import parse_summary
from env.reward import grade, protected_files, read_outcomes
from env.tasks.diffs import apply_patch, make_diff
from env.tasks.task import Task, load_task, save_task

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
FIXED = BUGGY.replace("return a - b", "return a + b")
TESTS = """import pytest

from calc.core import add, neg


def test_add():
    assert add(2, 3) == 5


def test_neg():
    assert neg(2) == -2


class TestAdd:
    @pytest.mark.parametrize("a, b", [(1, 0), (-1, 1)])
    def test_zero(self, a, b):
        assert add(a, 0) == a and add(0, b) == b
"""
INLINE = "from calc.core import neg\n\n\ndef test_neg_twice():\n    assert neg(neg(3)) == 3\n"
WEAKENED = "def test_add():\n    pass\n\n\ndef test_neg():\n    pass\n"

# layout -> (source file, {test file: text}, test_cmd, extra repository files)
LAYOUTS = {
    "root": ("calc/core.py", {"tests/test_core.py": TESTS}, "python -m pytest -q tests", {}),
    "in_package": (
        "calc/core.py",
        {"calc/tests/test_core.py": TESTS, "calc/test_inline.py": INLINE},
        "python -m pytest -q calc",
        {"calc/tests/__init__.py": "", "calc/tests/helpers.py": "TWO = 2\n"},
    ),
    "src": (
        "src/calc/core.py",
        {"tests/test_core.py": TESTS},
        "python -m pytest -q tests",
        {"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n'},
    ),
}


def _make_task(root: Path, layout: str) -> Task:
    source, tests, test_cmd, extra = LAYOUTS[layout]
    path = root / layout
    repo = path / "repo"
    files = {source: BUGGY, str(Path(source).parent / "__init__.py"): "", **tests, **extra}
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    main = next(iter(tests))
    f2p = [f"{main}::test_add", f"{main}::TestAdd::test_zero[-1-1]"]
    p2p = [f"{main}::test_neg", f"{main}::TestAdd::test_zero[1-0]"]
    p2p += [f"{t}::test_neg_twice" for t in tests if t.endswith("test_inline.py")]
    task = Task(
        instance_id=layout,
        problem_statement="add(2, 3) returns -1, expected 5",
        test_cmd=test_cmd,
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        patch=make_diff(source, BUGGY, FIXED),
        test_patch="",
        timeout_s=60,
        path=path,
    )
    save_task(task)
    # As SWE-bench ships them: node ids as JSON strings, and fields of its own.
    data = json.loads((path / "task.json").read_text())
    data.update(FAIL_TO_PASS=json.dumps(f2p), PASS_TO_PASS=json.dumps(p2p), repo="calc/calc", version="1.0")
    del data["metadata"]
    (path / "task.json").write_text(json.dumps(data))
    return load_task(path)


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def task(request, tmp_path_factory):
    return _make_task(tmp_path_factory.mktemp("tasks"), request.param)


def _workspace(task: Task, tmp_path: Path, *, fixed: bool) -> Path:
    ws = Path(shutil.copytree(task.repo, tmp_path / "ws"))
    if fixed:
        apply_patch(ws, task.patch)
    return ws


def test_gold_scores_one_and_empty_patch_zero(task, tmp_path):
    assert task.metadata == {"repo": "calc/calc", "version": "1.0"}
    result = grade(task, _workspace(task, tmp_path / "empty", fixed=False))
    assert result.reward == 0.0, result.output
    assert {result.tests[t] for t in task.FAIL_TO_PASS} == {"failed"}
    assert {result.tests[t] for t in task.PASS_TO_PASS} == {"passed"}
    result = grade(task, _workspace(task, tmp_path / "gold", fixed=True))
    assert result.reward == 1.0, result.output
    assert set(result.tests.values()) == {"passed"}
    assert result.components["patch_similarity"] == 1.0
    assert "[grading] restored" not in result.output  # the fix is source: nothing put back over it


def test_tampered_tests_and_an_added_conftest_are_undone(task, tmp_path):
    source = LAYOUTS[task.instance_id][0]
    for i, test_file in enumerate(LAYOUTS[task.instance_id][1]):
        ws = _workspace(task, tmp_path / f"weak{i}", fixed=False)
        (ws / test_file).write_text(WEAKENED + "\n\nclass TestAdd:\n    def test_zero(self):\n        pass\n")
        result = grade(task, ws)
        assert result.reward == 0.0 and f"[grading] restored {test_file}" in result.output
        assert f"restored {source}" not in result.output

        ws = _workspace(task, tmp_path / f"conftest{i}", fixed=False)
        conftest = str(Path(test_file).parent / "conftest.py")
        (ws / conftest).write_text(PASS_EVERYTHING_CONFTEST)
        result = grade(task, ws)
        assert result.reward == 0.0 and f"[grading] removed {conftest}" in result.output

    # Deleted tests come back; a new test file beside them goes; the fixed source and a new source file stay.
    ws = _workspace(task, tmp_path / "deleted", fixed=True)
    for test_file in LAYOUTS[task.instance_id][1]:
        (ws / test_file).unlink()
    main_dir = Path(next(iter(LAYOUTS[task.instance_id][1]))).parent
    (ws / main_dir / "test_fake.py").write_text("def test_fake():\n    pass\n")
    (ws / Path(source).parent / "extra.py").write_text("X = 1\n")
    result = grade(task, ws)
    assert result.reward == 1.0, result.output
    assert f"[grading] removed {main_dir / 'test_fake.py'}" in result.output
    assert "extra.py" not in result.output


def test_layout_restores_tests_never_source(task):
    layout = protected_files(task)
    source = LAYOUTS[task.instance_id][0]
    assert not layout.covers(source) and not layout.covers(str(Path(source).parent / "__init__.py"))
    assert not layout.covers(str(Path(source).parent / "new_module.py"))
    for test_file in LAYOUTS[task.instance_id][1]:
        assert layout.covers(test_file) and layout.covers(str(Path(test_file).parent / "conftest.py"))
    if task.instance_id == "in_package":
        assert layout.test_dirs == ("calc/tests",) and layout.mixed_dirs == {"calc"}
        assert layout.covers("calc/tests/helpers.py") and layout.covers("calc/test_new.py")
    else:
        assert layout.test_dirs == ("tests",)


def test_a_directory_the_gold_patch_touches_is_not_a_test_directory(tmp_path):
    # Source in a directory named like a test directory (a package's `testing` module).
    gold = make_diff("pkg/testing/util.py", "a\n", "b\n")
    task = Task("t", "", "pytest", ["pkg/testing/test_a.py::test_a"], [], gold, "", 10, tmp_path)
    layout = protected_files(task)
    assert layout.test_dirs == () and layout.mixed_dirs == {"pkg/testing"}
    assert layout.covers("pkg/testing/test_a.py") and not layout.covers("pkg/testing/util.py")
    # A doctest node names a source module: the gold patch changes it, so it is not restored.
    task.FAIL_TO_PASS = ["pkg/testing/util.py::pkg.testing.util.f"]
    assert not protected_files(task).covers("pkg/testing/util.py")


def test_outcomes_from_the_short_summary_when_no_report_is_written(tmp_path):
    # test_cmd clears PYTEST_ADDOPTS: no junit report, so the `-rA` summary is read.
    task = _make_task(tmp_path, "root")
    task.test_cmd = "env -u PYTEST_ADDOPTS python -m pytest -q -rA tests"
    ws = _workspace(task, tmp_path, fixed=True)
    result = grade(task, ws)
    assert result.reward == 1.0 and "short test summary info" in result.output
    (ws / "calc" / "core.py").write_text(BUGGY.replace("a - b", "a * b"))
    result = grade(task, ws)
    assert result.reward == 0.0 and result.tests[task.FAIL_TO_PASS[0]] == "failed"
    assert result.tests[task.PASS_TO_PASS[0]] == "passed"


def test_parse_summary():
    nodes = ["t.py::test_a", "t.py::test_p[a - b]", "t.py::test_c", "t.py::test_d", "t.py::test_e"]
    output = (
        "PASSED t.py::test_e\n"  # printed by a test before the summary: does not count
        "=========================== short test summary info ============================\n"
        "PASSED t.py::test_a\n"
        "FAILED t.py::test_p[a - b] - AssertionError: x - y\n"
        "PASSED t.py::test_c\n"
        "ERROR t.py::test_c - teardown failed\n"
        "XFAIL t.py::test_d - reason\n"
        "PASSED t.py::test_other\n"
        "======================== 2 passed, 1 failed in 0.01s =========================\n"
    )
    assert parse_summary(output, nodes) == {
        "t.py::test_a": "passed",
        "t.py::test_p[a - b]": "failed",
        "t.py::test_c": "error",
        "t.py::test_d": "skipped",
        "t.py::test_e": "missing",
    }
    assert set(parse_summary("PASSED t.py::test_a\n", nodes).values()) == {"missing"}


def test_junit_names_of_nested_and_parametrized_ids(tmp_path):
    nodes = ["src/pkg/tests/test_x.py::TestC::test_y[a::b/c.py]", "pkg/test_x.py::test_z"]
    task = Task("t", "", "pytest", nodes, [], "", "", 10, tmp_path)
    report = (
        b"<testsuites><testsuite>"
        b'<testcase classname="src.pkg.tests.test_x.TestC" name="test_y[a::b/c.py]"><failure/></testcase>'
        b'<testcase classname="pkg.test_x" name="test_z"/>'
        b"</testsuite></testsuites>"
    )
    assert read_outcomes(task, tmp_path, report) == {nodes[0]: "failed", nodes[1]: "passed"}
    assert set(read_outcomes(task, tmp_path, b"<not xml", "").values()) == {"missing"}
