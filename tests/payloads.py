"""Hostile payloads and probes shared by the grading and sandbox tests (importable: tests/conftest.py puts
this directory on sys.path)."""

import os
import threading
from collections.abc import Callable

HOST_PID_NS = os.readlink("/proc/self/ns/pid")
HOST_NET_NS = os.readlink("/proc/self/ns/net")

# A conftest.py that reports every test as passed: what grading must undo wherever pytest would load it.
PASS_EVERYTHING_CONFTEST = """
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


class PeakSampler:
    """Samples `count()` in a thread every 50 ms while the block runs; `peak` is the largest value seen
    (e.g. the processes of a sandbox's uid during a fork bomb)."""

    def __init__(self, count: Callable[[], int]):
        self.count, self.peak, self._stop = count, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.count())
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def live_pids(keep: Callable[[str], bool]) -> list[int]:
    """Host pids of live (not zombie) processes for which `keep(pid)` holds (pid as /proc names it); a
    process that ends while it is looked at, or that `keep` cannot read, is left out."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if not keep(entry.name):
                continue
            with open(f"/proc/{entry.name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def namespace_problem(uid: str, pid_ns: str, net_ns: str) -> str | None:
    """Why a sandbox whose commands report this uid and these namespaces is not fit for hostile code, or
    None: it must not be root inside nor share the host's pid or network namespace."""
    if uid == "0":
        return "the sandbox runs as root inside"
    if pid_ns == HOST_PID_NS:
        return "the sandbox shares the host's pid namespace"
    if net_ns == HOST_NET_NS:
        return "the sandbox shares the host's network namespace"
    return None
