"""Ordinary behaviour of the sandbox: commands, the persistent shell directory, timeouts, output caps,
Python inside, the environment, workspace ownership, slots, fallbacks and the CLI."""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from env.sandbox import (
    SANDBOX_ROOT,
    CommandResult,
    Limits,
    Sandbox,
    detect_isolation,
    make_workspace,
    remove_workspace,
)
from env.sandbox import isolation as iso
from env.sandbox.slots import is_root, uid_processes
from env.sandbox.workspace import workspace_cap_bytes

REPO_ROOT = Path(__file__).resolve().parents[3]
LIMITS = Limits(timeout_s=20.0)
# The strongest level this machine has: these tests check ordinary behaviour at it, where a sandbox on its
# own ('auto') would refuse anything weaker than bwrap.
LEVEL = detect_isolation()


@pytest.fixture
def repo(tmp_path):
    """A tiny repository with a module and a passing test."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    return root


@pytest.fixture
def workspace(repo):
    ws = make_workspace(repo)
    yield ws
    remove_workspace(ws)


@pytest.fixture
def sandbox(workspace):
    with Sandbox(workspace, limits=LIMITS, isolation=LEVEL) as sb:
        yield sb


def test_isolation_is_detected_and_reported(sandbox):
    assert detect_isolation() in ("bwrap", "unshare", "none")
    assert sandbox.isolation == LEVEL
    result = sandbox.run("true")
    assert isinstance(result, CommandResult)
    assert result.isolation == sandbox.isolation


def test_exit_codes_and_interleaved_output(sandbox):
    assert sandbox.run("exit 3").exit_code == 3
    assert sandbox.run(["false"]).exit_code == 1
    result = sandbox.run("echo one; echo two >&2; echo three")
    assert result.exit_code == 0
    assert result.output == "one\ntwo\nthree\n"
    assert not result.timed_out and not result.truncated
    assert sandbox.run(["python", "-c", "print(6 * 7)"]).output == "42\n"
    assert sandbox.run("kill -9 $$").exit_code == 128 + 9


def test_parallel_commands_in_one_sandbox(sandbox):
    results = [None] * 4

    def work(i):
        results[i] = sandbox.run(f"sleep 0.5; echo job-{i}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.output for r in results] == [f"job-{i}\n" for i in range(4)]
    assert time.monotonic() - start < 1.8  # they overlapped: one after another takes over 2 s


def test_workspace_appears_at_root(sandbox):
    assert sandbox.root == (str(sandbox.workspace) if sandbox.isolation == "none" else SANDBOX_ROOT)
    result = sandbox.run("pwd; ls pkg")
    assert result.output.splitlines() == [sandbox.root, "__init__.py", "calc.py"]
    assert result.cwd == sandbox.root


def test_shell_working_directory_persists(sandbox):
    sandbox.run("mkdir -p sub/deeper")
    first = sandbox.shell("cd sub")
    assert first.exit_code == 0
    assert first.cwd == f"{sandbox.root}/sub"
    assert sandbox.shell("pwd").output == f"{sandbox.root}/sub\n"
    # An exit or a failing command still reports where the shell ended up.
    assert sandbox.shell("cd deeper; exit 4").exit_code == 4
    assert sandbox.cwd == f"{sandbox.root}/sub/deeper"
    assert sandbox.shell("cd /nonexistent").exit_code != 0
    assert sandbox.shell("pwd").output.strip() == f"{sandbox.root}/sub/deeper"
    # One-shot run() neither uses nor moves the shell's directory.
    assert sandbox.run("pwd").output.strip() == sandbox.root
    assert sandbox.run("pwd", cwd=f"{sandbox.root}/sub").output.strip() == f"{sandbox.root}/sub"
    assert sandbox.shell("cd ../..; pwd").output.strip() == sandbox.root


def test_timeout_ends_the_command_quickly(sandbox):
    start = time.monotonic()
    result = sandbox.run("echo started; sleep 30", timeout=1.0)
    elapsed = time.monotonic() - start
    assert result.timed_out and result.exit_code is None
    assert result.output == "started\n"
    assert elapsed < 2.0
    shell = sandbox.shell("sleep 30", timeout=0.5)
    assert shell.timed_out and shell.cwd == sandbox.cwd


def test_output_is_capped_at_the_head(workspace):
    with Sandbox(workspace, limits=dataclasses.replace(LIMITS, max_output_bytes=1000), isolation=LEVEL) as sb:
        result = sb.run("seq 1 100000")
        assert result.truncated and result.exit_code == 0
        assert len(result.output) == 1000
        assert result.output.startswith("1\n2\n3\n")
        small = sb.run("echo fits")
        assert small.output == "fits\n" and not small.truncated


def test_python_and_pytest_run_inside(sandbox):
    result = sandbox.run("python -m pytest -q -p no:cacheprovider")
    assert result.exit_code == 0, result.output
    assert "1 passed" in result.output
    (sandbox.workspace / "tests" / "test_calc.py").write_text(
        "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 6\n"
    )
    failing = sandbox.run("python -m pytest -q -p no:cacheprovider")
    assert failing.exit_code == 1 and "1 failed" in failing.output
    assert sandbox.run("ruff --version && rg --version").exit_code == 0


def test_environment_is_minimal(sandbox, monkeypatch):
    monkeypatch.setenv("COMPOSER_SANDBOX_CANARY", "canary-7f3a9c")
    result = sandbox.run("env")
    names = {line.split("=", 1)[0] for line in result.output.splitlines()}
    allowed = {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "TERM",
        "USER",
        "LOGNAME",
        "PYTHONDONTWRITEBYTECODE",
        "PAGER",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD",  # the host's pytest plugins are not the task's
    }
    allowed |= {"GIT_PAGER", "PWD", "SHLVL", "_", "OLDPWD"}
    assert names <= allowed, names - allowed
    assert "canary-7f3a9c" not in result.output
    assert sandbox.run("cat /proc/1/environ").output.count("canary-7f3a9c") == 0
    extra = sandbox.run("echo $EXTRA", env={"EXTRA": "given"})
    assert extra.output == "given\n"


def test_workspace_is_writable_from_both_sides(sandbox):
    ws = sandbox.workspace
    # Written inside, edited by the host.
    assert sandbox.run("echo inside > made_inside.txt && mkdir -p newdir").exit_code == 0
    assert (ws / "made_inside.txt").read_text() == "inside\n"
    (ws / "made_inside.txt").write_text("host edit\n")
    # Written by the host (existing, new file, new directory), then appended to inside.
    (ws / "pkg" / "calc.py").write_text("X = 1\n")
    (ws / "host_new.txt").write_text("a\n")
    (ws / "host_dir").mkdir()
    (ws / "host_dir" / "f.txt").write_text("b\n")
    script = (
        "echo more >> pkg/calc.py && echo c >> host_new.txt && echo d >> host_dir/f.txt && touch host_dir/g"
    )
    result = sandbox.run(script)
    assert result.exit_code == 0, result.output
    assert (ws / "host_new.txt").read_text() == "a\nc\n"
    assert (ws / "host_dir" / "f.txt").read_text() == "b\nd\n"
    # A file created with a narrow mode becomes writable after adopt().
    fd = os.open(ws / "narrow.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    sandbox.adopt(ws / "narrow.txt")
    assert sandbox.run("echo e >> narrow.txt").exit_code == 0


def test_make_workspace_is_a_private_capped_copy(repo):
    ws = make_workspace(repo)
    try:
        assert ws != repo and (ws / "pkg" / "calc.py").read_text() == (repo / "pkg" / "calc.py").read_text()
        with Sandbox(ws, limits=LIMITS, isolation=LEVEL) as sb:
            assert sb.run("echo '# edited' >> pkg/calc.py").exit_code == 0
        assert "edited" in (ws / "pkg" / "calc.py").read_text()
        assert "edited" not in (repo / "pkg" / "calc.py").read_text()
        if is_root():
            assert workspace_cap_bytes(ws) == Limits().workspace_mb << 20
    finally:
        remove_workspace(ws)
    assert not ws.exists()


def test_limits_bind_the_command(workspace):
    limits = dataclasses.replace(LIMITS, open_files=100, nproc=50, file_size_mb=1)
    with Sandbox(workspace, limits=limits, isolation=LEVEL) as sb:
        result = sb.run("ulimit -n; ulimit -u; ulimit -f; ulimit -c")
        assert result.output.split() == ["100", "50", "1024", "0"]  # bash counts -f in KiB
        big = sb.run("head -c 2000000 /dev/zero > big.bin")
        assert big.exit_code != 0
        assert (sb.workspace / "big.bin").stat().st_size <= 1 << 20


@pytest.mark.skipif(not is_root(), reason="slot uids, cgroups and mounts need root")
def test_slots_are_exclusive_and_cleaned_up(repo):
    ws_a, ws_b = make_workspace(repo), make_workspace(repo)
    try:
        with (
            Sandbox(ws_a, limits=LIMITS, isolation=LEVEL) as a,
            Sandbox(ws_b, limits=LIMITS, isolation=LEVEL) as b,
        ):
            assert a.slot != b.slot and a.uid != b.uid and a.uid != 0
            with pytest.raises(RuntimeError):
                Sandbox(ws_a, slot=a.slot, isolation=LEVEL)
            assert a.run("id -u").output.strip() == str(a.uid)
            shell_id, pid, out_path = a.start_background("echo bg-started; sleep 60")
            log = a.host_path(out_path)
            deadline = time.monotonic() + 5
            while "bg-started" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "bg-started" in log.read_text()
            assert a.run(f"cat {out_path}").output == "bg-started\n"
            cgroups = a._res.cgroups
            if cgroups.dirs:
                assert cgroups.pids(), "the background command is in the slot's cgroups"
                limit = cgroups.dirs[0] / "memory.limit_in_bytes"
                if limit.exists():
                    assert int(limit.read_text()) == LIMITS.memory_mb << 20
            assert uid_processes(a.uid)
            uid, dirs = a.uid, list(cgroups.dirs)
        assert not uid_processes(uid)
        assert not any(d.exists() for d in dirs)
        assert not os.path.exists(f"/proc/{pid}")
    finally:
        remove_workspace(ws_a)
        remove_workspace(ws_b)


@pytest.mark.skipif(not is_root(), reason="needs a slot uid to look for leftovers")
def test_commands_end_when_the_owning_process_dies(workspace):
    script = (
        "import os, signal, sys, time\n"
        "from env.sandbox import Sandbox\n"
        f"sb = Sandbox({str(workspace)!r}, isolation={LEVEL!r})\n"
        "sb.start_background('setsid sleep 100 & sleep 100')\n"
        "print(sb.uid, flush=True)\n"
        "time.sleep(0.5)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=30
    )
    uid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 3
    while uid_processes(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not uid_processes(uid)


@pytest.mark.parametrize("level", ["unshare", "none"])
def test_fallback_levels_run_commands(workspace, level):
    if level == "unshare" and iso.probe("unshare") is not None:
        pytest.skip(f"unshare cannot create namespaces here: {iso.probe('unshare')}")
    with Sandbox(workspace, limits=LIMITS, isolation=level) as sb:
        # unshare binds the workspace at SANDBOX_ROOT in its mount namespace, as bwrap does; 'none' cannot.
        mounted = level == "unshare" and iso.has_mount_point()
        assert sb.root == (SANDBOX_ROOT if mounted else str(sb.workspace))
        result = sb.run("echo hi; pwd")
        assert result.isolation == level
        assert result.output == f"hi\n{sb.root}\n"
        sb.run("mkdir -p sub")
        sb.shell("cd sub")
        assert sb.shell("pwd").output.strip() == f"{sb.root}/sub"
        start = time.monotonic()
        assert sb.run("sleep 30", timeout=0.5).timed_out
        assert time.monotonic() - start < 1.5
        # The tasks' tests run with `python -m pytest`: the interpreter must start as the slot uid even
        # where it is installed under a directory only root may enter.
        python = sb.run("python -c 'import pytest, sys; print(sys.version_info[0])'")
        assert (python.exit_code, python.output) == (0, "3\n")
        if level == "unshare":
            assert sb.run("tail -n +3 /proc/net/dev | wc -l").output.strip() == "1"  # loopback only
        if is_root():
            assert sb.run("id -u").output.strip() == str(sb.uid)
            assert sb.run("cat /etc/shadow").exit_code != 0


def test_workspace_size_is_checked_without_a_capped_mount():
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)  # the slot uid must reach it
        with Sandbox(Path(d), limits=dataclasses.replace(LIMITS, workspace_mb=1), isolation=LEVEL) as sb:
            ok = sb.run("head -c 1000 /dev/zero > small")
            assert "over its cap" not in ok.output
            over = sb.run("head -c 2000000 /dev/zero > big")
            assert "MB, over its cap of 1 MB" in over.output


def test_cli_prints_one_json_object(workspace):
    cmd = [
        sys.executable,
        "-m",
        "env.sandbox",
        "run",
        "--workspace",
        str(workspace),
        "--isolation",
        LEVEL,
        "--timeout",
        "10",
        "--",
    ]
    done = subprocess.run(
        [*cmd, "echo hi; exit 2"], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    result = json.loads(done.stdout)
    assert result["exit_code"] == 2 and result["output"] == "hi\n" and result["timed_out"] is False
    assert result["isolation"] == LEVEL
    argv = subprocess.run(
        [*cmd, "python", "-c", "print('a b')"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert json.loads(argv.stdout)["output"] == "a b\n"
    slow = subprocess.run(
        [*cmd[:-2], "1", "--", "sleep 20"], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert json.loads(slow.stdout)["timed_out"] is True
