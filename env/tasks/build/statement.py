"""The problem statement of a built task: the failing behaviour, as a user would report it.

It names the failing tests, shows the test line that failed and the error or assertion message pytest gave
(trimmed), and says the other tests of the same files still pass. It never shows library code: only test
source and exception text, and any line that holds a line the gold patch adds is dropped (`leaks` checks
the finished text; a statement that still leaks is discarded by the builder).
"""

import random
import re

from env.tasks.diffs import parse_patch

MAX_MESSAGE_LINES = 12
MAX_LINE_CHARS = 200
MAX_LISTED = 6

_OPENINGS = (
    "`{first}` fails:",
    "After updating to this version, `{first}` started failing:",
    "I am seeing a test failure in `{first}`:",
    "The test suite is no longer green: `{first}` fails with",
)
_CLOSINGS = (
    "The tests are correct; the library code is what is wrong. The failing tests should pass again, and the "
    "rest should keep passing.",
    "Please fix the code (not the tests) so that these pass again without breaking anything else.",
    "Could you fix this? The tests themselves have not changed and should pass as they are.",
)


def added_lines(patch: str) -> list[str]:
    """The non-empty lines (stripped) that `patch` adds."""
    out = []
    for fp in parse_patch(patch):
        for _, body in fp.hunks:
            out.extend(b[1:].strip() for b in body if b[:1] == "+" and b[1:].strip())
    return out


def leaks(text: str, patch: str) -> list[str]:
    """The lines added by `patch` that appear in `text`."""
    return [line for line in added_lines(patch) if line in text]


# Parts of a message that change from run to run; the same seed must give the same statement.
_VOLATILE = (
    (re.compile(r"\b0x[0-9a-fA-F]{4,}\b"), "0x..."),  # object addresses in reprs
    (re.compile(r"\.\.\.x[0-9a-fA-F]{4,}>"), "...>"),  # the same, cut short by pytest
    (re.compile(r"/pytest-of-[^/\s]+/pytest-\d+/"), "/pytest/"),  # tmp_path of one run
)


def _trim(text: str, root: str) -> list[str]:
    text = text.replace(root.rstrip("/") + "/", "")
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    lines = []
    for line in text.splitlines():
        if not line.strip():
            continue
        lines.append(line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "...")
        if len(lines) == MAX_MESSAGE_LINES:
            lines.append("...")
            break
    return lines


def write(
    rng: random.Random,
    failing: list[str],
    failures: dict[str, dict],
    files: list[str],
    n_passing: int,
    patch: str,
    root: str,
) -> str:
    """The statement for tests `failing` (node ids, in order) with their `failures` from the plugin; `files`
    are the test files the task runs, `n_passing` how many of their tests still pass, `root` the workspace
    path as the sandbox saw it (removed from messages)."""
    first = failing[0]
    info = failures.get(first, {})
    shown = []
    if info.get("test_line"):
        where = f"{first.split('::')[0]}:{info['test_lineno']}" if info.get("test_lineno") else ""
        test_line = _trim(info["test_line"], root)[:3]
        shown += [f"{where}: {test_line[0]}" if where else test_line[0], *test_line[1:]]
    exc, message = info.get("exc", ""), info.get("message", "")
    message_lines = _trim(message, root)
    if message_lines:
        shown += [f"{exc}: {message_lines[0]}" if exc else message_lines[0], *message_lines[1:]]
    elif exc:
        shown.append(exc)
    bad = added_lines(patch)
    shown = [line for line in shown if not any(b in line for b in bad)]
    parts = [rng.choice(_OPENINGS).format(first=first)]
    if shown:
        parts.append("```\n" + "\n".join(shown) + "\n```")
    if len(failing) > 1:
        listed = [f"- {t}" for t in failing[:MAX_LISTED]]
        if len(failing) > MAX_LISTED:
            listed.append(f"- ... and {len(failing) - MAX_LISTED} more")
        parts.append(f"{len(failing)} tests fail in all:\n" + "\n".join(listed))
    where = ", ".join(files[:3]) + (f" and {len(files) - 3} more files" if len(files) > 3 else "")
    if n_passing:
        parts.append(f"The other {n_passing} tests in {where} still pass.")
    parts.append(rng.choice(_CLOSINGS))
    return "\n\n".join(parts) + "\n"
