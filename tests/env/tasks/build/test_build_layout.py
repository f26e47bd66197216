"""Layout detection of the real-project builder, sources (metadata, copies) and the problem statement."""

import random
from pathlib import Path

import pytest

from env.tasks.build import coverage, layout, sources, statement
from env.tasks.build.sources import BuildError
from env.tasks.diffs import make_diff


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_tests_at_the_root(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "", "tests/test_a.py": "", "setup.py": "", "docs/conf.py": ""})
    found = layout.detect(root)
    assert found == layout.Layout("root", ("tests",), None)
    assert found.env_prefix == ""
    assert layout.source_files(root, found) == ["pkg/__init__.py"]


def test_test_modules_at_the_root(tmp_path):
    root = _tree(tmp_path, {"mod.py": "", "test_mod.py": "", "conftest.py": ""})
    found = layout.detect(root)
    assert found.kind == "root" and found.tests == ("test_mod.py",)
    assert layout.source_files(root, found) == ["mod.py"]


def test_tests_inside_the_package(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core.py": "",
            "pkg/tests/__init__.py": "",
            "pkg/tests/test_core.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/test_sub.py": "",
            "pkg/sub/impl.py": "",
        },
    )
    found = layout.detect(root)
    assert found == layout.Layout("package", ("pkg/sub/test_sub.py", "pkg/tests"), None)
    assert layout.source_files(root, found) == [
        "pkg/__init__.py",
        "pkg/core.py",
        "pkg/sub/__init__.py",
        "pkg/sub/impl.py",
    ]


def test_src_layout(tmp_path):
    root = _tree(tmp_path, {"src/pkg/__init__.py": "", "tests/test_pkg.py": "", "tests/conftest.py": ""})
    found = layout.detect(root)
    assert found == layout.Layout("src", ("tests",), "src")
    assert found.env_prefix == "PYTHONPATH=src "
    assert layout.source_files(root, found) == ["src/pkg/__init__.py"]


def test_src_layout_with_tests_inside_the_package(tmp_path):
    root = _tree(tmp_path, {"src/pkg/__init__.py": "", "src/pkg/tests/test_x.py": ""})
    assert layout.detect(root) == layout.Layout("src", ("src/pkg/tests",), "src")


def test_no_tests_is_a_clear_error(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "", "README.md": ""})
    with pytest.raises(BuildError, match="ships no tests"):
        layout.detect(root, name="pkg")


def test_overrides(tmp_path):
    root = _tree(tmp_path, {"lib/pkg/__init__.py": "", "checks/check_pkg.py": ""})
    found = layout.detect(root, tests=("checks/check_pkg.py",), pythonpath="lib")
    assert found.tests == ("checks/check_pkg.py",) and found.env_prefix == "PYTHONPATH=lib "
    with pytest.raises(BuildError, match="no such file"):
        layout.detect(root, tests=("nope",))


def test_copy_and_metadata(tmp_path):
    src = _tree(
        tmp_path / "src",
        {
            "pyproject.toml": '[project]\nname = "demo"\nversion = "1.2"\n'
            'dependencies = ["six>=1", "typing_extensions; python_version < \'3.0\'"]\n',
            "demo/__init__.py": "",
            "demo/__pycache__/x.pyc": "",
            ".git/HEAD": "",
            "demo.egg-info/PKG-INFO": "",
        },
    )
    project = sources.from_repo(src, tmp_path / "copy")
    assert project.name == "demo" and project.dependencies == ("six>=1",)
    assert project.source == f"repo:{src.resolve()}"
    assert sorted(p.relative_to(project.root).as_posix() for p in project.root.rglob("*")) == [
        "demo",
        "demo/__init__.py",
        "pyproject.toml",
    ]


def test_pinned_spec():
    assert sources.parse_spec("toolz==1.0.0") == ("toolz", "1.0.0")
    with pytest.raises(BuildError, match="pinned"):
        sources.parse_spec("toolz>=1")


def test_gradable_ids():
    assert coverage.gradable("tests/test_a.py::test_x")
    assert coverage.gradable("tests/test_a.py::TestA::test_x[1-a/b]")
    assert not coverage.gradable("tests/test_a.py::test_url[http://[::1]:80/]")  # '::' in a parameter
    assert not coverage.gradable("tests/test_a.py")


FAILURE = {
    "exc": "AssertionError",
    "message": "assert 'ab' == 'a-b'\n  - a-b\n  + ab",
    "test_line": "assert join('a', 'b') == 'a-b'",
    "test_lineno": 7,
}


def test_statement_shows_the_failure_not_the_fix():
    original = "def join(a, b):\n    return a + '-' + b\n"
    mutated = "def join(a, b):\n    return a + b\n"
    patch = make_diff("pkg/text.py", mutated, original)
    failing = ["tests/test_text.py::test_join", "tests/test_text.py::test_join_many"]
    failures = {failing[0]: FAILURE}
    text = statement.write(
        random.Random(0), failing, failures, ["tests/test_text.py"], 5, patch, "/workspace"
    )
    assert "tests/test_text.py::test_join" in text and "assert 'ab' == 'a-b'" in text
    assert "tests/test_text.py:7: assert join('a', 'b') == 'a-b'" in text
    assert "2 tests fail" in text and "other 5 tests" in text
    assert statement.leaks(text, patch) == []
    assert "return a + '-' + b" not in text and "pkg/text.py" not in text
    assert text == statement.write(
        random.Random(0), failing, failures, ["tests/test_text.py"], 5, patch, "/workspace"
    )


def test_statement_drops_lines_holding_an_added_line():
    original = "def f(x):\n    return x.upper()\n"
    mutated = "def f(x):\n    return x\n"
    patch = make_diff("m.py", mutated, original)
    failure = dict(FAILURE, message="expected return x.upper() to be called\nsecond line", test_lineno=None)
    text = statement.write(
        random.Random(1), ["t.py::test_f"], {"t.py::test_f": failure}, ["t.py"], 0, patch, "/ws"
    )
    assert statement.added_lines(patch) == ["return x.upper()"]
    assert "return x.upper()" not in text and "second line" in text
    assert statement.leaks("... return x.upper() ...", patch) == ["return x.upper()"]


def test_statement_removes_the_workspace_path():
    failure = dict(FAILURE, exc="FileNotFoundError", message="/workspace/data/x.txt missing")
    text = statement.write(random.Random(0), ["t.py::a"], {"t.py::a": failure}, ["t.py"], 1, "", "/workspace")
    assert "FileNotFoundError: data/x.txt missing" in text and "/workspace" not in text


def test_statement_leaves_out_what_changes_between_runs():
    failure = dict(
        FAILURE,
        message="assert <a.B object at 0x7f3a2b1c9d10> == <test_x...x7ff87393e990>\n"
        "/tmp/pytest-of-20001/pytest-7/test_a0/out.txt",
    )
    text = statement.write(random.Random(0), ["t.py::a"], {"t.py::a": failure}, ["t.py"], 1, "", "/workspace")
    assert "<a.B object at 0x...> == <test_x...>" in text and "/tmp/pytest/test_a0/out.txt" in text
