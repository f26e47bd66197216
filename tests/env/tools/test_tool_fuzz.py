"""Fuzzing the dispatcher: every tool with malformed JSON, wrong types, hostile paths and hostile patterns.

Every call must come back as a result (never raise), none may be an internal error (a bug of ours: every bad
argument has a clear error result), and nothing outside the workspace may change. Seeded, so a failure
reproduces; the call that failed is named in the assertion.
"""

import os
import random
import time
from pathlib import Path

import pytest

from env.chat import ToolCall
from env.tools import TOOL_NAMES, ToolContext, ToolResult, execute, execute_json
from env.tools.schemas import tool_schemas

N_CALLS = 4000

# Strings that are hostile as paths, patterns, globs, commands or text.
HOSTILE = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "a.py\x00",
    "../",
    "..",
    "../outside/secret.txt",
    "pkg/../../outside",
    "/etc/passwd",
    "/workspace/../etc/passwd",
    "/workspace/../../..",
    "/workspace",
    "//workspace//pkg",
    "out_dir",
    "out_dir/secret.txt",
    "out_file",
    "loop",
    "loop/x",
    "fifo",
    "pkg/fifo_in_pkg",
    "pkg/pipe.py",
    "a.py/inside_a_file",
    "a" * 300,
    "d/" * 2100,
    "x" * 70_000,
    "\udcff",
    "\ud800",
    "caf\udce9.py",
    "café.py",
    "\ufffd",
    "\n",
    "a\nb",
    "\r",
    "*",
    "**",
    "**/",
    "[",
    "[]",
    "{a,b",
    "{" * 200,
    "(",
    "(?<x",
    "\\",
    "a{1000000}",
    "(a+)+$",
    ".*" * 50,
    "\\p{Nope}",
    "-e",
    "--files",
    "--pre=sh",
    "-",
    "--",
    "~",
    "~root",
    "$HOME",
    "%s%s%n",
    "\u202e",
    "😀",
]
SANE = ["a.py", "pkg", "pkg/mod.py", ".", "/workspace/pkg", "f", "*.py", "def", "x = 1", "py"]


def _strings(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(HOSTILE)
    if roll < 0.7:
        return rng.choice(SANE)
    if roll < 0.85:
        return rng.choice(HOSTILE) + rng.choice(SANE)
    # Random code points, surrogates and controls included.
    return "".join(chr(rng.choice([rng.randrange(0, 0x80), rng.randrange(0, 0x110000)])) for _ in range(8))


def _junk(rng: random.Random, depth: int = 0):
    """A JSON value of any type."""
    kind = rng.randrange(8 if depth < 2 else 6)
    return [
        lambda: None,
        lambda: rng.choice([True, False]),
        lambda: rng.choice([0, -1, 1, 2**63, -(2**70), 10**30]),
        lambda: rng.choice([0.5, -1e308, float("inf"), float("nan")]),
        lambda: _strings(rng),
        lambda: rng.choice([[], {}]),
        lambda: [_junk(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {_strings(rng): _junk(rng, depth + 1) for _ in range(rng.randrange(4))},
    ][kind]()


def _value(rng: random.Random, schema: dict, junk: float):
    """A value for `schema`: of the right type (hostile content), or with probability `junk` of any type."""
    if rng.random() < junk:
        return _junk(rng)
    kind = schema["type"]
    if kind == "string":
        if "enum" in schema and rng.random() < 0.8:
            return rng.choice(schema["enum"])
        return _strings(rng)
    if kind == "integer":
        return rng.choice([0, 1, 3, 50, 10**9, 10**30, -5] if junk else [0, 1, 2, 3, 50, 10**9, 10**30])
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "array":
        n = rng.choice([0, 1, 2, 2, 3, 5])
        return [_value(rng, schema["items"], junk) for _ in range(n)]
    if kind == "object":
        out = {k: _value(rng, s, junk) for k, s in schema["properties"].items() if rng.random() > junk}
        if rng.random() < junk:
            out[_strings(rng)] = _junk(rng)
        return out
    raise AssertionError(kind)


def _call(rng: random.Random, schemas: dict[str, dict]) -> ToolCall:
    """Half the calls fit the schema's types (the hostility is in the values), half carry junk too."""
    junk = rng.choice([0.0, 0.0, 0.05, 0.3])
    name = rng.choice(TOOL_NAMES) if rng.random() < 0.97 else _strings(rng)
    params = schemas.get(name, {"properties": {}, "required": []})
    args = {}
    for key, schema in params["properties"].items():
        if (key in params["required"] and rng.random() > junk / 4) or rng.random() < 0.5:
            args[key] = _value(rng, schema, junk)
    if rng.random() < junk:
        args[_strings(rng)] = _junk(rng)
    return ToolCall(name, args)


RAW_CALLS = [
    "",
    "{",
    "[" * 100_000,
    '{"name": "grep"}',
    '{"name": "grep", "arguments": "x"}',
    '{"name": 1, "arguments": {}}',
    '{"name": "", "arguments": {}}',
    '{"name": "grep", "arguments": {}, "extra": 1}',
    '{"name": "grep", "arguments": {"pattern": "\\u0000"}}',
    '{"name": "grep", "arguments": {"pattern": "\\udcff"}}',
    '{"name": "write", "arguments": {"file_path": "s.py", "contents": "\\ud800"}}',
    '{"name": "read_file", "arguments": {"target_file": "a.py", "limit": 1' + "0" * 5000 + "}}",
    '{"name": "read_file", "arguments": {"target_file": "a.py", "offset": 1e400}}',
    '{"name": "grep", "arguments": {"pattern": NaN}}',
    "\udcff",
    "\x00",
]


class FakeSandbox:
    """Stands in for env.sandbox.Sandbox: the fuzzer must not run hostile shell commands. Like the real one
    (which starts `bash -c command`), it cannot take a NUL byte."""

    def _check(self, command: str) -> None:
        if "\x00" in command:
            raise ValueError("embedded null byte")
        command.encode()  # a lone surrogate cannot be passed to a process either

    def shell(self, command, *, timeout=None):
        self._check(command)
        return type("Result", (), {"exit_code": 0, "output": "", "timed_out": False, "cwd": "/workspace"})

    def start_background(self, command):
        self._check(command)
        return "1", 1, "/tmp/background-1.log"


def _populate(root: Path, outside: Path) -> None:
    """The workspace's fixtures; re-created when a call deleted or replaced one."""
    (root / "pkg").mkdir(exist_ok=True)
    for rel, text in [("a.py", "def f():\n    return 1\n"), ("pkg/mod.py", "x = 1\n")]:
        if not (root / rel).is_file():
            (root / rel).write_text(text)
    (root / "pkg" / "blob.bin").write_bytes(b"\x00\xff" * 100)
    (root / os.fsdecode(b"caf\xe9.py")).write_text("y = 2\n")  # a name that is not UTF-8
    for name, target in [("out_dir", outside), ("out_file", outside / "secret.txt"), ("loop", "loop")]:
        if not os.path.lexists(root / name):
            os.symlink(target, root / name)
    for rel in ("fifo", "pkg/fifo_in_pkg", "pkg/pipe.py"):
        if not os.path.lexists(root / rel):
            os.mkfifo(root / rel)


def _snapshot(root: Path) -> dict[str, object]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if path.is_symlink():
                out[str(path)] = ("link", os.readlink(path))
            elif path.is_file():
                out[str(path)] = ("file", path.read_bytes(), path.stat().st_mode)
            else:
                out[str(path)] = ("dir", path.stat().st_mode)
    return out


def test_fuzzed_calls_give_clear_results_and_stay_in_the_workspace(tmp_path):
    root, outside = tmp_path / "ws", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (outside / "mod.py").write_text("import os\n")
    _populate(root, outside)
    before = _snapshot(outside)
    siblings = sorted(os.listdir(tmp_path))
    ctx = ToolContext(root, FakeSandbox())
    ctx.command_timeout = 1.0
    rng = random.Random(0)
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas()}

    def check(result, what) -> None:
        assert isinstance(result, ToolResult) and isinstance(result.text, str), what
        assert "internal error" not in result.text, (what, result.text[:300])
        result.text.encode("utf-8")  # valid text: it goes into the conversation

    for raw in RAW_CALLS:
        check(execute_json(ctx, raw), raw[:80])
    for i in range(N_CALLS):
        if i % 50 == 0:
            _populate(root, outside)
        call = _call(rng, schemas)
        check(execute(ctx, call), f"call {i}: {call.name!r} {call.arguments!r}"[:2000])
    assert _snapshot(outside) == before
    assert sorted(os.listdir(tmp_path)) == siblings


@pytest.mark.parametrize(
    "name, arguments, needle",
    [
        ("grep", {"pattern": "a\x00b"}, "'pattern' must not contain a NUL character"),
        ("grep", {"pattern": "x", "glob": "*\x00"}, "'glob' must not contain a NUL character"),
        ("grep", {"pattern": "x", "type": "p\x00y"}, "'type' must not contain a NUL character"),
        ("glob_file_search", {"glob_pattern": "*.py\x00"}, "'glob_pattern' must not contain a NUL"),
        ("run_terminal_cmd", {"command": "ls\x00", "is_background": False}, "must not contain a NUL"),
        ("grep", {"pattern": "\udcff"}, "argument 'pattern' is not valid Unicode text"),
        ("write", {"file_path": "n.py", "contents": "\ud800"}, "argument 'contents' is not valid Unicode"),
        ("read_file", {"target_file": "a" * 300}, "too long"),
        ("grep", {"pattern": "x", "path": "d/" * 2100}, "too long"),
        ("read_file", {"target_file": "fifo"}, "not a regular file"),
        ("write", {"file_path": "loop", "contents": ""}, "a loop of symbolic links"),
        ("grep", {"pattern": "x", "path": "fifo"}, "not a regular file or directory"),
        (
            "search_replace",
            {"file_path": "pkg/pipe.py", "old_string": "a", "new_string": "b"},
            "not a regular",
        ),
        ("write", {"file_path": "a.py/b.py", "contents": ""}, "a parent of a.py/b.py is not a directory"),
    ],
)
def test_bad_arguments_are_named(tmp_path, name, arguments, needle):
    root = tmp_path / "ws"
    root.mkdir()
    _populate(root, tmp_path)
    result = execute(ToolContext(root, FakeSandbox()), ToolCall(name, arguments))
    assert result.is_error and result.text.startswith("Error: ") and needle in result.text, result.text


def test_lints_skip_a_named_pipe(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    _populate(root, tmp_path)
    (root / "pkg" / "bad.py").write_text("import os\n")
    ctx = ToolContext(root)
    for paths in (["."], ["pkg"], ["pkg/pipe.py"]):
        start = time.perf_counter()
        result = execute(ctx, ToolCall("read_lints", {"paths": paths}))
        assert not result.is_error and time.perf_counter() - start < 10  # ruff would block on the pipe
        assert ("pkg/bad.py (1 errors)" in result.text) == (paths != ["pkg/pipe.py"]), result.text


def test_results_are_valid_text(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    _populate(root, tmp_path)
    listing = execute(ToolContext(root), ToolCall("list_dir", {"target_directory": "."}))
    assert "- caf\ufffd.py" in listing.text  # the name's byte 0xe9, which is not UTF-8
