"""Gold-patch trajectories: SFT data for tasks the scripted expert cannot plan (any task not generated here).

The expert (env/expert.py) plans from a generated task's metadata, the call chain down to the bug; a task
from elsewhere (a SWE-bench-style suite, a builder's) has only its report, its tests and its gold patch.
Its trajectory goes through the same tools a model calls, one assistant turn at a time:

1. REPRODUCE: run the failing tests (the first MAX_SHOWN_TESTS of FAIL_TO_PASS).
2. READ: the lines of every hunk of the gold patch, in one turn (read_file where offered, else grep with
   context lines).
3. EDIT: one search_replace per hunk, whose old_string is text of the file as step 2 showed it.
4. VERIFY: run the same tests again; then a short final message without calls.

It is graded like an episode (env.reward.grade) and kept only when solved (composer/pipeline/data.py).
A patch that creates, deletes or renames a file has no such trajectory (search_replace edits existing
files), and neither has a task when search_replace or run_terminal_cmd is not offered.
"""

import dataclasses
import itertools
import re
import shlex

from env import chat
from env.reward import grade
from env.rollout.driver import INSTRUCTIONS
from env.sandbox import Limits, Sandbox, make_workspace, remove_workspace
from env.tasks import environments
from env.tasks.diffs import PatchError, parse_patch
from env.tools import ToolContext, execute_parallel, first_edit_after_read, tool_schemas

MAX_SHOWN_TESTS = 5  # failing tests the REPRODUCE and VERIFY turns run
READ_MARGIN = 3  # lines shown before and after each hunk's own lines
SAY = {
    "reproduce": "I'll start by running the failing tests.",
    "read": "Let me read the code around the failure.",
    "edit": "Found the problem in `{path}`. Let me fix it.",
    "next": "And the next change in the same fix.",
    "verify": "Now let me run the tests again.",
    "done": "I fixed the bug in {paths}; the failing tests pass now.",  # as grading found
    "failed": "I changed {paths}, but the tests still fail.",
}
NEEDED_TOOLS = ("run_terminal_cmd", "search_replace")


@dataclasses.dataclass
class Trajectory:
    messages: list[chat.Message]
    reward: float


def applicable(task, tools: tuple[str, ...] | None) -> str | None:
    """None when `task` can have a gold trajectory with the offered `tools` (None: all), else why not."""
    missing = [t for t in NEEDED_TOOLS if tools is not None and t not in tools]
    if missing:
        return f"tools {', '.join(missing)} not offered"
    try:
        files = parse_patch(task.patch)
    except PatchError as e:
        return f"unreadable gold patch ({e})"
    if not files:
        return "empty gold patch"
    if any(f.old_path is None or f.new_path is None or f.old_path != f.new_path for f in files):
        return "the gold patch creates, deletes or renames a file"
    return None


def hunk_strings(text: str, body: list[str]) -> tuple[str, str]:
    """(old_string, new_string) of one hunk (body lines with their ' ', '-', '+' prefix): its changed lines,
    widened with its context lines until the old side is non-empty and occurs once in `text`, without the
    last newline (as a person selects lines)."""
    changed = [i for i, b in enumerate(body) if b[:1] in ("-", "+")]
    lo, hi = changed[0], changed[-1]
    while True:
        old = "".join(b[1:] for b in body[lo : hi + 1] if b[:1] in (" ", "-"))
        new = "".join(b[1:] for b in body[lo : hi + 1] if b[:1] in (" ", "+"))
        if (old.strip() and text.count(old) == 1) or (lo == 0 and hi == len(body) - 1):
            break
        lo, hi = (lo - 1, hi) if lo > 0 else (lo, hi + 1)
    if old.endswith("\n") and new.endswith("\n"):
        old, new = old[:-1], new[:-1]
    return old, new


_RUST_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def _read_call(path: str, start: int, body: list[str], tools: tuple[str, ...] | None) -> chat.ToolCall | None:
    """A call that shows the hunk at old line `start` (1-based) of `path` and READ_MARGIN lines around it."""
    n_old = sum(b[:1] in (" ", "-") for b in body)
    first = max(start - READ_MARGIN, 1)
    if tools is None or "read_file" in tools:
        args = {"target_file": path, "offset": first, "limit": n_old + start - first + READ_MARGIN}
        return chat.ToolCall("read_file", args)
    if "grep" in tools:
        lines = [b[1:].rstrip("\n") for b in body if b[:1] in (" ", "-")]
        k = next((i for i, x in enumerate(lines) if x.strip()), None)
        if k is None:
            return None
        pattern = _RUST_META.sub(r"\\\1", lines[k].strip())
        return chat.ToolCall("grep", {"pattern": pattern, "path": path, "-B": k + READ_MARGIN,
                                      "-A": len(lines) - k - 1 + READ_MARGIN})  # fmt: skip
    return None


def _test_call(task) -> chat.ToolCall:
    ids = " ".join(shlex.quote(t) for t in task.FAIL_TO_PASS[:MAX_SHOWN_TESTS])
    # The variables test_cmd sets first (PYTHONPATH=src for a src/ layout) are needed to import the project.
    words = shlex.split(task.test_cmd)
    assigned = list(itertools.takewhile(lambda w: re.fullmatch(r"[A-Za-z_]\w*=.*", w), words))
    prefix = "".join(shlex.quote(w) + " " for w in assigned)
    return chat.ToolCall("run_terminal_cmd", {"command": f"{prefix}python -m pytest -q --tb=short {ids}",
                                              "is_background": False})  # fmt: skip


def solve(task, *, tools: tuple[str, ...] | None = None, isolation: str = "auto") -> Trajectory:
    """The gold trajectory of `task` (see `applicable`) with the offered `tools` (None: all), graded."""
    reason = applicable(task, tools)
    if reason is not None:
        raise ValueError(f"{task.instance_id}: no gold trajectory: {reason}")
    files = parse_patch(task.patch)
    messages = [
        chat.system_message(tool_schemas(tools), INSTRUCTIONS),
        chat.Message("user", task.problem_statement),
    ]
    turn_tools: list[list[str]] = []
    errors = 0
    workspace = make_workspace(task.repo)
    try:
        limits, venv = Limits(timeout_s=task.timeout_s), environments.python_env(task)
        with Sandbox(workspace, limits=limits, isolation=isolation, python_env=venv) as box:
            ctx = ToolContext(workspace, box, tools=tools)

            def turn(text: str, calls: list[chat.ToolCall]) -> list:
                nonlocal errors
                messages.append(chat.Message("assistant", text, calls))
                results = execute_parallel(ctx, calls)
                messages.extend(chat.Message("tool", r.text) for r in results)
                errors += sum(r.is_error for r in results)
                turn_tools.append([c.name for c in calls])
                return results

            turn(SAY["reproduce"], [_test_call(task)])
            reads = [_read_call(f.path, start, body, tools) for f in files for start, body in f.hunks]
            if any(reads):
                turn(SAY["read"], [c for c in reads if c is not None])
            say = SAY["edit"]
            for f in files:
                for _, body in f.hunks:
                    old, new = hunk_strings((workspace / f.path).read_text(), body)
                    args = {"file_path": f.path, "old_string": old, "new_string": new}
                    turn(say.format(path=f.path), [chat.ToolCall("search_replace", args)])
                    say = SAY["next"]
            turn(SAY["verify"], [_test_call(task)])
        first_read = first_edit_after_read(turn_tools)
        graded = grade(task, workspace, edited_files=ctx.edited_files, tool_errors=errors,
                       first_edit_after_read=first_read, isolation=isolation)  # fmt: skip
    finally:
        remove_workspace(workspace)
    # The closing line says what grading found (a task's hidden tests, in test_patch, the runs above lack).
    paths = ", ".join(f"`{f.path}`" for f in files)
    messages.append(
        chat.Message("assistant", SAY["done" if graded.reward == 1.0 else "failed"].format(paths=paths))
    )
    return Trajectory(messages, graded.reward)
