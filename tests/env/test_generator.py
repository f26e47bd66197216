"""The task generator: determinism, coverage of the bug families, verification with real pytest, bug reports
that do not give the fix away, gold patches that standard tools apply, and the bug families themselves."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from env.tasks import (
    FAMILIES,
    HELDOUT_SEEDS,
    TRAIN_SEEDS,
    generate_suite,
    generate_task,
    load_task,
    split_seed,
    verify,
)
from env.tasks.diffs import apply_patch, make_tree_diff, patch_paths
from env.tasks.families import mutations


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """One task per family, difficulties 1, 2, 3 in turn; and the mean seconds per task."""
    out = tmp_path_factory.mktemp("suite")
    t0 = time.perf_counter()
    tasks = [generate_task(split_seed("train", i), 1 + i % 3, out, "train") for i in range(len(FAMILIES))]
    return tasks, (time.perf_counter() - t0) / len(tasks)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_by_seed(tmp_path):
    a = generate_task(11, 3, tmp_path / "a", "train")
    b = generate_task(11, 3, tmp_path / "b", "train")
    assert (a.path / "task.json").read_bytes() == (b.path / "task.json").read_bytes()
    assert _tree(a.repo) == _tree(b.repo)
    c = generate_task(12, 3, tmp_path / "a", "train")
    assert c.instance_id != a.instance_id
    assert _tree(c.repo) != _tree(a.repo) and c.problem_statement != a.problem_statement
    # Generating again over an existing task directory rewrites it identically.
    again = generate_task(11, 3, tmp_path / "a", "train")
    assert _tree(again.repo) == _tree(b.repo)


def test_deterministic_across_processes(tmp_path):
    """No dependence on string hashing (set order) or anything else that differs between interpreters."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys; from env.tasks import generate_task; generate_task(7, 2, sys.argv[1], 'train')"
    trees = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
        out = tmp_path / hash_seed
        subprocess.run([sys.executable, "-c", code, str(out)], env=env, check=True, cwd=root, timeout=120)
        trees.append(_tree(out))
    assert trees[0] == trees[1] == _tree(generate_task(7, 2, tmp_path / "here", "train").path.parent)


def test_relative_output_directory(tmp_path, monkeypatch):
    """launch.py's default workdir is relative (runs/...): generating into it works as into an absolute."""
    monkeypatch.chdir(tmp_path)
    task = generate_task(0, 1, Path("runs") / "tasks", "train")
    assert verify(task) is None
    assert _tree(task.repo) == _tree(generate_task(0, 1, tmp_path / "abs", "train").repo)


def test_splits_are_disjoint(tmp_path):
    assert set(TRAIN_SEEDS).isdisjoint(HELDOUT_SEEDS)
    assert split_seed("train", 0) in TRAIN_SEEDS and split_seed("heldout", 0) in HELDOUT_SEEDS
    with pytest.raises(ValueError):
        generate_task(split_seed("heldout", 0), 1, tmp_path, "train")
    with pytest.raises(ValueError):
        split_seed("test", 0)
    task = generate_task(split_seed("heldout", 4), 1, tmp_path, "heldout")
    assert task.metadata["split"] == "heldout"


def test_suite_of_chosen_families(tmp_path):
    """A suite restricted to some bug families holds only those, in seed order, as many as asked; the same
    seeds give the same tasks as an unrestricted suite; an unknown family is refused by name."""
    chosen = ("missing_return", "early_return")
    tasks = generate_suite(tmp_path / "some", 3, seed=0, difficulty=1, split="heldout", families=chosen)
    assert len(tasks) == 3
    assert {t.metadata["family"] for t in tasks} <= set(chosen)
    seeds = [t.metadata["seed"] for t in tasks]
    assert seeds == sorted(seeds) and len(set(seeds)) == 3
    first = generate_task(seeds[0], 1, tmp_path / "one", "heldout")
    assert (first.path / "task.json").read_bytes() == (tasks[0].path / "task.json").read_bytes()
    assert json.loads((tmp_path / "some" / "suite.json").read_text())["families"] == sorted(chosen)
    with pytest.raises(ValueError, match="no_such_family"):
        generate_suite(tmp_path / "bad", 1, seed=0, difficulty=1, families=("no_such_family",))


def test_every_family_and_task_shape(suite):
    tasks, seconds = suite
    assert {t.metadata["family"] for t in tasks} == set(FAMILIES)
    for task in tasks:
        again = load_task(task.path)  # what was written passes the loader
        assert again.FAIL_TO_PASS == task.FAIL_TO_PASS
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert all(re.fullmatch(r"tests/test_\w+\.py::test_\w+", t) for t in task.tests)
        assert task.test_patch == "" and "--junitxml=" in task.test_cmd
        bug = task.metadata["bug"]
        # The gold patch touches only the buggy file, never a test.
        assert patch_paths(task.patch) == [bug["file"]]
        # Depth of the bug below the tested entry point grows with difficulty; below the entry point it is
        # in another module.
        depth = {1: 0, 2: 1, 3: 2}[task.metadata["difficulty"]]
        assert bug["depth"] == depth == len(bug["chain"]) - 1
        if depth:
            assert bug["chain"][0]["file"] != bug["file"]
    assert seconds < 3.0  # about 0.3 s here when the machine is quiet


def _junit_outcomes(repo: Path, junit: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "tests"]
    subprocess.run(cmd, cwd=repo, env=env, capture_output=True, timeout=60)
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        node = case.get("classname").replace(".", "/") + ".py::" + case.get("name")
        out[node] = "failed" if any(c.tag in ("failure", "error") for c in case) else "passed"
    return out


def test_verified_with_real_pytest(suite, tmp_path):
    """The buggy repository fails exactly FAIL_TO_PASS under pytest, the gold patch passes everything."""
    tasks, _ = suite
    for task in tasks[:4]:
        assert verify(task) is None
        buggy = tmp_path / task.instance_id / "buggy"
        shutil.copytree(task.repo, buggy)
        outcomes = _junit_outcomes(buggy, tmp_path / "buggy.xml")
        assert {t for t, s in outcomes.items() if s == "failed"} == set(task.FAIL_TO_PASS)
        assert {t for t, s in outcomes.items() if s == "passed"} == set(task.PASS_TO_PASS)
        gold = tmp_path / task.instance_id / "gold"
        shutil.copytree(task.repo, gold)
        apply_patch(gold, task.patch)
        outcomes = _junit_outcomes(gold, tmp_path / "gold.xml")
        assert set(outcomes) == set(task.tests) and set(outcomes.values()) == {"passed"}


def test_verify_catches_a_broken_task(suite, tmp_path):
    tasks, _ = suite
    task = load_task(shutil.copytree(tasks[1].path, tmp_path / "t"))
    # A passing test claimed to fail, a failing one claimed to pass.
    task.FAIL_TO_PASS, task.PASS_TO_PASS = task.PASS_TO_PASS[:1], task.FAIL_TO_PASS + task.PASS_TO_PASS[1:]
    assert verify(task) == "buggy repository fails other tests than FAIL_TO_PASS"
    task = load_task(tmp_path / "t")
    # The fix already in place: the "buggy" repository passes everything.
    (task.repo / task.metadata["bug"]["file"]).write_text(_gold_text(task))
    assert verify(task).startswith("gold patch does not apply")


def _gold_text(task) -> str:
    root = Path(shutil.copytree(task.repo, task.path / "gold_copy"))
    apply_patch(root, task.patch)
    text = (root / task.metadata["bug"]["file"]).read_text()
    shutil.rmtree(root)
    return text


def test_patches_apply_with_git_and_patch(suite, tmp_path):
    tasks, _ = suite
    for task in tasks[:3]:
        for tool in (["git", "apply", "--check", "-"], ["patch", "-p1", "--dry-run", "-s"]):
            if shutil.which(tool[0]) is None:
                continue
            proc = subprocess.run(tool, input=task.patch, text=True, cwd=task.repo, capture_output=True)
            assert proc.returncode == 0, (tool, proc.stdout, proc.stderr)


def test_report_does_not_name_the_fix_location(suite):
    tasks, _ = suite
    for task in tasks:
        bug = task.metadata["bug"]
        statement = task.problem_statement
        assert bug["file"] not in statement and Path(bug["file"]).name not in statement
        entry = bug["chain"][0]["function"]
        name = bug["function"].split(".")[-1]
        if bug["function"] != entry:
            assert not re.search(rf"\b{re.escape(name)}\b", statement), (statement, name)
        # A report shows a call of a public entry point and what came back.
        assert "```python" in statement and "from " + task.metadata["package"] + " import" in statement
        assert "result" in statement or "raise" in statement


def test_generated_code_is_lint_clean(suite, tmp_path):
    """The correct code passes ruff's default checks, so read_lints does not point at healthy code."""
    tasks, _ = suite
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed")
    task = tasks[2]
    gold = shutil.copytree(task.repo, tmp_path / "gold")
    apply_patch(gold, task.patch)
    # The rules read_lints uses.
    cmd = ["ruff", "check", "--isolated", "--quiet", "--select", "E4,E7,E9,F", "."]
    proc = subprocess.run(cmd, cwd=gold, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_all_families_at_all_difficulties(tmp_path):
    seen = set()
    for difficulty in range(1, 6):
        for i in range(len(FAMILIES)):
            task = generate_task(split_seed("train", 100 + i), difficulty, tmp_path, "train")
            seen.add((task.metadata["family"], difficulty))
            assert len(task.metadata["files"]) >= 4
    assert len(seen) == 5 * len(FAMILIES)


# ---------------------------------------------------------------------------------------------- families

SOURCE = '''
def helper(a, b):
    return a - b


def target(items, limit):
    """Docstring 1 + 2."""
    total = 0
    for i in range(len(items)):
        if items[i] > limit and not items[i] == 7:
            total += helper(items[i], limit) * 10
    return total
'''


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_mutates_the_function(family):
    found = mutations(SOURCE, "target", family, frozenset({"helper", "target"}))
    assert found, family
    original = ast.dump(ast.parse(SOURCE))
    for m in found:
        tree = ast.parse(m.source)  # always valid Python
        assert ast.dump(tree) != original
        # Only the target function changes; the helper and the docstring stay as they were.
        assert m.source.split("def target")[0] == SOURCE.split("def target")[0]
        assert '"""Docstring 1 + 2."""' in m.source
        assert m.family == family and m.line > 0


def test_family_examples():
    def sources(family):
        return {m.source for m in mutations(SOURCE, "target", family, frozenset({"helper"}))}

    assert any("helper(limit, items[i])" in s for s in sources("swapped_arguments"))
    assert any("items[i] >= limit" in s for s in sources("off_by_one"))
    assert any("range(len(items) - 1)" in s for s in sources("off_by_one"))
    assert any("* 100" in s for s in sources("wrong_constant"))
    assert any("total -= " in s for s in sources("wrong_operator"))
    assert any("items[i] <= limit" in s for s in sources("negated_condition"))
    assert any("items[i] == 7" in s and "not items[i] == 7" not in s for s in sources("negated_condition"))
    assert any("helper(items[i], total)" in s for s in sources("wrong_variable"))
    assert [s.rstrip().endswith("* 10") for s in sources("missing_return")] == [True]
    early = sources("early_return")
    assert (
        len(early) == 1
        and "            total += helper(items[i], limit) * 10\n        return total" in early.pop()
    )


def test_tree_diff_round_trip(tmp_path):
    old = {"a.py": "x = 1\ny = 2\n", "gone.py": "z = 3\n"}
    new = {"a.py": "x = 1\ny = 3\n", "new/b.py": "w = 4\n"}
    for rel, text in old.items():
        (tmp_path / rel).write_text(text)
    patch = make_tree_diff(old, new)
    assert patch.startswith("diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n")
    assert sorted(apply_patch(tmp_path, patch)) == ["a.py", "gone.py", "new/b.py"]
    assert _tree(tmp_path) == {k: v.encode() for k, v in new.items()}
