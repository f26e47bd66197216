"""Sandbox slots: each open sandbox holds one, so concurrent sandboxes never share a uid, a cgroup or a /tmp.

A slot is an exclusive `flock` on <state>/locks/slot-N.lock, which works between threads and processes
alike and is released by the kernel if the holder dies. Running as root, slot N runs its commands as the
dedicated unprivileged uid and gid UID_BASE + N (RLIMIT_NPROC is ignored for root, and root inside a
sandbox could still read root-only host files); otherwise as the caller's own uid.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import tempfile
from pathlib import Path

UID_BASE = 20000
SLOT_COUNT = 1024


def is_root() -> bool:
    return os.geteuid() == 0


def state_root() -> Path:
    """Where slots keep their locks, synthetic /etc files and /tmp mounts (reachable by every slot uid)."""
    if is_root():
        return Path("/run/composer-sandbox")
    return Path(tempfile.gettempdir()) / f"composer-sandbox-{os.getuid()}"


def ensure_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    return path


@dataclasses.dataclass
class Slot:
    index: int
    uid: int  # the uid commands run as
    gid: int
    dir: Path  # per-slot state: etc/, tmp/
    lock_fd: int

    def release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # closing the only descriptor drops the flock
            self.lock_fd = -1


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def acquire_slot(index: int | None = None) -> Slot:
    """Lock slot `index` (RuntimeError if it is held) or the first free one."""
    locks = ensure_dir(state_root() / "locks")
    candidates = range(SLOT_COUNT) if index is None else [index]
    for n in candidates:
        if not 0 <= n < SLOT_COUNT:
            raise ValueError(f"slot {n} outside 0..{SLOT_COUNT - 1}")
        fd = _try_lock(locks / f"slot-{n}.lock")
        if fd is None:
            continue
        uid = gid = UID_BASE + n if is_root() else None
        slot = Slot(
            n,
            uid if uid is not None else os.getuid(),
            gid if gid is not None else os.getgid(),
            ensure_dir(state_root() / f"slot-{n}"),
            fd,
        )
        if is_root():
            # A holder that died uncleanly may have left processes; the slot's uid is ours now.
            kill_uid_processes(slot.uid)
        return slot
    raise RuntimeError(f"sandbox slot {index} is in use" if index is not None else "no free sandbox slot")


def uid_processes(uid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid is `uid`, found by scanning /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if fields.get(b"State", b"").strip().startswith(b"Z"):
            continue
        uids = fields.get(b"Uid", b"").split()
        if uids and int(uids[0]) == uid:
            found.append(int(entry.name))
    return found


def kill_uid_processes(uid: int) -> int:
    """SIGKILL every process of a slot uid (never of root or the caller); returns how many were signalled."""
    if uid == 0 or uid == os.getuid():
        raise ValueError("refusing to kill the processes of root or of the caller")
    killed = 0
    for pid in uid_processes(uid):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed
