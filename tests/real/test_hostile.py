"""Hostile code as the model's edit to a real task (toolz): the gold fix, plus a payload that the module under
test runs when the tests import it, graded through env.reward.grade in the task's environment. The grade
must come back with reward 0 and the host must be unharmed.

Like tests/env/sandbox/test_sandbox_hostile.py, these run only under full isolation (bubblewrap, its own pid
and net namespaces, a non-root uid inside, bwrap as pid 1), checked first with harmless commands in a
sandbox of the same kind; otherwise they are skipped with the reason. kill(-1) run without that isolation,
as root, would end every process on the machine.
"""

import dataclasses
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from payloads import PeakSampler, live_pids, namespace_problem

from env.reward import grade
from env.sandbox import Limits, Sandbox, detect_isolation, make_workspace, remove_workspace
from env.tasks import environments
from env.tasks.task import Task

pytestmark = pytest.mark.hostile

CANARY = f"composer-canary-{uuid.uuid4().hex}"
# The payload ends by raising this, so the test output shows what it did (and the tests error: reward 0).
REPORT = "HOSTILE-REPORT"


@pytest.fixture(scope="module")
def task(real_tasks) -> Task:
    return real_tasks["toolz"][0]


def _isolation_problem(task: Task, tmp_path: Path) -> str | None:
    """Why a sandbox with the task's environment is not fully isolated (None when it is)."""
    level = detect_isolation()
    if level != "bwrap":
        return f"hostile tests need bwrap isolation; this machine has {level!r}"
    repo = tmp_path / "probe"
    repo.mkdir()
    ws = make_workspace(repo)
    try:
        with Sandbox(ws, isolation="bwrap", python_env=environments.python_env(task)) as sb:
            probe = sb.run(
                "id -u; readlink /proc/self/ns/pid; readlink /proc/self/ns/net; "
                "cat /proc/1/cmdline | tr '\\0' ' '",
                timeout=10,
            )
    finally:
        remove_workspace(ws)
    fields = probe.output.split("\n")
    if probe.exit_code != 0 or len(fields) < 4:
        return f"isolation probe failed: {probe.output!r}"
    uid, pid_ns, net_ns, init = fields[:4]
    problem = namespace_problem(uid, pid_ns, net_ns)
    if problem:
        return problem
    if os.path.basename(init.split(" ")[0]) != "bwrap":
        return f"pid 1 inside is {init!r}, not bwrap"
    return None


@pytest.fixture
def isolated(task, tmp_path):
    problem = _isolation_problem(task, tmp_path)
    if problem:
        pytest.skip(f"not fully isolated: {problem}")


def _hostile(task: Task, workspace_of, payload: str) -> Path:
    """A workspace with the gold fix and `payload` run when the module under test is imported."""
    ws = workspace_of(task, fixed=True)
    source = ws / task.metadata["file"]
    source.write_text(source.read_text() + "\n\n" + payload)
    return ws


def _processes_with(marker: str) -> list[int]:
    """Host pids of live processes whose command line holds `marker`."""

    def holds(pid: str) -> bool:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()

    return live_pids(holds)


def test_fork_bomb(task, isolated, workspace_of):
    bomb = f"bomb_{uuid.uuid4().hex[:12]}"  # in every forked shell's command line
    ws = _hostile(
        task, workspace_of,
        # bash, which retries a fork the process limit refused: the bomb's processes stay for the sampler to
        # see (sh gives up, and the bomb can collapse between two samples).
        "import subprocess\n"
        f'subprocess.run(["bash", "-c", "{bomb}() {{ {bomb} | {bomb} & }}; {bomb}; sleep 30"])\n',
    )  # fmt: skip
    # Long enough for pytest to start and import the module on a loaded machine; the bomb then runs until
    # the timeout.
    quick = dataclasses.replace(task, timeout_s=8.0)
    start = time.monotonic()
    with PeakSampler(lambda: len(_processes_with(bomb))) as sampler:
        result = grade(quick, ws, isolation="bwrap")
    elapsed = time.monotonic() - start
    assert result.reward == 0.0 and result.components["timed_out"] == 1.0
    assert elapsed < quick.timeout_s + 15, elapsed
    assert sampler.peak > 2, "the bomb never ran"
    assert sampler.peak <= Limits().nproc, sampler.peak
    assert not _processes_with(bomb), "the bomb outlived the grade"
    assert subprocess.run(["echo", "alive"], capture_output=True, text=True).stdout == "alive\n"


def test_writes_outside_the_workspace_leave_the_host_unchanged(task, isolated, workspace_of):
    name = f"composer-hostile-{uuid.uuid4().hex}"
    venv = environments.python_env(task)
    probe = workspace_of(task, fixed=False)  # a host directory beside the graded workspace
    targets = [
        f"/etc/{name}", f"/usr/{name}", f"/root/{name}", f"/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}",
        f"/run/{name}", f"{os.path.realpath(os.__file__)}.{name}", f"{venv}/{name}", f"{venv}/bin/{name}",
        f"{task.repo}/{name}", f"{task.path}/{name}", f"{probe}/{name}", f"{probe.parent}/{name}",
    ]  # fmt: skip
    payload = (
        f"import os\nwrote = []\nfor target in {targets + [f'/tmp/{name}']!r}:\n"
        "    try:\n        with open(target, 'w') as f:\n            f.write('x')\n"
        "        wrote.append(target)\n    except OSError:\n        pass\n"
        "try:\n    os.chmod('/', 0o777)\nexcept OSError:\n    pass\n"
        f"raise RuntimeError('{REPORT} wrote=' + repr(wrote))\n"
    )
    ws = _hostile(task, workspace_of, payload)
    before = sorted(p.name for p in ws.iterdir())
    result = grade(task, ws, isolation="bwrap")
    assert result.reward == 0.0
    wrote = re.search(rf"{REPORT} wrote=(\[.*?\])", result.output)
    assert wrote, result.output[-3000:]
    # The sandbox's own /tmp is writable, and it is not the host's.
    assert f"/tmp/{name}" in wrote.group(1) and not os.path.exists(f"/tmp/{name}")
    for target in targets:
        assert not os.path.exists(target), f"{target} appeared on the host"
    assert oct(os.stat("/").st_mode & 0o777) != "0o777"
    assert sorted(p.name for p in ws.iterdir()) == before  # grading worked on a copy


def test_reading_secrets_finds_nothing(task, isolated, workspace_of, monkeypatch):
    # A host process holding the secret in its environment, and the secret in this process's environment.
    holder = subprocess.Popen(["sleep", "30"], env={**os.environ, "COMPOSER_SECRET": CANARY})
    monkeypatch.setenv("COMPOSER_SECRET", CANARY)
    payload = (
        "import glob, os, re\ntexts = [repr(dict(os.environ))]\n"
        f"paths = ['/etc/shadow', '/proc/1/environ', '/proc/{holder.pid}/environ',"
        f" '/proc/{os.getpid()}/environ', '/root/.bash_history', *glob.glob('/proc/*/environ')]\n"
        "for path in paths:\n    try:\n        texts.append(open(path, 'rb').read().decode('latin-1'))\n"
        "    except OSError:\n        pass\n"
        "try:\n    texts.append(' '.join(os.listdir('/root')))\nexcept OSError:\n    pass\n"
        "found = sorted(set(re.findall('composer-canary-[0-9a-f]+', '\\n'.join(texts))))\n"
        f'raise RuntimeError(f\'{REPORT} read={{len(texts)}} shadow={{os.path.exists("/etc/shadow")}} '
        "found={found}')\n"
    )
    try:
        ws = _hostile(task, workspace_of, payload)
        result = grade(task, ws, isolation="bwrap")
    finally:
        holder.kill()
        holder.wait()
    assert result.reward == 0.0
    assert re.search(rf"{REPORT} read=\d+ shadow=False found=\[\]", result.output), result.output[-3000:]
    assert CANARY not in result.output
    if os.path.exists("/etc/shadow"):
        assert Path("/etc/shadow").read_text().splitlines()[0] not in result.output


def test_kill_all_processes(task, isolated, workspace_of):
    # `isolated` proved a non-root uid, a pid namespace of its own and bwrap as pid 1 inside.
    host_sentinel = subprocess.Popen(["sleep", "30"])
    try:
        # kill(-1) from Python spares its caller: a child of the test process shows that it acted.
        payload = (
            "import os, signal, subprocess\nchild = subprocess.Popen(['sleep', '30'])\n"
            "os.kill(-1, signal.SIGKILL)\n"
            f"raise RuntimeError(f'{REPORT} child={{child.wait()}}')\n"
        )
        result = grade(task, _hostile(task, workspace_of, payload), isolation="bwrap")
        assert result.reward == 0.0
        assert f"{REPORT} child=-9" in result.output, result.output[-3000:]
        assert host_sentinel.poll() is None, "a host process was killed"
        # A shell's `kill -9 -1` takes the test process with it: no outcome at all.
        payload = "import os\nos.system('kill -9 -1')\n"
        result = grade(task, _hostile(task, workspace_of, payload), isolation="bwrap")
        assert result.reward == 0.0 and set(result.tests.values()) == {"missing"}
        assert host_sentinel.poll() is None, "a host process was killed"
        assert grade(task, workspace_of(task, fixed=True), isolation="bwrap").reward == 1.0  # still grading
    finally:
        host_sentinel.kill()
        host_sentinel.wait()
