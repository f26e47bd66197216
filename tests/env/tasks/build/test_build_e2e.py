"""End to end: `python -m env.tasks build --repo` on a tiny src/-layout project, then every written task
checked by running its test_cmd in the sandbox, in its environment, before and after the gold patch; and the
same build again gives the same tasks. A real PyPI package (tests inside the package) is built too."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import env.sandbox as sandbox
from env.sandbox.slots import is_root
from env.tasks import environments
from env.tasks.__main__ import main
from env.tasks.build.sources import BuildError, download_sdist
from env.tasks.diffs import apply_patch

pytestmark = pytest.mark.skipif(not is_root(), reason="the sandbox's slot uids and mounts need root")

PROJECT = {
    "pyproject.toml": '[project]\nname = "minicalc"\nversion = "0.3"\ndependencies = []\n',
    "src/minicalc/__init__.py": (
        "from minicalc.ops import clamp, mean, window\nfrom minicalc.text import slug\n"
    ),
    "src/minicalc/ops.py": """def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    total = 0
    for v in values:
        total += v
    return total / len(values)


def window(seq, n):
    out = []
    for i in range(len(seq) - n + 1):
        out.append(tuple(seq[i : i + n]))
    return out
""",
    "src/minicalc/text.py": """def slug(text, sep="-"):
    words = text.lower().split()
    words = [w.strip(".,!?") for w in words]
    return sep.join(w for w in words if w)
""",
    "tests/test_ops.py": """import pytest

from minicalc import clamp, mean, window


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(42, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_window():
    assert window([1, 2, 3, 4], 2) == [(1, 2), (2, 3), (3, 4)]


def test_window_whole():
    assert window("ab", 2) == [("a", "b")]
""",
    "tests/test_text.py": """from minicalc import slug


def test_slug():
    assert slug("Hello, World!") == "hello-world"


def test_slug_sep():
    assert slug("a b", sep="_") == "a_b"
""",
}


def _outcomes(output: str) -> dict[str, str]:
    """Outcomes from pytest's -rA short summary."""
    found = {}
    for line in output.splitlines():
        m = re.match(r"(PASSED|FAILED|ERROR) (\S+)", line)
        if m:
            found[m.group(2)] = m.group(1).lower()
    return found


def _run_task_tests(task_dir: Path, patch: str | None) -> dict[str, str]:
    data = json.loads((task_dir / "task.json").read_text())
    env = data["environment"]
    venv = environments.ensure(
        environments.Environment(python=env["python"], requirements=tuple(env["requirements"]), install=())
    )
    ws = sandbox.make_workspace(task_dir / "repo")
    try:
        if patch:
            apply_patch(ws, patch)
        with sandbox.Sandbox(ws, python_env=venv) as box:
            result = box.run(data["test_cmd"] + " -rA", timeout=120)
        return _outcomes(result.output)
    finally:
        sandbox.remove_workspace(ws)


def _build(tmp_path: Path, repo: Path, out: str, capsys) -> tuple[list[str], dict]:
    code = main(["build", "--repo", str(repo), "--out", str(tmp_path / out), "--count", "3", "--seed", "7"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0, lines
    return lines, json.loads(lines[-1])


def test_build_from_a_local_repo(tmp_path, capsys):
    repo = tmp_path / "minicalc"
    for rel, text in PROJECT.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    lines, summary = _build(tmp_path, repo, "a", capsys)
    assert summary["tasks"] == 3, lines
    assert sum(summary["discarded"].values()) + 3 == summary["attempts"]
    assert sum(line.startswith("[") for line in lines) == 3  # one progress line per task
    assert lines[-2].startswith("built 3 of 3 tasks")
    suite = tmp_path / "a"
    ids = sorted(p.name for p in suite.iterdir())
    assert ids == ["minicalc-0.3-0", "minicalc-0.3-1", "minicalc-0.3-2"]
    for name in ids:
        data = json.loads((suite / name / "task.json").read_text())
        assert data["test_cmd"].startswith("PYTHONPATH=src python -m pytest -q -p no:cacheprovider tests/")
        assert data["test_patch"] == "" and data["environment"]["requirements"][0].startswith("pytest==")
        assert data["metadata"]["layout"] == "src" and data["metadata"]["source"].startswith("repo:")
        changed = [ln for ln in data["patch"].splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
        assert 1 <= len(changed) <= 6
        for line in changed:
            if line.startswith("+") and line[1:].strip():
                assert line[1:].strip() not in data["problem_statement"]
        assert subprocess.run(
            ["git", "apply", "--check", "-"], input=data["patch"], text=True, cwd=suite / name / "repo"
        ).returncode == 0  # fmt: skip
        before = _run_task_tests(suite / name, None)
        after = _run_task_tests(suite / name, data["patch"])
        assert all(before[t] != "passed" for t in data["FAIL_TO_PASS"]), (name, before)
        assert all(before[t] == "passed" for t in data["PASS_TO_PASS"]), (name, before)
        assert all(after[t] == "passed" for t in data["FAIL_TO_PASS"] + data["PASS_TO_PASS"]), (name, after)
    # the same seed: the same tasks, byte for byte (repo/ included)
    _build(tmp_path, repo, "b", capsys)
    for name in ids:
        assert (suite / name / "task.json").read_text() == (tmp_path / "b" / name / "task.json").read_text()
        for f in (suite / name / "repo").rglob("*.py"):
            assert (
                f.read_bytes()
                == (tmp_path / "b" / name / "repo" / f.relative_to(suite / name / "repo")).read_bytes()
            )


def test_build_from_pypi_tests_inside_the_package(tmp_path, capsys):
    """toolz keeps its tests in toolz/tests/; the sdist is cached, so only the first run downloads it."""
    try:
        download_sdist("toolz", "1.0.0", log=lambda _: None)
    except BuildError as e:
        pytest.skip(f"PyPI not reachable: {e}")
    out = tmp_path / "toolz"
    code = main(["build", "--pypi", "toolz==1.0.0", "--out", str(out), "--count", "2", "--seed", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and json.loads(lines[-1])["tasks"] == 2, lines
    for task in sorted(out.iterdir()):
        data = json.loads((task / "task.json").read_text())
        assert data["metadata"]["layout"] == "package"
        assert all(t.startswith("toolz/tests/") for t in data["FAIL_TO_PASS"] + data["PASS_TO_PASS"])
        assert data["test_cmd"].startswith("python -m pytest -q -p no:cacheprovider toolz/tests/")
    shutil.rmtree(out)
