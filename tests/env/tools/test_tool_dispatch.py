"""Schemas, argument validation, malformed calls, parallel execution, and the command line."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from env.chat import CallError, ToolCall
from env.tools import (
    TOOL_NAMES,
    ToolContext,
    ToolResult,
    codebase_search,
    dispatch,
    execute,
    execute_json,
    execute_parallel,
    offered_tools,
    tool_schemas,
)

ROOT = Path(__file__).resolve().parents[3]

# The required arguments of docs/tools.md's table.
REQUIRED = {
    "read_file": ["target_file"],
    "search_replace": ["file_path", "old_string", "new_string"],
    "write": ["file_path", "contents"],
    "grep": ["pattern"],
    "glob_file_search": ["glob_pattern"],
    "list_dir": ["target_directory"],
    "codebase_search": ["query", "target_directories"],
    "run_terminal_cmd": ["command", "is_background"],
    "read_lints": [],
    "todo_write": ["merge", "todos"],
    "delete_file": ["target_file"],
}


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.py").write_text("def f():\n    return 1\n")
    return root


def test_schemas():
    schemas = tool_schemas()
    assert tuple(s["function"]["name"] for s in schemas) == TOOL_NAMES == tuple(REQUIRED)
    for s in schemas:
        assert s["type"] == "function" and s["function"]["description"]
        params = s["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == REQUIRED[s["function"]["name"]]
        assert all("type" in p for p in params["properties"].values())
    grep = schemas[TOOL_NAMES.index("grep")]["function"]["parameters"]["properties"]
    options = {
        "pattern",
        "path",
        "glob",
        "output_mode",
        "-A",
        "-B",
        "-C",
        "-i",
        "multiline",
        "type",
        "head_limit",
    }
    assert set(grep) == options
    json.dumps(schemas)  # JSON-able for the system prompt
    schemas[0]["function"]["name"] = "changed"
    assert tool_schemas()[0]["function"]["name"] == "read_file"  # callers get copies


@pytest.mark.parametrize(
    "call, needle",
    [
        (
            ToolCall("read_files", {"target_file": "a.py"}),
            "unknown tool 'read_files'. Valid tools: read_file, ",
        ),
        (ToolCall("read_file", {}), "missing required argument 'target_file'"),
        (ToolCall("read_file", {"target_file": 3}), "argument 'target_file' must be a string, got integer"),
        (
            ToolCall("read_file", {"target_file": "a.py", "limit": "5"}),
            "'limit' must be an integer, got string",
        ),
        (ToolCall("read_file", {"target_file": "a.py", "limit": 0}), "'limit' must be at least 1"),
        (
            ToolCall("read_file", {"target_file": "a.py", "offset": True}),
            "'offset' must be an integer, got boolean",
        ),
        (
            ToolCall("read_file", {"target_file": "a.py", "lines": 5}),
            "unknown argument 'lines' for read_file",
        ),
        (ToolCall("run_terminal_cmd", {"command": "ls"}), "missing required argument 'is_background'"),
        (
            ToolCall("run_terminal_cmd", {"command": "ls", "is_background": 0}),
            "'is_background' must be a boolean",
        ),
        (ToolCall("grep", {"pattern": "x", "output_mode": "lines"}), "'output_mode' must be one of content"),
        (
            ToolCall("list_dir", {"target_directory": ".", "ignore_globs": "*.pyc"}),
            "must be an array, got string",
        ),
        (
            ToolCall("list_dir", {"target_directory": ".", "ignore_globs": [1]}),
            "'ignore_globs'[0] must be a string",
        ),
        (ToolCall("codebase_search", {"query": "q"}), "missing required argument 'target_directories'"),
        (
            CallError("invalid JSON: Expecting value (line 1, column 1)", "<tool_call>{</tool_call>"),
            "invalid JSON",
        ),
    ],
)
def test_malformed_calls_are_error_results(ws, call, needle):
    r = execute(ToolContext(ws), call)
    assert r.is_error and r.text.startswith("Error: ") and needle in r.text


def test_execute_json(ws):
    ctx = ToolContext(ws)
    ok = execute_json(ctx, '{"name": "read_file", "arguments": {"target_file": "a.py"}}')
    assert ok == ToolResult("     1|def f():\n     2|    return 1")
    bad = execute_json(ctx, '{"name": "read_file", "arguments": {"target_file": "a.py"')
    assert bad.is_error and "invalid JSON" in bad.text
    not_object = execute_json(ctx, '{"name": "read_file", "arguments": "a.py"}')
    assert not_object.is_error and "arguments" in not_object.text


def test_a_crashing_tool_is_an_error_result(ws, monkeypatch):
    def broken(ctx, args):
        raise RuntimeError("boom")

    monkeypatch.setitem(dispatch.TOOLS, "list_dir", broken)
    r = execute(ToolContext(ws), ToolCall("list_dir", {"target_directory": "."}))
    assert r == ToolResult("Error: internal error in list_dir: RuntimeError: boom", True)


class SlowSandbox:
    def shell(self, command, *, timeout=None):
        time.sleep(1.0)
        return SimpleNamespace(exit_code=0, output=f"{command}-done\n", timed_out=False, cwd="/workspace")


class SlowEncoder:
    def encode(self, texts):
        time.sleep(0.25)
        return np.ones((len(texts), 4), np.float32) / 2


def test_parallel_calls_overlap_and_keep_their_order(ws):
    ctx = ToolContext(ws, SlowSandbox())
    ctx.encoder = SlowEncoder()  # the index build and the query encoding: 0.5 s in all
    codebase_search._bm25s()  # imported beforehand, so that the timing is the tools'

    calls = [
        ToolCall("run_terminal_cmd", {"command": "first", "is_background": False}),
        ToolCall("codebase_search", {"query": "f", "target_directories": []}),
        ToolCall("nope", {}),
        ToolCall("read_file", {"target_file": "a.py"}),
        CallError('missing "name"', "{}"),
    ]
    start = time.perf_counter()
    results = execute_parallel(ctx, calls)
    elapsed = time.perf_counter() - start
    assert "first-done" in results[0].text
    assert results[1].text.startswith("a.py:1-2\n")
    assert results[2].is_error and "unknown tool" in results[2].text
    assert results[3] == ToolResult("     1|def f():\n     2|    return 1")
    assert results[4].is_error
    assert elapsed < 1.4, elapsed  # 1 s of shell alongside 0.5 s of search, not 1.5 s one after the other


def test_parallel_edits_of_one_file_are_not_lost(ws):
    (ws / "many.txt").write_text("".join(f"item{i}\n" for i in range(20)))
    ctx = ToolContext(ws)
    calls = [
        ToolCall(
            "search_replace",
            {"file_path": "many.txt", "old_string": f"item{i}\n", "new_string": f"done{i}\n"},
        )
        for i in range(20)
    ]
    assert not any(r.is_error for r in execute_parallel(ctx, calls))
    assert (ws / "many.txt").read_text() == "".join(f"done{i}\n" for i in range(20))
    assert threading.active_count() < 5


# ------------------------------------------------------------------------------------------------------ CLI


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "env.tools", "call", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_the_result_as_the_model_sees_it(ws):
    call = json.dumps({"name": "read_file", "arguments": {"target_file": "/workspace/a.py", "limit": 1}})
    out = cli("--workspace", str(ws), "--json", call)
    assert out.returncode == 0 and out.stdout == "     1|def f():\n... 1 lines not shown ...\n"
    as_json = cli("--workspace", str(ws), "--json", call, "--json-output")
    assert json.loads(as_json.stdout) == {
        "text": "     1|def f():\n... 1 lines not shown ...",
        "is_error": False,
    }


def test_cli_error_results(ws):
    out = cli("--workspace", str(ws), "--json", '{"name": "read_file", "arguments": {"target_file": "zz"}}')
    assert out.returncode == 1 and out.stdout == "Error: File not found\n"
    bad = cli("--workspace", str(ws), "--json", "{not json", "--json-output")
    result = json.loads(bad.stdout)
    assert bad.returncode == 1 and result["is_error"] and "invalid JSON" in result["text"]


def test_cli_runs_terminal_commands_in_a_sandbox(tmp_path):
    sandbox = pytest.importorskip("env.sandbox", reason="env.sandbox is not available")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "hello.txt").write_text("hi there\n")
    ws = sandbox.make_workspace(repo)
    try:
        call = json.dumps(
            {"name": "run_terminal_cmd", "arguments": {"command": "cat hello.txt", "is_background": False}}
        )
        out = cli("--workspace", str(ws), "--json", call)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(
            "Exit code: 0\n\nCommand output:\n\n```\ncat hello.txt\nhi there\n```\n\n"
        )
    finally:
        sandbox.remove_workspace(ws)


def test_a_context_offers_a_subset_of_the_tools(ws):
    tools = offered_tools(" grep,read_file ")
    assert tools == ("read_file", "grep")  # in TOOL_NAMES order, whatever the list's
    assert offered_tools("") is None and offered_tools("all") is None
    with pytest.raises(ValueError, match="'grap'"):
        offered_tools("read_file,grap")
    assert [s["function"]["name"] for s in tool_schemas(tools)] == ["read_file", "grep"]
    ctx = ToolContext(ws, tools=tools)
    refused = execute(ctx, ToolCall("list_dir", {"target_directory": "."}))
    assert refused.is_error and refused.text == "Error: unknown tool 'list_dir'. Valid tools: read_file, grep"
    assert "return 1" in execute(ctx, ToolCall("read_file", {"target_file": "a.py"})).text
    assert not execute(ToolContext(ws), ToolCall("list_dir", {"target_directory": "."})).is_error
