"""Choosing the isolation level (fails closed: never weaker than bubblewrap unless forced), the same view of
the workspace at every level with namespaces, and the error for a workspace the slot uids cannot enter."""

import logging
import os
import re
import tempfile
from pathlib import Path

import pytest

from env.chat import ToolCall
from env.sandbox import (
    SANDBOX_ROOT,
    IsolationUnavailable,
    Limits,
    Sandbox,
    make_workspace,
    remove_workspace,
    resolve_isolation,
)
from env.sandbox import __main__ as cli
from env.sandbox import isolation as iso
from env.sandbox.slots import is_root, state_root
from env.tools import ToolContext, execute

LIMITS = Limits(timeout_s=20.0)


@pytest.fixture
def workspace(tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_calc.py").write_text(
        "from pkg.calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 4\n"
    )
    ws = make_workspace(repo)
    yield ws
    remove_workspace(ws)


@pytest.fixture
def no_bwrap(monkeypatch):
    """bubblewrap does not work on this (pretend) machine; the other levels probe as they really do."""
    real = iso.probe
    monkeypatch.setattr(
        iso, "probe", lambda level: "bwrap is not installed" if level == "bwrap" else real(level)
    )
    monkeypatch.setattr(iso, "_warned", set())


def test_auto_means_bubblewrap(monkeypatch):
    if iso.probe("bwrap") is not None:
        pytest.skip(f"bwrap does not work here: {iso.probe('bwrap')}")
    assert resolve_isolation("auto") == resolve_isolation("bwrap") == "bwrap"
    with pytest.raises(ValueError, match="isolation must be"):
        resolve_isolation("docker")


def test_auto_fails_closed_without_bubblewrap(no_bwrap, workspace):
    for requested in ("auto", "bwrap"):
        with pytest.raises(IsolationUnavailable) as error:
            resolve_isolation(requested)
        message = str(error.value)
        assert "bwrap is not installed" in message  # the reason
        assert "apt-get install -y bubblewrap" in message  # the one line that fixes it
        assert "--config.env.isolation=unshare" in message and "--config.env.isolation=none" in message
    with pytest.raises(IsolationUnavailable):  # a sandbox never falls back by itself
        Sandbox(workspace, limits=LIMITS)


def test_a_forced_weaker_level_warns_once(no_bwrap, caplog):
    with caplog.at_level(logging.WARNING, logger="env.sandbox"):
        assert resolve_isolation("none") == "none"
        assert resolve_isolation("none") == "none"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["sandbox isolation forced to 'none', weaker than bubblewrap ('auto')"]


def test_cli_says_how_to_fix_it(no_bwrap, workspace, capsys):
    assert cli.main(["run", "--workspace", str(workspace), "--", "true"]) == 2
    assert "apt-get install -y bubblewrap" in capsys.readouterr().err


def _unshare_works() -> None:
    if iso.probe("unshare") is not None:
        pytest.skip(f"unshare does not work here: {iso.probe('unshare')}")
    if not iso.has_mount_point():
        pytest.skip(f"no {SANDBOX_ROOT} on this host for unshare to bind the workspace on (not root)")


def _session(workspace: Path, level: str) -> list[str]:
    """The texts of a few tool calls, as the model sees them, in a fresh sandbox at `level`."""
    calls = [
        *(
            ("run_terminal_cmd", {"command": command, "is_background": False})
            for command in (
                "pwd",
                "cd pkg && ls",
                "python -c 'import os; print(os.getcwd())'",
                # The summary line without its timing.
                "cd .. && python -m pytest -q -p no:cacheprovider tests | sed -E 's/ in [0-9.]+s//'",
                "python -c 'import pkg.calc; pkg.calc.add(1, None)'",  # a traceback names the file's path
                "ls -A /tmp; echo $HOME $TMPDIR",
            )
        ),
        ("run_terminal_cmd", {"command": "sleep 0", "is_background": True}),
        ("grep", {"pattern": "def add", "path": "pkg"}),
        ("glob_file_search", {"glob_pattern": "*.py"}),
    ]
    with Sandbox(workspace, limits=LIMITS, isolation=level) as box:
        ctx = ToolContext(workspace, box)
        results = [execute(ctx, ToolCall(name, arguments)) for name, arguments in calls]
    assert not any(r.is_error for r in results), [r.text for r in results]
    return [re.sub(r"PID: \d+", "PID: (host pid)", r.text) for r in results]


def test_tool_results_are_the_same_under_bwrap_and_unshare(workspace):
    if iso.probe("bwrap") is not None:
        pytest.skip(f"bwrap does not work here: {iso.probe('bwrap')}")
    _unshare_works()
    bwrap, unshare = _session(workspace, "bwrap"), _session(workspace, "unshare")
    assert f"{SANDBOX_ROOT}\n" in bwrap[0] and f"already be {SANDBOX_ROOT}/pkg." in bwrap[1]
    assert "1 failed" in bwrap[3] and f'File "{SANDBOX_ROOT}/pkg/calc.py"' in bwrap[4]
    assert "Output file: /tmp/background-1.log" in bwrap[6]
    for one, other in zip(bwrap, unshare):
        assert one == other
    # Without namespaces commands see host paths, but the host-side tools still name /workspace paths.
    none = _session(workspace, "none")
    assert none[-2:] == bwrap[-2:] and f"search in '{SANDBOX_ROOT}'" in none[-1]


def test_unshare_hides_the_hosts_tmp(workspace):
    _unshare_works()
    marker = Path(tempfile.gettempdir()) / f"composer-host-marker-{os.getpid()}"
    marker.write_text("host\n")
    try:
        with (
            Sandbox(workspace, limits=LIMITS, isolation="unshare") as box,
            Sandbox(workspace, limits=LIMITS, isolation="unshare") as other,
        ):
            assert box.root == SANDBOX_ROOT and box.tmp == "/tmp"
            result = box.run(f"ls /tmp; echo made > /tmp/{marker.name}; cat /tmp/{marker.name}; ls /dev/shm")
            assert result.output == "made\n"
            assert box.host_path(f"/tmp/{marker.name}").read_text() == "made\n"
            # Another slot's /tmp is out of sight too (its host path is under the hidden state directory).
            theirs = other.host_path(f"/tmp/{marker.name}")
            assert other.run(f"echo theirs > /tmp/{marker.name}").exit_code == 0 and theirs.exists()
            assert box.run(f"cat {theirs}").exit_code != 0
            assert box.run(f"ls -A {state_root()} 2>/dev/null").output == ""
        assert marker.read_text() == "host\n"
    finally:
        marker.unlink()


@pytest.mark.skipif(not is_root(), reason="as another user, the sandbox runs as the caller, who can enter")
def test_a_workspace_the_slot_uid_cannot_enter_says_what_to_change(tmp_path):
    private = Path(tempfile.mkdtemp(dir="/tmp"))  # mode 0700, as mkdtemp makes it
    try:
        with pytest.raises(ValueError) as error:
            Sandbox(private, limits=LIMITS)
        assert f"chmod o+x {private}`" in str(error.value) and "put it under /tmp" not in str(error.value)
        inner = private / "ws"
        inner.mkdir(mode=0o755)
        os.chmod(private, 0o711)
        os.chmod(inner, 0o700)
        with pytest.raises(ValueError, match=f"{inner} has mode 0700"):
            Sandbox(inner, limits=LIMITS)
        os.chmod(inner, 0o755)
        with Sandbox(inner, limits=LIMITS) as box:  # o+x on the way is enough
            assert box.run("pwd").output == f"{box.root}\n"
    finally:
        os.chmod(private, 0o700)
        for p in sorted(private.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        private.rmdir()
