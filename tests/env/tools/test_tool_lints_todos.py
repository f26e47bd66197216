"""read_lints (real ruff) and todo_write against the templates of docs/tools.md."""

import json

import pytest

from env.chat import ToolCall
from env.tools import ToolContext, ToolResult, execute
from env.tools.todos import REMINDER


def call(ctx, name, **arguments):
    return execute(ctx, ToolCall(name, arguments))


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "clean.py").write_text("def f(x):\n    return x + 1\n")
    (root / "README.md").write_text("import os\n")  # not Python: never linted
    return root


# ------------------------------------------------------------------------------------------ read_lints


def test_no_lints(ws):
    assert call(ToolContext(ws), "read_lints") == ToolResult("No linter errors found.")
    assert call(ToolContext(ws), "read_lints", paths=["README.md"]) == ToolResult("No linter errors found.")


def test_lints_found(ws):
    (ws / "pkg" / "bad.py").write_text("import os\n\n\ndef g():\n    return undefined_name\n")
    (ws / "broken.py").write_text("x = (1,\n")
    r = call(ToolContext(ws), "read_lints")
    lines = r.text.splitlines()
    assert not r.is_error
    assert lines[0] == "Found 3 linter errors in 2 files:"
    assert lines[1] == "broken.py (1 errors):"
    assert lines[2] == "  [ERROR] Line 2:1 - unexpected EOF while parsing (ruff invalid-syntax)"
    assert lines[3:] == [
        "pkg/bad.py (2 errors):",
        "  [WARNING] Line 1:8 - `os` imported but unused (ruff F401)",
        "  [ERROR] Line 5:12 - Undefined name `undefined_name` (ruff F821)",
    ]
    only = call(ToolContext(ws), "read_lints", paths=["/workspace/pkg"])
    assert only.text.splitlines()[:2] == ["Found 2 linter errors in 1 files:", "pkg/bad.py (2 errors):"]


def test_lints_missing_path(ws):
    r = call(ToolContext(ws), "read_lints", paths=["nope.py"])
    assert r.is_error and "nope.py" in r.text


# ------------------------------------------------------------------------------------------ todo_write


def todo(i, status="pending", content=None):
    return {"id": str(i), "content": content or f"step {i}", "status": status}


def test_todo_replace(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "todo_write", merge=False, todos=[todo(1, "in_progress"), todo(2)])
    assert r == ToolResult(f"Successfully updated TODOs. {REMINDER}")
    assert ctx.todos == [todo(1, "in_progress"), todo(2)]


def test_todo_merge(ws):
    ctx = ToolContext(ws)
    call(ctx, "todo_write", merge=False, todos=[todo(1, "in_progress"), todo(2), todo(3)])
    r = call(ctx, "todo_write", merge=True, todos=[todo(1, "completed"), todo(4, "in_progress", "new step")])
    latest = [todo(1, "completed"), todo(2), todo(3), todo(4, "in_progress", "new step")]
    assert r == ToolResult(
        f"Successfully updated TODOs. {REMINDER}\n\nHere are the latest contents of your todo list:\n"
        + json.dumps(latest)
    )
    assert ctx.todos == latest


def test_todo_rules(ws):
    ctx = ToolContext(ws)
    call(ctx, "todo_write", merge=False, todos=[todo(1, "in_progress"), todo(2)])
    before = list(ctx.todos)
    two = call(ctx, "todo_write", merge=True, todos=[todo(2, "in_progress"), todo(3)])
    assert two.is_error and "at most one todo may be in_progress" in two.text
    one = call(ctx, "todo_write", merge=True, todos=[todo(1, "completed")])
    assert one.is_error and "at least 2 items" in one.text
    status = call(ctx, "todo_write", merge=False, todos=[todo(1, "done"), todo(2)])
    assert status.is_error and "status" in status.text and "in_progress" in status.text
    duplicate = call(ctx, "todo_write", merge=False, todos=[todo(1), todo(1)])
    assert duplicate.is_error and "duplicate" in duplicate.text
    missing = call(ctx, "todo_write", merge=False, todos=[{"id": "1", "status": "pending"}, todo(2)])
    assert missing.is_error and "content" in missing.text
    assert ctx.todos == before
