"""Grading: run a task's tests on the final workspace of an episode and score it.

    grade(task, workspace, edited_files=..., tool_errors=..., first_edit_after_read=...) -> Grade

The reward is 1.0 if and only if every FAIL_TO_PASS and PASS_TO_PASS test passed, else 0.0. Shaping terms
are reported beside it in `Grade.components`, never mixed in.

The workspace holds model-written files and is treated as hostile. Grading works on a copy (the episode's
workspace is left as it was) and, before running anything, puts back what the agent must not control, and
nothing else (see `ProtectedFiles`):

- the test files: those the graded node ids and `test_patch` name; in a dedicated test directory (the
  nearest enclosing `tests/`, `test/` or `testing/`, e.g. `tests/` or `pkg/tests/`) every file, files the
  agent added there (a conftest.py, a tests/__init__.py, helpers) removed and deleted ones brought back; in a
  directory that also holds the package's source (`pkg/test_x.py` beside `pkg/core.py`, or the root) only
  test files (test_*.py, *_test.py, conftest.py). Then `test_patch` is applied;
- pytest's configuration: conftest.py files anywhere, and pytest.ini, .pytest.ini, pytest.toml,
  .pytest.toml, pyproject.toml, tox.ini, setup.cfg at the root, are restored to the task's version or
  removed (an `addopts` or a hook could deselect or fake tests);
- shadowing: a new top-level module or package in the root named like a standard-library or installed module
  (pytest.py, _pytest/, pluggy/, xml/ ...) is removed, as are sitecustomize / usercustomize and .pth files;
- bytecode: every __pycache__ directory and .pyc file goes (a forged .pyc can carry code its .py lacks);
- the task's own junit report path, if test_cmd names one, is cleared, so only this run's report is read.
Never restored: a file the gold patch touches (the package's source, whatever the layout; also a config
file or a doctest module the fix must change), and source beside the tests.

Then test_cmd runs in the sandbox (env.sandbox: no network, the copy as the only writable tree, limits,
timeout) with PYTEST_ADDOPTS adding `--junitxml=<a file in the sandbox's /tmp> -rA`, and per-test outcomes
are read from the first of: the task's own junit report (when test_cmd names one: its option overrides
ours), the grader's report (read before the sandbox and its /tmp go away), pytest's `-rA` short summary in
the output (`PASSED node`, `FAILED node - message`, `ERROR node`). A graded test absent from it is
'missing' (a failure). Code the agent wrote still runs inside the test process; changed source files that
reach into pytest, the report or the interpreter (see TAMPER_TOKENS) are flagged `tamper_suspected` and score
0. The fixes these tasks need never use such things; a determined hostile program could still hide them,
which the sandbox contains but this check cannot exclude.
"""

import dataclasses
import difflib
import functools
import importlib.metadata
import os
import posixpath
import re
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from env.outcomes import MAX_REPORT_BYTES, parse_junit, parse_summary, read_report
from env.sandbox import SANDBOX_ROOT, Limits, Sandbox, make_workspace, remove_workspace
from env.tasks import environments
from env.tasks.diffs import (
    PatchError,
    apply_patch,
    make_tree_diff,
    patch_paths,
    remove_entry,
    safe_path,
    write_file,
)
from env.tasks.task import Task, junit_path

OUTCOMES = ("passed", "failed", "error", "skipped", "missing")
CONFIG_FILES = (
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
STARTUP_MODULES = ("sitecustomize", "usercustomize")
# Directory names that mark a dedicated test directory (restored wholesale).
TEST_DIR_NAMES = ("tests", "test", "testing")
# The grader's junit report, in the sandbox's /tmp (never in the workspace the agent wrote).
REPORT_NAME = "composer-grade-junit.xml"
# Words that a changed source file has no business gaining in a bug fix: hooks into pytest and its report,
# interpreter-level patching, dynamic code.
TAMPER_TOKENS = (
    "pytest",
    "pluggy",
    "junit",
    "conftest",
    "atexit",
    "sys.modules",
    "_getframe",
    "settrace",
    "setprofile",
    "builtins",
    "__import__",
    "importlib",
    "os._exit",
    "exec(",
    "eval(",
    "compile(",
    "base64",
    "marshal",
    "ctypes",
)
MAX_SOURCE_BYTES = 4 << 20
MAX_OUTPUT_CHARS = 20_000
# patch_similarity compares at most this many times the gold patch's length of an episode's diff.
_SIMILARITY_SPAN = 8
_IGNORED_DIRS = ("__pycache__", ".pytest_cache", ".ruff_cache", ".git")


@dataclasses.dataclass
class Grade:
    """reward: 1.0 iff every graded test passed. tests: node id -> one of OUTCOMES. components: shaping terms
    and diagnostics (see `grade`). output: what the test run printed (capped), after notes on restored
    files."""

    reward: float
    tests: dict[str, str]
    components: dict[str, float]
    output: str


def grade(
    task: Task,
    workspace: Path | str,
    *,
    edited_files: Iterable[str] | None = None,
    tool_errors: int = 0,
    first_edit_after_read: bool | None = None,
    isolation: str = "auto",
    limits: Limits | None = None,
) -> Grade:
    """Grades the final `workspace` of an episode on `task` (the workspace itself is not modified).

    components:
      tool_errors                   the count passed in (calls answered with an error result)
      edited_unrelated_files        files edited that the gold patch does not touch: `edited_files`
                                    (workspace-relative, as env.tools records them) when given, else every
                                    file that differs from the task's repo
      searched_or_read_before_edit  1.0 / 0.0 from `first_edit_after_read`; absent when that is None (no edit)
      fail_to_pass, pass_to_pass    fraction of each group that passed
      tamper_suspected              1.0 when a changed source file uses a TAMPER_TOKENS word (reward 0)
      timed_out                     1.0 when the test command hit task.timeout_s
      patch_similarity              how close the episode's source changes are to the gold patch, in [0, 1]
                                    (see `patch_similarity`): a dense signal where the reward is sparse
    """
    workspace = Path(workspace)
    copy, notes = _grading_copy(workspace)
    try:
        notes += restore(task, copy)
        suspects = tamper_suspects(task, copy)
        similarity = patch_similarity(task, copy)
        limits = limits or Limits(timeout_s=task.timeout_s)
        with Sandbox(
            copy, limits=limits, isolation=isolation, python_env=environments.python_env(task)
        ) as box:
            report = f"{box.tmp}/{REPORT_NAME}"
            addopts = f"--junitxml={shlex.quote(report)} -rA"
            run = box.run(task.test_cmd, timeout=task.timeout_s, env={"PYTEST_ADDOPTS": addopts})
            ours = read_report(box.host_path(report))  # before close: the sandbox's /tmp goes with it
        tests = read_outcomes(task, copy, ours, run.output)
    finally:
        remove_workspace(copy)
    fail = [tests[t] == "passed" for t in task.FAIL_TO_PASS]
    keep = [tests[t] == "passed" for t in task.PASS_TO_PASS]
    passed = all(fail) and all(keep)
    components = {
        "tool_errors": float(tool_errors),
        "edited_unrelated_files": float(len(unrelated_edits(task, workspace, edited_files))),
        "fail_to_pass": sum(fail) / len(fail) if fail else 1.0,
        "pass_to_pass": sum(keep) / len(keep) if keep else 1.0,
        "tamper_suspected": float(bool(suspects)),
        "timed_out": float(run.timed_out),
        "patch_similarity": similarity,
    }
    if first_edit_after_read is not None:
        components["searched_or_read_before_edit"] = float(first_edit_after_read)
    if suspects:
        notes.append(f"[grading] tampering suspected in {', '.join(suspects)}: reward 0")
    output = (
        run.output if len(run.output) <= MAX_OUTPUT_CHARS else run.output[:MAX_OUTPUT_CHARS] + "\n[...]\n"
    )
    if run.timed_out:
        notes.append(f"[grading] the test command timed out after {task.timeout_s:g} s")
    text = "".join(n + "\n" for n in notes) + output
    return Grade(float(passed and not suspects), tests, components, text)


# --------------------------------------------------------------------------------------------- restoring


def _grading_copy(workspace: Path) -> tuple[Path, list[str]]:
    """A fresh workspace holding a copy of `workspace`. If the plain copy fails (a named pipe or socket the
    agent made, which copying refuses), only directories, regular files and symbolic links are copied, and a
    note says what was left out."""
    try:
        return make_workspace(workspace), []
    except ValueError:
        pass
    with tempfile.TemporaryDirectory(prefix="composer-grade-") as empty:
        os.chmod(empty, 0o755)  # the copy takes this mode, and the sandbox's uid must enter it
        copy = make_workspace(Path(empty))
    skipped = []
    try:
        for dirpath, dirnames, filenames in os.walk(workspace):
            base = Path(dirpath)
            rel = base.relative_to(workspace)
            for name in dirnames + filenames:
                src, dst = base / name, copy / rel / name
                if src.is_symlink():
                    os.symlink(os.readlink(src), dst)
                elif src.is_dir():
                    dst.mkdir()
                elif _regular(src):
                    shutil.copy2(src, dst)
                else:
                    skipped.append((rel / name).as_posix())
            dirnames[:] = [d for d in dirnames if not (base / d).is_symlink()]
    except BaseException:
        remove_workspace(copy)
        raise
    return copy, [f"[grading] not copied (not a regular file): {', '.join(sorted(skipped))}"]


def is_test_file(name: str) -> bool:
    """Whether a file name is one pytest collects or configures from: test_*.py, *_test.py, conftest.py."""
    return name == "conftest.py" or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    )


@dataclasses.dataclass(frozen=True)
class ProtectedFiles:
    """What grading restores of a task's repository: its tests, as laid out (see the module docstring).

    files: the test files the graded node ids and test_patch name. test_dirs: dedicated test directories,
    restored wholesale. mixed_dirs: the other directories of those files ("" for the root), where only test
    files are restored. gold: the files the gold patch touches, never restored.
    """

    files: frozenset[str]
    test_dirs: tuple[str, ...]
    mixed_dirs: frozenset[str]
    gold: frozenset[str]

    def covers(self, rel: str) -> bool:
        """Whether grading puts `rel` (repository-relative) back as the task has it."""
        if rel in self.gold:
            return False
        parent, _, name = rel.rpartition("/")
        return (
            rel in self.files
            or any(rel.startswith(d + "/") for d in self.test_dirs)
            or (parent in self.mixed_dirs and is_test_file(name))
            or name == "conftest.py"
            or name.endswith(".pth")
            or Path(name).stem in STARTUP_MODULES
            or rel in CONFIG_FILES
        )


def _paths_of(patch: str) -> set[str]:
    try:
        return set(patch_paths(patch)) if patch else set()
    except PatchError:
        return set()


def protected_files(task: Task) -> ProtectedFiles:
    """The ProtectedFiles of `task`: the files of its graded node ids and test_patch, and their directories.

    A file's dedicated test directory is its nearest enclosing directory named like TEST_DIR_NAMES (tests/
    for tests/unit/test_a.py, pkg/tests/ for pkg/tests/test_x.py), unless the gold patch touches a file
    under it (then that directory holds source, and is a mixed one)."""
    gold = _paths_of(task.patch)
    files = {node.split("::")[0] for node in task.tests} | _paths_of(task.test_patch)
    files = {f for f in files if f and not os.path.isabs(f) and ".." not in f.split("/")} - gold
    test_dirs, mixed = set(), set()
    for rel in files:
        parent = posixpath.dirname(rel)
        parts = parent.split("/") if parent else []
        found = None
        for i in range(len(parts), 0, -1):
            if parts[i - 1] in TEST_DIR_NAMES:
                found = "/".join(parts[:i])
                break
        if found is not None and not any(g.startswith(found + "/") for g in gold):
            test_dirs.add(found)
        else:
            mixed.add(parent)
    # A test directory inside another is covered by the outer one.
    outer = tuple(sorted(d for d in test_dirs if not any(d.startswith(o + "/") for o in test_dirs)))
    return ProtectedFiles(frozenset(files), outer, frozenset(mixed), frozenset(gold))


def restore(task: Task, tree: Path) -> list[str]:
    """Puts back in `tree` (a grading copy) everything listed in the module docstring; returns notes on
    what it changed."""
    original = task.repo
    layout = protected_files(task)
    notes = []

    def put_back(rel: str) -> None:
        src = original / rel
        if src.is_file() and not src.is_symlink():
            data = src.read_bytes()
            dst = _in_tree(tree, rel)
            if not (dst is not None and _same(dst, data)):
                notes.append(f"[grading] restored {rel}")
                write_file(tree, rel, data)
            return
        dst = _in_tree(tree, rel)  # None: reached through a link, not an entry of the tree itself
        if dst is not None and os.path.lexists(dst) and not (src.is_dir() and _is_real_dir(dst)):
            notes.append(f"[grading] removed {rel}")
            remove_entry(dst)

    # A dedicated test directory that the agent replaced by a link or a file goes first.
    for root in layout.test_dirs:
        dst = _in_tree(tree, root)
        if dst is not None and os.path.lexists(dst) and not _is_real_dir(dst):
            notes.append(f"[grading] removed {root}")
            remove_entry(dst)
    candidates = {p.relative_to(original).as_posix() for p in _files(original)}
    candidates |= {p.relative_to(tree).as_posix() for p in _files(tree)}
    candidates |= layout.files
    for rel in sorted(candidates):
        if layout.covers(rel):
            put_back(rel)
    for entry in sorted(os.listdir(tree)):
        if not os.path.lexists(original / entry) and _shadows(tree / entry):
            notes.append(f"[grading] removed {entry} (shadows an installed module)")
            remove_entry(tree / entry)
    for path in sorted(_all_entries(tree), reverse=True):
        if path.name == "__pycache__" or path.suffix == ".pyc":
            remove_entry(path)
    report = junit_path(task.test_cmd)
    if report is not None:
        inside = _inside(report)
        dst = _in_tree(tree, inside) if inside is not None else None
        if dst is not None and os.path.lexists(dst):
            remove_entry(dst)
    if task.test_patch:
        try:
            apply_patch(tree, task.test_patch)
        except PatchError as e:
            notes.append(f"[grading] test_patch did not apply: {e}")
    return notes


def _in_tree(tree: Path, rel: str) -> Path | None:
    """`tree / rel` if no symbolic link lies on the way (so that acting on it stays in `tree`), else None."""
    try:
        return safe_path(tree, rel)
    except PatchError:
        return None


def _regular(path: Path) -> bool:
    """A regular file, not a link, pipe or device (those could point out of the tree or block a read)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _same(path: Path, data: bytes) -> bool:
    try:
        return _regular(path) and path.lstat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def _is_real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _all_entries(root: Path) -> list[Path]:
    """Every entry under `root` (files, links, directories), never following symbolic links."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        out += [base / d for d in dirnames] + [base / f for f in filenames]
    return out


def _files(root: Path) -> list[Path]:
    """Files and symbolic links under `root` (not following links), skipping caches."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _IGNORED_DIRS]
        base = Path(dirpath)
        out += [base / f for f in filenames]
        out += [base / d for d in dirnames if (base / d).is_symlink()]
    return out


@functools.lru_cache(maxsize=1)
def _installed_modules() -> frozenset[str]:
    names = set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    names |= set(importlib.metadata.packages_distributions())
    return frozenset(names)


def _shadows(path: Path) -> bool:
    """Whether a root-level entry is importable under the name of a standard-library or installed module."""
    name = path.name
    if path.is_dir() and not path.is_symlink():
        module = name if (path / "__init__.py").exists() or (path / "__init__.pyc").exists() else None
    else:
        module = name.split(".")[0] if re.search(r"\.(py|pyc|so|pyd)$", name) else None
    if module is None:
        return False
    return module in _installed_modules() or module in STARTUP_MODULES


def _inside(report: str) -> str | None:
    """The repository-relative form of a junit path (relative, or absolute under SANDBOX_ROOT)."""
    if report.startswith(SANDBOX_ROOT + "/"):
        report = report[len(SANDBOX_ROOT) + 1 :]
    if os.path.isabs(report):
        return None
    try:
        safe_path(Path("/"), report)
    except PatchError:
        return None
    return report


# ------------------------------------------------------------------------------------------------ checks


def _source_files(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in _files(root) if p.suffix == ".py" and _regular(p)}


def _read_source(path: Path) -> str | None:
    """The first MAX_SOURCE_BYTES of a model-written file as text; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_SOURCE_BYTES).decode(errors="replace")
    except OSError:
        return None


def tamper_suspects(task: Task, tree: Path) -> list[str]:
    """Changed or new .py files that grading does not restore (ProtectedFiles.covers) whose text gains a
    TAMPER_TOKENS word."""
    layout = protected_files(task)
    original = _source_files(task.repo)
    out = []
    for rel, path in sorted(_source_files(tree).items()):
        if layout.covers(rel):
            continue
        text = _read_source(path)
        if text is None:
            continue
        before = original[rel].read_text() if rel in original else ""
        if text != before and any(text.count(t) > before.count(t) for t in TAMPER_TOKENS):
            out.append(rel)
    return out


def source_diff(task: Task, tree: Path) -> str:
    """The diff of `tree`'s source files (those grading does not restore) against the task's repo, in the
    format of the gold patch. Files are read up to MAX_SOURCE_BYTES."""
    layout = protected_files(task)
    old, new = {}, {}
    for rel in changed_files(task.repo, tree, ignore=junit_path(task.test_cmd)):
        if layout.covers(rel):
            continue
        for side, root in ((old, task.repo), (new, tree)):
            text = _read_source(root / rel) if _regular(root / rel) else None
            if text is not None:
                side[rel] = text
    return make_tree_diff(old, new)


def patch_similarity(task: Task, tree: Path) -> float:
    """difflib's ratio between the source diff of `tree` (`source_diff`) and the gold patch, in [0, 1]: 0
    for no change, 1 for the gold patch itself; an edit of the right lines scores near 1 even when the fix
    is wrong (the hunks' headers and context match), an edit elsewhere in the right file about half. Only
    the first `_SIMILARITY_SPAN` x the gold patch's length of the diff is compared (a diff that long scores
    under 2 / (1 + _SIMILARITY_SPAN) anyway), which bounds the quadratic matcher's time."""
    gold = task.patch
    diff = source_diff(task, tree)[: _SIMILARITY_SPAN * max(len(gold), 1)]
    if not diff or not gold:
        return float(diff == gold)
    return difflib.SequenceMatcher(None, diff, gold, autojunk=False).ratio()


def unrelated_edits(task: Task, workspace: Path, edited_files: Iterable[str] | None) -> list[str]:
    """Edited files (see `grade`) that the gold patch does not touch."""
    gold = set(patch_paths(task.patch))
    if edited_files is None:
        edited = set(changed_files(task.repo, workspace, ignore=junit_path(task.test_cmd)))
    else:
        edited = {_relative(p, workspace) for p in edited_files}
    return sorted(edited - gold)


def _relative(path: str, workspace: Path) -> str:
    for prefix in (SANDBOX_ROOT, str(workspace)):
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            path = path[len(prefix) :]
    return path.strip("/").removeprefix("./")


def changed_files(original: Path, tree: Path, ignore: str | None = None) -> list[str]:
    """Files added, removed or changed in `tree` relative to `original` (caches and `ignore` left out)."""
    a = {p.relative_to(original).as_posix(): p for p in _files(original)}
    b = {p.relative_to(tree).as_posix(): p for p in _files(tree)}
    out = []
    for rel in sorted(set(a) | set(b)):
        if rel == ignore or rel.endswith(".pyc"):
            continue
        if rel not in a or rel not in b or not _same(b[rel], a[rel].read_bytes()):
            out.append(rel)
    return out


# ----------------------------------------------------------------------------------------------- reports


def read_outcomes(task: Task, tree: Path, report: bytes | None = None, output: str = "") -> dict[str, str]:
    """Outcome of every graded test ('missing' if absent), from the first source that can be read: the
    junit report test_cmd names (inside `tree`), `report` (the grader's junit report), the `-rA` short
    summary in `output`."""
    own = junit_path(task.test_cmd)
    inside = _inside(own) if own else None
    path = _in_tree(tree, inside) if inside else None
    for data in (read_report(path) if path else None, report):
        if data is not None and len(data) <= MAX_REPORT_BYTES:
            outcomes = parse_junit(data, task.tests)
            if outcomes is not None:
                return outcomes
    return parse_summary(output, task.tests)
