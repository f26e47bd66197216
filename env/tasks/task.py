"""The on-disk task format: a directory holding `task.json` and `repo/`.

`task.json` uses the SWE-bench field names where they apply:

    instance_id        str   unique name, also the directory name in a suite
    problem_statement  str   the user's bug report (what was called, what came back, what was expected)
    test_cmd           str   shell command run in the repository root that runs the tests with pytest
                             (`pytest tests`, `python -m pytest -q pkg/tests/test_x.py`); grading collects
                             per-test outcomes itself (see env/reward.py), so no report option is needed. A
                             `--junitxml=PATH` of its own is allowed (PATH inside the repository) and is read.
    FAIL_TO_PASS       [str] pytest node ids ("tests/test_x.py::test_y") that fail before the fix; a list,
                             or a JSON string holding one (as SWE-bench ships them)
    PASS_TO_PASS       [str] node ids that pass before and after (list or JSON string, may be empty)
    patch              str   the gold fix: a `git diff`-style unified diff (a/ b/ prefixes) applicable with
                             `git apply` or `patch -p1` in the repository root
    test_patch         str   a diff applied to the test files at grading time (hidden tests, as in
                             SWE-bench); "" when the tests are all in `repo/`
    timeout_s          float wall-clock limit of one test_cmd run
    metadata           dict  optional, free-form: family, difficulty, seed, split, where the bug is, ...
    environment        dict  optional: the interpreter the tests need, {"python": "3.11", "requirements":
                             ["pytest==8.3.3", ...], "install": ["shell command run in the venv", ...]}
                             (checked by env/tasks/environments.py); absent or {}: the project's own
                             interpreter, which generated tasks use

Other top-level fields (SWE-bench's repo, base_commit, version, created_at, hints_text,
environment_setup_commit, ...) are accepted and kept in `metadata` (an explicit `metadata` key of the same
name wins); `save_task` writes them back there.

Tests of generated tasks live in `repo/tests/` (the agent can read and run them; `test_patch` is ""). The
copy in `repo/` is the reference: grading puts the test files back as `repo/` has them (and then applies
`test_patch`), so editing or deleting tests earns nothing. See env/reward.py for the full list of what
grading restores.
"""

import dataclasses
import json
import os
import shlex
from pathlib import Path

TASK_FILE = "task.json"
FIELDS: dict[str, type | tuple[type, ...]] = {
    "instance_id": str,
    "problem_statement": str,
    "test_cmd": str,
    "FAIL_TO_PASS": (list, str),
    "PASS_TO_PASS": (list, str),
    "patch": str,
    "test_patch": str,
    "timeout_s": (int, float),
}
OPTIONAL = ("metadata", "environment")
_TYPE_NAMES = {(int, float): "number", (list, str): "list of node ids (or a JSON string holding one)"}


class TaskError(ValueError):
    """A task directory that is not valid; the message names the directory and what is wrong."""


@dataclasses.dataclass
class Task:
    """One task. `path` is its directory; the repository the agent starts from is `path / "repo"`."""

    instance_id: str
    problem_statement: str
    test_cmd: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    patch: str
    test_patch: str
    timeout_s: float
    path: Path
    metadata: dict = dataclasses.field(default_factory=dict)
    environment: dict = dataclasses.field(default_factory=dict)

    @property
    def repo(self) -> Path:
        return self.path / "repo"

    @property
    def tests(self) -> list[str]:
        """Every graded node id: FAIL_TO_PASS then PASS_TO_PASS."""
        return self.FAIL_TO_PASS + self.PASS_TO_PASS

    def to_json(self) -> dict:
        out = {name: getattr(self, name) for name in FIELDS}
        out["timeout_s"] = float(self.timeout_s)
        out["metadata"] = self.metadata
        if self.environment:
            out["environment"] = self.environment
        return out


def junit_path(test_cmd: str) -> str | None:
    """The `--junitxml` path of a test command (relative to the repository root), or None."""
    try:
        words = shlex.split(test_cmd)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word.startswith("--junitxml="):
            return word.split("=", 1)[1]
        if word in ("--junitxml", "--junit-xml") and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--junit-xml="):
            return word.split("=", 1)[1]
    return None


def load_task(path: Path | str) -> Task:
    """Reads and validates the task directory `path`; raises TaskError naming the first problem."""
    path = Path(path)
    where = str(path)
    file = path / TASK_FILE
    if not path.is_dir():
        raise TaskError(f"{where}: not a directory")
    if not file.is_file():
        raise TaskError(f"{where}: missing {TASK_FILE}")
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{where}: {TASK_FILE} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise TaskError(f"{where}: {TASK_FILE} must hold a JSON object, not {type(data).__name__}")
    for name, kind in FIELDS.items():
        if name not in data:
            raise TaskError(f"{where}: missing field {name!r}")
        value = data[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            expected = _TYPE_NAMES.get(kind) or kind.__name__
            raise TaskError(f"{where}: field {name!r} must be a {expected}, not {type(value).__name__}")
    tests = {name: _node_ids(data[name], name, where) for name in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    if not tests["FAIL_TO_PASS"]:
        raise TaskError(f"{where}: field 'FAIL_TO_PASS' is empty")
    if set(tests["FAIL_TO_PASS"]) & set(tests["PASS_TO_PASS"]):
        raise TaskError(f"{where}: fields 'FAIL_TO_PASS' and 'PASS_TO_PASS' share node ids")
    if not data["instance_id"] or "/" in data["instance_id"]:
        raise TaskError(f"{where}: field 'instance_id' must be a non-empty name without '/'")
    if data["timeout_s"] <= 0:
        raise TaskError(f"{where}: field 'timeout_s' must be positive")
    report = junit_path(data["test_cmd"])
    if report is not None and (
        os.path.isabs(report) and not report.startswith("/workspace/") or ".." in Path(report).parts
    ):
        raise TaskError(f"{where}: field 'test_cmd' must write its junit report inside the repository")
    for name in OPTIONAL:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise TaskError(f"{where}: field {name!r} must be an object, not {type(value).__name__}")
    extra = {k: v for k, v in data.items() if k not in FIELDS and k not in OPTIONAL}
    metadata = {**extra, **data.get("metadata", {})}
    if not (path / "repo").is_dir():
        raise TaskError(f"{where}: missing repo/ directory")
    return Task(
        instance_id=data["instance_id"],
        problem_statement=data["problem_statement"],
        test_cmd=data["test_cmd"],
        FAIL_TO_PASS=tests["FAIL_TO_PASS"],
        PASS_TO_PASS=tests["PASS_TO_PASS"],
        patch=data["patch"],
        test_patch=data["test_patch"],
        timeout_s=float(data["timeout_s"]),
        path=path,
        metadata=metadata,
        environment=dict(data.get("environment", {})),
    )


def _node_ids(value: list | str, name: str, where: str) -> list[str]:
    """A FAIL_TO_PASS / PASS_TO_PASS value as a list of node ids (SWE-bench ships a JSON string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, list):
            raise TaskError(f"{where}: field {name!r} must be a {_TYPE_NAMES[(list, str)]}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise TaskError(f"{where}: field {name!r} must hold non-empty strings (pytest node ids)")
    return list(value)


def load_suite(path: Path | str) -> list[Task]:
    """Every task directory directly under `path` (those holding a task.json), in name order."""
    path = Path(path)
    if not path.is_dir():
        raise TaskError(f"{path}: not a directory")
    return [load_task(p) for p in sorted(path.iterdir()) if (p / TASK_FILE).is_file()]


def save_task(task: Task) -> None:
    """Writes `task.json` of `task` (its repo/ is written by whoever made it)."""
    task.path.mkdir(parents=True, exist_ok=True)
    (task.path / TASK_FILE).write_text(json.dumps(task.to_json(), indent=2) + "\n")
