"""run_terminal_cmd: the template of docs/tools.md, with a fake sandbox and with the real one."""

import dataclasses
import time

import pytest

from env.chat import ToolCall
from env.tools import ToolContext, ToolResult, execute
from env.tools.terminal import MAX_OUTPUT_CHARS


@dataclasses.dataclass
class FakeResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    isolation: str = "fake"
    cwd: str = "/workspace"
    truncated: bool = False


class FakeSandbox:
    """Stands for env.sandbox.Sandbox: `.shell` returns canned results (after `delay` seconds)."""

    def __init__(self, result: FakeResult, delay: float = 0.0):
        self.result, self.delay, self.commands = result, delay, []

    def shell(self, command, *, timeout=None):
        self.commands.append((command, timeout))
        time.sleep(self.delay)
        return self.result

    def start_background(self, command):
        self.commands.append((command, "background"))
        return "7", 4242, "/tmp/background-7.log"


def run(ctx, command, is_background=False):
    return execute(ctx, ToolCall("run_terminal_cmd", {"command": command, "is_background": is_background}))


def test_completed_command_template(tmp_path):
    box = FakeSandbox(FakeResult(1, "F.\n1 failed, 1 passed\n", cwd="/workspace/pkg"))
    ctx = ToolContext(tmp_path, box)
    ctx.command_timeout = 30
    r = run(ctx, "cd pkg && python -m pytest -q")
    assert r == ToolResult(
        "Exit code: 1\n\nCommand output:\n\n```\ncd pkg && python -m pytest -q\nF.\n1 failed, 1 passed\n"
        "```\n\nCommand completed.\n\nThe previous shell command ended, so on the next invocation of this "
        "tool, you will be reusing the shell.\n\nOn the next terminal tool call, the directory of the shell "
        "will already be /workspace/pkg."
    )
    assert box.commands == [("cd pkg && python -m pytest -q", 30)]


def test_command_without_output(tmp_path):
    r = run(ToolContext(tmp_path, FakeSandbox(FakeResult(0, ""))), "true")
    assert r.text.startswith("Exit code: 0\n\nCommand output:\n\n```\ntrue\n```\n\nCommand completed.")


def test_timed_out_command_shows_partial_output(tmp_path):
    r = run(ToolContext(tmp_path, FakeSandbox(FakeResult(None, "tick\ntick\n", timed_out=True))), "watch x")
    assert r == ToolResult(
        "Command timed out.\n\nCommand output:\n\n```\nwatch x\ntick\ntick\n```\n\n"
        "On the next terminal tool call, the directory of the shell will already be /workspace."
    )


def test_output_capped_keeping_head_and_tail(tmp_path):
    output = "head\n" + "x" * 50_000 + "\ntail"
    text = run(ToolContext(tmp_path, FakeSandbox(FakeResult(0, output))), "cat big").text
    block = text.split("```\n")[1]
    assert block.startswith("cat big\nhead\n") and block.endswith("\ntail\n")
    assert f"... {len(output) - MAX_OUTPUT_CHARS} characters truncated ..." in block
    assert len(block) < MAX_OUTPUT_CHARS + 100


def test_background_command(tmp_path):
    box = FakeSandbox(FakeResult(0, ""))
    r = run(ToolContext(tmp_path, box), "python -m http.server", is_background=True)
    assert r == ToolResult(
        "Background command started successfully.\n\nShell ID: 7\nPID: 4242\n"
        "Output file: /tmp/background-7.log"
    )
    assert box.commands == [("python -m http.server", "background")]


def test_refused_commands(tmp_path):
    box = FakeSandbox(FakeResult(0, ""))
    multi = run(ToolContext(tmp_path, box), "echo a\necho b")
    assert multi.is_error and "single line" in multi.text
    assert box.commands == []
    none = run(ToolContext(tmp_path), "ls")
    assert none.is_error and "no sandbox" in none.text


def test_real_sandbox_keeps_the_working_directory(tmp_path):
    sandbox = pytest.importorskip("env.sandbox", reason="env.sandbox is not available")
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "data.txt").write_text("hello\n")
    ws = sandbox.make_workspace(repo)
    box = sandbox.Sandbox(ws)
    try:
        ctx = ToolContext(ws, box)
        first = run(ctx, "cd pkg && cat data.txt")
        assert first.text.startswith(
            "Exit code: 0\n\nCommand output:\n\n```\ncd pkg && cat data.txt\nhello\n```"
        )
        assert first.text.endswith("the directory of the shell will already be /workspace/pkg.")
        second = run(ctx, "pwd && false")
        assert second.text.startswith(
            "Exit code: 1\n\nCommand output:\n\n```\npwd && false\n/workspace/pkg\n```"
        )
        # files the tools write stay writable by the sandbox's commands (which may run as another uid)
        execute(ctx, ToolCall("write", {"file_path": "pkg/new/made.txt", "contents": "a\n"}))
        third = run(ctx, "echo b >> new/made.txt && echo c > new/other.txt && cat new/made.txt")
        assert third.text.startswith("Exit code: 0\n\nCommand output:\n\n```\necho b")
        assert (ws / "pkg/new/made.txt").read_text() == "a\nb\n"
    finally:
        box.close()
        sandbox.remove_workspace(ws)
