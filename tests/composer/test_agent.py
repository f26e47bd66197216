"""The agent CLI on a small real repository, its endpoint the server (an engine replaying a fix: an edit, the
tests in the sandbox, a summary): the diff printed, the repository untouched without --apply and fixed
with it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from serving_helpers import Replay, Server, require_bubblewrap

from composer.pipeline import learner as learner_lib
from composer.serving import openai_api
from env import chat
from experiments import composer as experiment

ROOT = Path(__file__).resolve().parents[2]


def _call(name: str, **arguments) -> str:
    return (
        f"{chat.TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{chat.TOOL_CALL_CLOSE}"
    )


TURNS = [
    "Fixing the operator.\n"
    + _call("search_replace", file_path="calc.py", old_string="a - b", new_string="a + b"),
    _call("run_terminal_cmd", command="python -m pytest -q", is_background=False),
    "add now returns a + b; the tests pass.",
]


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    return repo


def _agent(repo: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    return subprocess.run(
        [sys.executable, "-m", "composer.agent", f"--repo={repo}", f"--base_url={url}", "--model=tiny",
         *extra, "add(2, 3) returns -1: fix it"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.parametrize("apply", [False, True])
def test_the_agent_fixes_a_copy_prints_the_diff_and_writes_back_only_with_apply(tmp_path, apply):
    require_bubblewrap("the agent")
    config = experiment.get_config("tiny")
    tokenizer = learner_lib.fit_tokenizer(config, TURNS * 10)
    server = Server(openai_api.make_app(Replay(tokenizer, config, TURNS), "tiny"))
    repo = _repo(tmp_path)
    try:
        out = _agent(repo, server.url, *(["--apply"] if apply else []))
    finally:
        server.close()
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[turn 1] Fixing the operator." in out.stdout and "-> search_replace(" in out.stdout
    # The tests ran in the sandbox, on the edited copy, and passed.
    assert "-> run_terminal_cmd(" in out.stdout and "Exit code: 0" in out.stdout and "1 passed" in out.stdout
    assert "[turn 3] add now returns a + b" in out.stdout
    assert "-    return a - b\n+    return a + b" in out.stdout  # the diff
    source = (repo / "calc.py").read_text()
    if apply:
        assert "return a + b" in source and "applied 1 file(s)" in out.stdout
    else:
        assert source == "def add(a, b):\n    return a - b\n" and "rerun with --apply" in out.stdout


def test_the_agent_needs_an_endpoint_or_a_model(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "composer.agent", f"--repo={_repo(tmp_path)}", "fix it"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode != 0 and "--base-url" in out.stderr
