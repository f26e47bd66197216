"""Hostile code through the sandbox: each snippet must be contained, leave the host unchanged, leave nothing
running, and return within its timeout plus one second.

These run only under full isolation (bubblewrap with its own pid and net namespaces and a non-root uid
inside), checked by running harmless commands first; otherwise every test is skipped with the reason. A
snippet such as kill(-1) run without that isolation, as root, would end every process on the machine.
"""

import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from payloads import HOST_PID_NS, PeakSampler, live_pids, namespace_problem

from env.sandbox import Limits, Sandbox, detect_isolation, make_workspace, remove_workspace
from env.sandbox.slots import is_root, uid_processes
from env.sandbox.workspace import workspace_cap_bytes

pytestmark = pytest.mark.hostile

LIMITS = Limits(
    timeout_s=3.0,
    address_space_mb=1024,
    cpu_s=10,
    nproc=64,
    memory_mb=256,
    pids=64,
    workspace_mb=16,
    tmp_mb=8,
)
CANARY = f"composer-canary-{uuid.uuid4().hex}"


def _isolation_problem(sandbox: Sandbox) -> str | None:
    """Why the sandbox is not fully isolated (None when it is), judged from inside with harmless commands."""
    if sandbox.isolation != "bwrap":
        return f"sandbox isolation is {sandbox.isolation!r}, not bwrap"
    probe = sandbox.run("id -u; readlink /proc/self/ns/pid; readlink /proc/self/ns/net", timeout=10)
    fields = probe.output.split()
    if probe.exit_code != 0 or len(fields) != 3:
        return f"isolation probe failed: {probe.output!r}"
    uid, pid_ns, net_ns = fields
    return namespace_problem(uid, pid_ns, net_ns)


@pytest.fixture
def workspace(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("a workspace\n")
    ws = make_workspace(repo, size_mb=LIMITS.workspace_mb)
    yield ws
    remove_workspace(ws)


@pytest.fixture
def sandbox(workspace, monkeypatch):
    if detect_isolation() != "bwrap":
        pytest.skip(f"hostile tests need bwrap isolation; this machine has {detect_isolation()!r}")
    monkeypatch.setenv("COMPOSER_SECRET", CANARY)  # must never be visible inside
    sb = Sandbox(workspace, limits=LIMITS)
    try:
        problem = _isolation_problem(sb)
        if problem:
            pytest.skip(f"not fully isolated: {problem}")
        yield sb
        uid = sb.uid
    finally:
        sb.close()
    if is_root():
        assert not uid_processes(uid), "processes of the slot uid survived close()"


def _namespace_processes(pid_ns: str) -> list[int]:
    """Host pids of live processes still in the pid namespace `pid_ns`."""
    return live_pids(lambda pid: os.readlink(f"/proc/{pid}/ns/pid") == pid_ns)


def _tree(pid: int) -> set[int]:
    """`pid` and its descendants."""
    found, stack = set(), [pid]
    while stack:
        p = stack.pop()
        found.add(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return found


def run_hostile(
    sandbox: Sandbox, snippet: str, timeout: float = LIMITS.timeout_s, others: frozenset = frozenset()
):
    """Run a snippet after a line that reports its pid namespace; check the timing and that nothing of that
    namespace survives the call. `others`: host pids of the sandbox's other commands, which may remain.
    Returns (result, output without the first line)."""
    start = time.monotonic()
    result = sandbox.run(f"readlink /proc/self/ns/pid\n{snippet}", timeout=timeout)
    elapsed = time.monotonic() - start
    assert elapsed <= timeout + 1.0, f"took {elapsed:.2f} s for a {timeout} s timeout"
    pid_ns, _, rest = result.output.partition("\n")
    assert pid_ns.startswith("pid:[") and pid_ns != HOST_PID_NS, result.output[:200]
    assert not _namespace_processes(pid_ns), "processes of the command's pid namespace survived"
    if is_root():
        assert not set(uid_processes(sandbox.uid)) - others, "processes of the slot uid survived the command"
    return result, rest


def test_fork_bomb(sandbox):
    with PeakSampler(lambda: len(uid_processes(sandbox.uid))) as sampler:
        run_hostile(sandbox, "bomb() { bomb | bomb & }; bomb; sleep 30", timeout=2.0)
    if is_root():
        assert sampler.peak <= LIMITS.nproc + 2, sampler.peak  # + the launcher and bwrap's own processes
    assert sandbox.run("echo alive").output == "alive\n"


def test_memory_bomb_single_process(sandbox):
    snippet = "python -c 'chunks = []\nwhile True: chunks.append(b\"x\" * (32 << 20))'"
    result, output = run_hostile(sandbox, snippet)
    assert not result.timed_out and result.exit_code != 0
    assert "MemoryError" in output or result.exit_code == 128 + signal.SIGKILL


def _oom_kills(memory_dir: Path) -> int:
    fields = dict(line.split() for line in (memory_dir / "memory.oom_control").read_text().splitlines())
    return int(fields.get("oom_kill", 0))


def test_memory_bomb_many_processes(sandbox):
    cgroups = sandbox._res.cgroups
    memory = [d for d in (cgroups.dirs if cgroups else []) if (d / "memory.oom_control").exists()]
    if not memory:
        pytest.skip("no v1 memory cgroup: the slot-wide memory limit cannot be observed")
    kills_before = _oom_kills(memory[0])
    # Each process stays under RLIMIT_AS; only the slot's memory cgroup can stop all of them together.
    # Two of them together pass the limit. They hold their memory for a few seconds, so that on a loaded
    # machine (slow interpreter starts) some still overlap, then end; bash reaps them all and reports the
    # killed ones (a timeout would kill bash before it could).
    hog = "import time; data = b'x' * (150 << 20); print('allocated', flush=True); time.sleep(8)"
    result, output = run_hostile(
        sandbox, f'for i in 1 2 3 4; do python -c "{hog}" & done; wait', timeout=60.0
    )
    assert not result.timed_out, output
    # A killed hog frees its memory, so a later one may still allocate; what matters is that the
    # kernel killed some of them and the slot's peak never passed the limit.
    assert any(line.startswith("bash:") and "Killed" in line for line in output.splitlines()), output
    assert _oom_kills(memory[0]) > kills_before, "the cgroup's limit never acted"
    assert int((memory[0] / "memory.max_usage_in_bytes").read_text()) <= LIMITS.memory_mb << 20


def test_cpu_loop(sandbox):
    result, _ = run_hostile(sandbox, "while :; do :; done", timeout=1.0)
    assert result.timed_out and result.exit_code is None


def test_sleep_forever(sandbox):
    result, _ = run_hostile(sandbox, "sleep infinity", timeout=1.0)
    assert result.timed_out


@pytest.mark.parametrize("then", ["exit 0", "sleep 30"])
def test_daemonised_child_is_ended(sandbox, then):
    loop = "while :; do date >> /workspace/daemon.log; sleep 0.05; done"
    daemon = f"setsid sh -c '{loop}' </dev/null >/dev/null 2>&1 &"
    python_daemon = (
        "python -c 'import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(1000)\n' </dev/null >/dev/null 2>&1"
    )
    result, _ = run_hostile(sandbox, f"{daemon}\n{python_daemon}\nsleep 0.3\n{then}", timeout=2.0)
    assert result.timed_out == (then != "exit 0")
    log = sandbox.workspace / "daemon.log"
    assert log.exists(), "the daemon never ran"
    size = log.stat().st_size
    time.sleep(0.3)
    assert log.stat().st_size == size, "the daemon kept writing after the call returned"


def test_writes_outside_the_workspace_leave_the_host_unchanged(sandbox):
    name = f"composer-hostile-{uuid.uuid4().hex}"
    targets = [
        f"/etc/{name}", f"/usr/{name}", f"/root/{name}", f"/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}",
        f"/run/{name}", f"{os.path.realpath(os.__file__)}.{name}", f"{sandbox.workspace.parent}/{name}",
    ]  # fmt: skip
    writes = "\n".join(f"echo x > {t} 2>/dev/null && echo WROTE {t}" for t in targets)
    host_tmp = Path("/tmp") / name
    result, output = run_hostile(
        sandbox, f"{writes}\necho x > /tmp/{name} && echo WROTE-TMP\nchmod 777 / 2>&1"
    )
    for target in targets:
        assert not os.path.exists(target), f"{target} appeared on the host"
        assert f"WROTE {target}" not in output or target.startswith(("/dev/shm", "/var/tmp"))
    # The sandbox's own /tmp is writable (and capped), and it is not the host's /tmp.
    assert "WROTE-TMP" in output and not host_tmp.exists()
    assert oct(os.stat("/").st_mode & 0o777) != "0o777"


def test_reading_secrets_finds_nothing(sandbox):
    assert os.environ["COMPOSER_SECRET"] == CANARY
    snippet = (
        "cat /etc/shadow; cat /proc/1/environ; cat /proc/*/environ; "
        f"cat /proc/{os.getpid()}/environ; ls /root; cat /root/.bash_history; env"
    )
    result, output = run_hostile(sandbox, snippet + " 2>&1")
    assert CANARY not in output
    if is_root() and os.path.exists("/etc/shadow"):
        root_entry = Path("/etc/shadow").read_text().splitlines()[0]
        assert root_entry not in output
    assert "No such file" in output  # /etc/shadow is not there at all


def test_cannot_reach_a_listener_on_host_loopback(sandbox):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []

    def accept_loop(stop: threading.Event):
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept())

    stop = threading.Event()
    thread = threading.Thread(target=accept_loop, args=(stop,), daemon=True)
    thread.start()
    try:
        # Control: the listener is reachable from the host, so the sandbox's failure below means something.
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        deadline = time.monotonic() + 2
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(accepted) == 1
        accepted.clear()
        snippet = (
            "python -c 'import socket, sys\n"
            'for host in ("127.0.0.1", "localhost", "1.1.1.1"):\n'
            "    try:\n"
            f'        socket.create_connection((host, {port}), timeout=1); print("CONNECTED", host)\n'
            "    except OSError as e:\n"
            '        print("BLOCKED", host, e)\n\''
        )
        result, output = run_hostile(sandbox, snippet)
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert "CONNECTED" not in output
    assert output.count("BLOCKED") == 3
    assert accepted == []
    assert not result.timed_out


def test_huge_output_is_capped_in_bounded_memory(sandbox):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result, output = run_hostile(sandbox, "head -c 100000000 /dev/zero | tr '\\0' a", timeout=10.0)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert result.truncated and result.exit_code == 0
    assert len(result.output) == LIMITS.max_output_bytes
    assert (after - before) < 50 * 1024, f"peak memory grew by {(after - before) // 1024} MB"


def test_filling_the_disk_stops_at_the_cap(sandbox):
    if workspace_cap_bytes(sandbox.workspace) is None:
        pytest.skip("the workspace is not a size-capped mount (needs root)")
    free_before = shutil.disk_usage("/").free
    snippet = (
        "for i in 1 2 3 4 5 6; do head -c 50000000 /dev/zero > /workspace/fill$i || echo FULL-WS; done; "
        "head -c 50000000 /dev/zero > /tmp/fill || echo FULL-TMP; "
        "head -c 50000000 /dev/zero > /dev/shm/fill || echo FULL-SHM; df -k /workspace /tmp"
    )
    result, output = run_hostile(sandbox, snippet, timeout=5.0)
    assert not result.timed_out
    assert "FULL-WS" in output and "FULL-TMP" in output and "FULL-SHM" in output
    ws_bytes = sum(p.stat().st_size for p in sandbox.workspace.glob("fill*"))
    assert ws_bytes <= LIMITS.workspace_mb << 20
    assert (sandbox.host_path("/tmp/fill")).stat().st_size <= LIMITS.tmp_mb << 20
    assert free_before - shutil.disk_usage("/").free < 100 << 20  # 300 MB were attempted


def test_kill_all_processes(sandbox):
    # Never run kill(-1) without proof of isolation: root outside a pid namespace would end every process.
    proof = sandbox.run("id -u; readlink /proc/self/ns/pid; cat /proc/1/cmdline | tr '\\0' ' '", timeout=5)
    uid, pid_ns, init = proof.output.split("\n", 2)
    assert uid.strip() != "0", "refusing kill(-1): the sandbox runs as root"
    assert pid_ns != HOST_PID_NS, "refusing kill(-1): the sandbox shares the host's pid namespace"
    assert os.path.basename(init.split(" ")[0]) == "bwrap", f"refusing kill(-1): pid 1 inside is {init!r}"
    host_sentinel = subprocess.Popen(["sleep", "30"])
    _, bg_pid, _ = sandbox.start_background("sleep 30")
    time.sleep(0.3)
    try:
        snippet = "python -c 'import os, signal; os.kill(-1, signal.SIGKILL)'; kill -9 -1; sleep 5"
        result, _ = run_hostile(sandbox, snippet, timeout=3.0, others=frozenset(_tree(bg_pid)))
        assert result.exit_code is not None  # the command's own shell died: it did not time out
        assert host_sentinel.poll() is None, "a host process was killed"
        assert os.path.exists(f"/proc/{bg_pid}"), "another command's tree was killed"
        assert sandbox.run("echo still-working").output == "still-working\n"
    finally:
        host_sentinel.kill()
        host_sentinel.wait()
