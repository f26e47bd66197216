"""Validation of a suite: does every task grade as a task should?

    python -m env.tasks validate SUITE [--workers W] [--isolation LEVEL]

Per task, through the same grader as episodes (env.reward.grade, in the sandbox, with the task's
environment):

- empty:     the repository as shipped scores 0 (the bug is there, a FAIL_TO_PASS test sees it);
- gold:      the gold patch applied scores 1, twice (a task whose outcome changes between the two runs is
             flagged flaky);
- tests:     the gold patch touches no test file (files of graded node ids or of test_patch, test_*.py,
             *_test.py, conftest.py, files under a tests/ or testing/ directory);
- statement: the problem statement does not contain a line the gold patch adds.

Prints one row per task as it finishes, then a table of the failures and one JSON line:
{"tasks", "valid", "invalid": {instance id: [failed checks]}, "seconds"}. Exit status 1 if any task fails.
"""

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from env.reward import TEST_DIR_NAMES, grade, is_test_file
from env.tasks.diffs import apply_patch, parse_patch, patch_paths
from env.tasks.task import Task

CHECKS = ("empty", "gold", "flaky", "tests", "statement")
# Added lines shorter than this (a bare `return`, `else:`, a bracket) say nothing about the fix.
MIN_REVEALING_CHARS = 8


@dataclasses.dataclass
class Validation:
    instance_id: str
    empty: float | None  # reward of the unedited repository (None: grading raised)
    gold: tuple[float | None, float | None]  # rewards of the two gold runs
    failed: list[str]  # the CHECKS that failed
    detail: str  # why, for a person
    seconds: float


def is_test_path(rel: str, task: Task) -> bool:
    """Whether a repository-relative path is a test file of `task`."""
    named = {node.split("::")[0] for node in task.tests}
    if task.test_patch:
        named |= set(patch_paths(task.test_patch))
    path = PurePosixPath(rel)
    return rel in named or is_test_file(path.name) or any(part in TEST_DIR_NAMES for part in path.parts[:-1])


def revealed_lines(task: Task) -> list[str]:
    """Lines the gold patch adds that appear in the problem statement."""
    added = [
        line[1:].strip()
        for fp in parse_patch(task.patch)
        for _, body in fp.hunks
        for line in body
        if line.startswith("+")
    ]
    text = task.problem_statement
    return [line for line in added if len(line) >= MIN_REVEALING_CHARS and line in text]


def validate_task(task: Task, isolation: str = "auto") -> Validation:
    from env.sandbox import make_workspace, remove_workspace

    t0 = time.perf_counter()
    failed, detail = [], []

    def reward(patch: str) -> float | None:
        workspace = make_workspace(task.repo)
        try:
            if patch:
                apply_patch(workspace, patch)
            return grade(task, workspace, isolation=isolation).reward
        except Exception as e:  # a task that cannot be graded is an invalid task, reported as such
            detail.append(f"{type(e).__name__}: {e}")
            return None
        finally:
            remove_workspace(workspace)

    empty = reward("")
    gold = (reward(task.patch), reward(task.patch))
    if empty != 0.0:
        failed.append("empty")
        detail.append(f"unedited repository scored {empty}")
    if gold[0] != 1.0 and gold[1] != 1.0:
        failed.append("gold")
        detail.append(f"gold patch scored {gold[0]}, {gold[1]}")
    elif gold[0] != gold[1]:
        failed.append("flaky")
        detail.append(f"gold patch scored {gold[0]} then {gold[1]}")
    touched = [p for p in patch_paths(task.patch) if is_test_path(p, task)]
    if touched:
        failed.append("tests")
        detail.append(f"gold patch edits test files {', '.join(touched)}")
    shown = revealed_lines(task)
    if shown:
        failed.append("statement")
        detail.append(f"statement shows added lines {shown[:2]}")
    return Validation(task.instance_id, empty, gold, failed, "; ".join(detail), time.perf_counter() - t0)


def validate_suite(
    tasks: list[Task],
    *,
    workers: int = 1,
    isolation: str = "auto",
    progress: Callable[[int, Validation], None] | None = None,
) -> list[Validation]:
    """Validates every task (in `workers` threads: each grade is its own sandboxed process tree); results in
    the order of `tasks`."""
    results: dict[str, Validation] = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, workers)) as pool:
        futures = [pool.submit(validate_task, task, isolation) for task in tasks]
        for i, future in enumerate(concurrent.futures.as_completed(futures)):
            v = future.result()
            results[v.instance_id] = v
            if progress:
                progress(i, v)
    return [results[t.instance_id] for t in tasks]


def summary(results: list[Validation], seconds: float) -> dict:
    invalid = {v.instance_id: v.failed for v in results if v.failed}
    return {
        "tasks": len(results),
        "valid": len(results) - len(invalid),
        "invalid": invalid,
        "seconds": round(seconds, 1),
        "seconds_per_task": round(sum(v.seconds for v in results) / max(len(results), 1), 2),
    }


def table(results: list[Validation]) -> str:
    """One row per task: the checks, then why it failed."""
    width = max([len(v.instance_id) for v in results] + [len("task")])
    rows = [f"{'task':<{width}}  empty  gold     result"]
    for v in results:
        gold = "/".join("-" if r is None else f"{r:g}" for r in v.gold)
        empty = "-" if v.empty is None else f"{v.empty:g}"
        result = "ok" if not v.failed else "FAIL " + ",".join(v.failed) + f" ({v.detail})"
        rows.append(f"{v.instance_id:<{width}}  {empty:<5}  {gold:<7}  {result}")
    return "\n".join(rows)


def run(suite: Path, workers: int, isolation: str) -> int:
    from env.tasks.task import load_suite

    tasks = load_suite(suite)
    t0 = time.perf_counter()

    def progress(i: int, v: Validation) -> None:
        state = "ok" if not v.failed else "FAIL " + ",".join(v.failed)
        print(f"[{i + 1}/{len(tasks)}] {v.instance_id} {state} {v.seconds:.1f}s", flush=True)

    results = validate_suite(tasks, workers=workers, isolation=isolation, progress=progress)
    print(table(results), flush=True)
    out = summary(results, time.perf_counter() - t0)
    print(json.dumps(out), flush=True)
    return 1 if out["invalid"] else 0
