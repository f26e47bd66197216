"""The scripted expert: solves generated tasks through the same tools a model calls, and records the
conversation as supervised warm-start data.

    trajectory = solve(task)       # Trajectory(messages, reward, grade, family, n_turns)

The expert works like a careful developer, one assistant turn at a time, each with a line of text before
its calls:

1. REPRODUCE: run the tests.
2. SEARCH: grep for the definition of the entry point the bug report calls and for the failing test, two
   calls in one turn (run in parallel), each with context lines after the match, which show the code.
3. TRACE: for each call on the way down to the buggy helper, grep for its definition the same way.
4. EDIT: one search_replace whose old_string is text of the file as a grep showed it.
5. VERIFY: run the tests again; then a short final message without calls.

It decides with the task's metadata (the gold patch and the call chain from the entry point to the bug),
but every fact its messages state or its calls use comes from an earlier tool result: names from the report
and the test run, code from grep.
"""

import ast
import dataclasses
import re
from pathlib import Path

from env.chat import Message, ToolCall, render_text, system_message
from env.reward import Grade, grade
from env.sandbox import Limits, Sandbox, make_workspace, remove_workspace
from env.tasks import environments
from env.tasks.diffs import parse_patch
from env.tasks.task import Task
from env.tools import ToolContext, ToolResult, execute_parallel, first_edit_after_read, tool_schemas

INSTRUCTIONS = (
    "You are a coding agent in a Python repository at /workspace. Fix the bug the user reports: run the "
    "tests, search and read the code, edit the source, and run the tests again. Do not change the tests. "
    "When the tests pass, reply with a short summary and no tool call."
)
TEST_COMMAND = "python -m pytest -q --tb=short tests"
# Lines after a definition's first line that the expert's grep shows (more for a longer function): every
# function at difficulty 1 fits, the longest being 13 lines. And after a test's first line (tests are at
# most 7 lines long).
DEFINITION_CONTEXT = 12
TEST_CONTEXT = 6
# The line of text before each step's calls: one wording per step. With two or three wordings a step, the
# default SFT model mixed them ("The failing call goes through `f` and the failing test. Let me look at its
# definition and ...") and, greedy, repeated a sentence until the turn's token limit, without a call: 12 of
# 50 held-out episodes ended so at the search turn. The text carries the names the calls then copy.
SAY = {
    "reproduce": "I'll start by running the test suite.",
    "search": "Let me find `{f}` and the test `{t}`.",
    "trace": "`{p}` delegates to `{n}`. Let me find it.",
    "verify": "Now let me run the tests again.",
    "done": "The bug was in {loc}: {why} After the fix all {n} tests pass.",
}


@dataclasses.dataclass
class Trajectory:
    """One solved (or failed) episode. n_turns counts assistant turns."""

    messages: list[Message]
    reward: float
    grade: Grade
    family: str
    n_turns: int

    def text(self) -> str:
        return render_text(self.messages)


def solve(task: Task, *, workspace_parent: Path | None = None, isolation: str = "auto") -> Trajectory:
    """Runs the expert on `task` in a fresh workspace and sandbox, grades the result, cleans up."""
    workspace = make_workspace(task.repo, workspace_parent)
    try:
        limits, python_env = Limits(timeout_s=task.timeout_s), environments.python_env(task)
        with Sandbox(workspace, limits=limits, isolation=isolation, python_env=python_env) as box:
            expert = _Expert(task, ToolContext(workspace, box))
            expert.run()
        result = grade(
            task,
            workspace,
            edited_files=expert.ctx.edited_files,
            tool_errors=expert.tool_errors,
            first_edit_after_read=expert.first_edit_after_read(),
            isolation=isolation,
        )
    finally:
        remove_workspace(workspace)
    n_turns = sum(m.role == "assistant" for m in expert.messages)
    return Trajectory(expert.messages, result.reward, result, task.metadata.get("family", ""), n_turns)


class _Expert:
    def __init__(self, task: Task, ctx: ToolContext):
        self.task = task
        self.ctx = ctx
        self.messages = [
            system_message(tool_schemas(), INSTRUCTIONS),
            Message("user", task.problem_statement),
        ]
        self.tool_errors = 0
        self.turn_tools: list[list[str]] = []

    # -- the conversation ------------------------------------------------------------------------------

    def turn(self, text: str, calls: list[ToolCall]) -> list[ToolResult]:
        self.messages.append(Message("assistant", text, calls))
        results = execute_parallel(self.ctx, calls)
        self.messages += [Message("tool", r.text) for r in results]
        self.tool_errors += sum(r.is_error for r in results)
        self.turn_tools.append([c.name for c in calls])
        return results

    def first_edit_after_read(self) -> bool | None:
        return first_edit_after_read(self.turn_tools)

    def _grep_code(self, file: str, qualname: str, pattern: str, at_least: int) -> ToolCall:
        """grep for `pattern` (the first line of `qualname` in `file`) with at least `at_least` context lines
        after the match, and enough to show all of `qualname`."""
        start, end = _span(self.ctx.workspace / file, qualname)
        return ToolCall("grep", {"pattern": pattern, "-A": max(at_least, end - start)})

    def _grep_definition(self, step: dict) -> ToolCall:
        pattern = _definition_pattern(step["function"])
        return self._grep_code(step["file"], step["function"], pattern, DEFINITION_CONTEXT)

    # -- the plan --------------------------------------------------------------------------------------

    def run(self) -> None:
        meta = self.task.metadata
        bug = meta["bug"]
        chain = bug["chain"]
        shown_file, shown_test = meta["shown_test"].split("::")

        # 1. REPRODUCE
        self.turn(SAY["reproduce"], [_terminal(TEST_COMMAND)])

        # 2. SEARCH for the entry point the report calls and for the failing test, two greps in one turn
        # (run in parallel), each showing the lines after its match: the definition's body and the test's.
        # Both patterns are names the report and the test run printed, and the context lengths are
        # constants, so the whole turn is a copy; a read_file's offset and limit (where a function starts
        # and how long it is) are numbers a model would have to guess. Over the whole workspace: only the
        # definition matches anyway, and the call then names nothing the report does not.
        entry = chain[0]
        test_name = shown_test.split(".")[-1]
        self.turn(
            SAY["search"].format(f=_searched_name(entry["function"]), t=test_name),
            [
                self._grep_definition(entry),
                self._grep_code(shown_file, shown_test, rf"def {test_name}\(", TEST_CONTEXT),
            ],
        )

        # 3. TRACE down the calls to the buggy function.
        previous = entry
        for step in chain[1:]:
            self.turn(
                SAY["trace"].format(
                    p=_searched_name(previous["function"]), n=_searched_name(step["function"])
                ),
                [self._grep_definition(step)],
            )
            previous = step

        # 4. EDIT: the gold patch, as search_replace calls on the text just read.
        diagnosis = _diagnosis(_display(bug["function"]))
        for file_patch in parse_patch(self.task.patch):
            text = (self.ctx.workspace / file_patch.path).read_text()
            for _, body in file_patch.hunks:
                old, new = _replacement(text, body)
                self.turn(
                    diagnosis,
                    [
                        ToolCall(
                            "search_replace",
                            {"file_path": file_patch.path, "old_string": old, "new_string": new},
                        )
                    ],
                )
                text = text.replace(old, new, 1)
                diagnosis = "And the next change in the same fix."

        # 5. VERIFY and finish.
        results = self.turn(SAY["verify"], [_terminal(TEST_COMMAND)])
        passed = re.search(r"(\d+) passed", results[0].text)
        failed = re.search(r"\d+ (failed|error)", results[0].text)
        location = f"`{_display(bug['function'])}` in `{bug['file']}`"
        if passed and not failed:
            summary = SAY["done"].format(
                loc=location,
                why=diagnosis_sentence(meta["family"], self.task.patch, _display(bug["function"])),
                n=passed.group(1),
            )
        else:
            summary = f"I changed {location}, but the tests still fail."
        self.messages.append(Message("assistant", summary))


# ------------------------------------------------------------------------------------------------ helpers


def _terminal(command: str) -> ToolCall:
    return ToolCall("run_terminal_cmd", {"command": command, "is_background": False})


def _display(qualname: str) -> str:
    """How a function is named in prose: `Class` for a constructor, `Class.method`, `function`."""
    return qualname.removesuffix(".__init__")


def _searched_name(qualname: str) -> str:
    """The name a definition's grep pattern holds: the class of a constructor, else the function's own name
    (a method without its class)."""
    if qualname.endswith(".__init__"):
        return qualname.split(".")[0]
    return qualname.split(".")[-1]


def _definition_pattern(qualname: str) -> str:
    r"""The grep pattern of a definition's first line. A method's is `def.name\(`, the dot matching the
    space: the tokenizer merges a space into the word after it, and a method's name reaches the conversation
    only after a dot (`acct.debit(`), never after a space, so `def debit` would hold a token (` debit`) the
    model cannot copy from anything it has read, while `.debit` is the report's own pair of tokens. A
    function's or class's name follows a space in the report (`import chunked`, `= chunked(`), as in
    `def chunked`. Measured on 81 held-out method tasks (SFT model, greedy): the right method found by 22
    with `def debit\(`, 48 with `def\s+debit\(` (its single-character tokens were where it went wrong),
    79 with `def.debit\(`."""
    name = _searched_name(qualname)
    if qualname.endswith(".__init__"):
        return rf"class {name}\b"
    if "." in qualname:
        return rf"def.{name}\("
    return rf"def {name}\("


def _span(path: Path, qualname: str) -> tuple[int, int]:
    """First and last line of function (or test) `qualname` in `path` (a constructor: the class header
    through __init__)."""
    tree = ast.parse(path.read_text())
    parts = qualname.split(".")
    scope = tree.body
    node = None
    for part in parts:
        node = next(n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part)
        scope = node.body
    start = node.lineno
    if parts[-1] == "__init__":  # from the class line (where grep found `class X`)
        start = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == parts[0]).lineno
    return start, node.end_lineno


def _changed(patch: str) -> tuple[list[str], list[str]]:
    """Removed and added lines of a patch, stripped."""
    removed, added = [], []
    for fp in parse_patch(patch):
        for _, body in fp.hunks:
            removed += [b[1:].strip() for b in body if b[0] == "-"]
            added += [b[1:].strip() for b in body if b[0] == "+"]
    return removed, added


def diagnosis_sentence(family: str, patch: str, function: str) -> str:
    """One sentence that says what was wrong, from the patch's lines."""
    removed, added = _changed(patch)
    old = removed[0] if removed else ""
    new = added[0] if added else ""
    if family == "missing_return":
        return f"`{function}` computed its result but never returned it, so it gave `None`; it needs `{new}`."
    if family == "early_return":
        return f"`{new}` was inside the loop, so `{function}` returned after the first iteration."
    what = {
        "wrong_operator": "used the wrong operator",
        "off_by_one": "was off by one",
        "wrong_constant": "had the wrong constant",
        "swapped_arguments": "passed the arguments in the wrong order",
        "negated_condition": "had its condition inverted",
        "wrong_variable": "used the wrong variable",
    }.get(family, "was wrong")
    return f"`{old}` {what}; it should be `{new}`."


def _diagnosis(function: str) -> str:
    """The text before the edit: short, and restating no code. The edit's call carries the old and new
    lines; a sentence that spelt them out as well doubled what a model must get right, and a small
    model's slips there (a family's phrase mixed with another's, a line half copied) were copied on into
    its call."""
    return f"Found the bug in `{function}`. Let me fix it."


def _replacement(text: str, body: list[str]) -> tuple[str, str]:
    """(old_string, new_string) for one hunk: the changed lines, widened with context lines until the old
    side is non-empty and occurs exactly once in `text`."""
    changed = [i for i, b in enumerate(body) if b[0] in "-+"]
    lo, hi = changed[0], changed[-1]
    while True:
        old = "".join(b[1:] for b in body[lo : hi + 1] if b[0] in " -")
        new = "".join(b[1:] for b in body[lo : hi + 1] if b[0] in " +")
        if old.strip() and text.count(old) == 1:
            break
        if lo == 0 and hi == len(body) - 1:
            break
        if lo > 0:
            lo -= 1
        elif hi < len(body) - 1:
            hi += 1
    # Without the final newline, as a person would select the lines (both sides end the same way).
    if old.endswith("\n") and new.endswith("\n"):
        old, new = old[:-1], new[:-1]
    return old, new
