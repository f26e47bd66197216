"""Resource limits of sandboxed commands: per-process rlimits and per-slot cgroups (v1 or v2).

rlimits bind each process (a fork bomb is stopped by RLIMIT_NPROC, which counts every process of the slot's
uid, a runaway file by RLIMIT_FSIZE); cgroups bind the slot as a whole (the memory of all its processes and
of the tmpfs pages they write, the number of tasks). Both are in place before a command starts (see
spawner.py), so every process inside inherits them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger("env.sandbox")

MB = 1 << 20
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_GROUP = "composer-sandbox"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Limits of one sandbox; the defaults suit running pytest on a small repository."""

    timeout_s: float = 30.0  # wall clock per command
    address_space_mb: int = 4096  # RLIMIT_AS per process
    cpu_s: int = 60  # RLIMIT_CPU per process (SIGXCPU, then SIGKILL a second later)
    nproc: int = 128  # RLIMIT_NPROC: processes and threads of the slot's uid
    file_size_mb: int = 64  # RLIMIT_FSIZE: largest file a process may write
    open_files: int = 256  # RLIMIT_NOFILE
    memory_mb: int = 2048  # cgroup memory of the whole slot (processes and tmpfs pages)
    pids: int = 128  # cgroup tasks of the whole slot
    workspace_mb: int = 256  # size cap of the workspace
    tmp_mb: int = 64  # size cap of the sandbox's /tmp
    max_output_bytes: int = 1_000_000  # output kept per command (the head; the rest is counted and dropped)


def rlimits(limits: Limits) -> list[tuple[str, int, int]]:
    """(resource name, soft, hard) for every rlimit a sandboxed command starts with."""
    return [
        ("RLIMIT_AS", limits.address_space_mb * MB, limits.address_space_mb * MB),
        ("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard
        ("RLIMIT_NPROC", limits.nproc, limits.nproc),
        ("RLIMIT_FSIZE", limits.file_size_mb * MB, limits.file_size_mb * MB),
        ("RLIMIT_NOFILE", limits.open_files, limits.open_files),
        ("RLIMIT_CORE", 0, 0),
    ]


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _cgroup_v1_dirs() -> dict[str, Path]:
    """Controller name -> hierarchy root, for the v1 memory and pids hierarchies that are mounted."""
    roots = {}
    for controller in ("memory", "pids"):
        root = CGROUP_ROOT / controller
        marker = "memory.limit_in_bytes" if controller == "memory" else "pids.max"
        # A v1 root has no pids.max of its own; its children do. cgroup.procs marks a hierarchy.
        if (root / "cgroup.procs").exists() and (controller == "pids" or (root / marker).exists()):
            roots[controller] = root
    return roots


def _cgroup_v2_root() -> Path | None:
    controllers = CGROUP_ROOT / "cgroup.controllers"
    if not controllers.exists():
        return None
    available = controllers.read_text().split()
    return CGROUP_ROOT if {"memory", "pids"} <= set(available) else None


class SlotCgroups:
    """The memory and pids cgroups of one slot, created once when the sandbox opens.

    Layout: <root>/composer-sandbox/slot-N (v1: one such directory per controller hierarchy). Each command
    joins them by writing its pid to `procs_files` before it execs into the sandbox. Where no writable
    hierarchy exists, `procs_files` is empty and only the rlimits apply.
    """

    def __init__(self, slot: int, limits: Limits):
        self.dirs: list[Path] = []
        self.version = ""
        try:
            self._create(slot, limits)
        except OSError as e:
            log.warning("sandbox cgroups unavailable (%s); only rlimits apply", e)
            self.close()

    def _create(self, slot: int, limits: Limits) -> None:
        name = f"slot-{slot}"
        v1 = _cgroup_v1_dirs()
        if v1:
            for controller, root in v1.items():
                d = root / CGROUP_GROUP / name
                d.mkdir(parents=True, exist_ok=True)
                self.dirs.append(d)
                if controller == "memory":
                    _write(d / "memory.limit_in_bytes", str(limits.memory_mb * MB))
                    swap = d / "memory.memsw.limit_in_bytes"
                    if swap.exists():
                        _write(swap, str(limits.memory_mb * MB))
                else:
                    _write(d / "pids.max", str(limits.pids))
            self.version = "v1"
            return
        root = _cgroup_v2_root()
        if root is None:
            return
        group = root / CGROUP_GROUP
        group.mkdir(exist_ok=True)
        # v2 only distributes a controller to children when every ancestor enables it for its subtree.
        _write(root / "cgroup.subtree_control", "+memory +pids")
        _write(group / "cgroup.subtree_control", "+memory +pids")
        d = group / name
        d.mkdir(exist_ok=True)
        self.dirs.append(d)
        _write(d / "memory.max", str(limits.memory_mb * MB))
        if (d / "memory.swap.max").exists():
            _write(d / "memory.swap.max", "0")
        _write(d / "pids.max", str(limits.pids))
        self.version = "v2"

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def close(self) -> None:
        """Kill whatever is left in the slot's cgroups and remove them."""
        for d in self.dirs:
            deadline = time.monotonic() + 2.0
            while True:
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY while killed tasks are still exiting.
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("sandbox cgroup %s not removed: %s", d, e)
                        break
                    time.sleep(0.01)
        self.dirs = []
