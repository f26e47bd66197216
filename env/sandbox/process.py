"""Running one command with a wall-clock deadline and a capped, incrementally read output.

The output pipe is read as data arrives, keeping the first `max_output_bytes` and counting the rest, so a
command that prints 100 MB costs the caller at most the cap in memory. The command's exit arrives on a
descriptor in the same poll, so nothing sleeps or polls on a timer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import selectors
import signal
import time
from collections.abc import Callable

from env.sandbox.spawner import Launched

READ_CHUNK = 1 << 16
# After the launcher exits, how long to wait for the pipe's other writers. Under a pid namespace they are
# already dead and EOF is immediate; without one, a child that kept the pipe open is killed after this.
EXIT_GRACE_S = 0.2
KILL_GRACE_S = 1.0


@dataclasses.dataclass
class Finished:
    exit_code: int | None  # None when the deadline ended the command
    output: bytes
    truncated: bool
    timed_out: bool


def exit_code(returncode: int) -> int:
    """Exit status as a shell reports it: 128 + n for death by signal n."""
    return returncode if returncode >= 0 else 128 - returncode


class _Reader:
    def __init__(self, fd: int, cap: int):
        self.fd, self.cap = fd, cap
        self.buf = bytearray()
        self.dropped = 0
        self.eof = False
        os.set_blocking(fd, False)

    def drain(self) -> None:
        while not self.eof:
            try:
                chunk = os.read(self.fd, READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            keep = min(len(chunk), self.cap - len(self.buf))
            self.buf += chunk[:keep]
            self.dropped += len(chunk) - keep


class NamespaceInit:
    """bwrap's pid-namespace init, known from the JSON that bwrap writes to --info-fd at start.

    bwrap can exit a moment before its init, which is still tearing the namespace down; waiting for the init
    makes "the call returned" mean "every process of the namespace is gone", and a timeout kills it directly.
    """

    def __init__(self, info_fd: int | None):
        self.info_fd, self.text, self.pidfd = info_fd, b"", None
        if info_fd is not None:
            os.set_blocking(info_fd, False)

    def read(self) -> bool:
        """Read what is available; True once the info is complete (EOF)."""
        if self.info_fd is None:
            return True
        while True:
            try:
                chunk = os.read(self.info_fd, 4096)
            except BlockingIOError:
                return False
            if not chunk:
                break
            self.text += chunk
        self.info_fd = None  # the caller owns and closes the descriptor
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            info = json.loads(self.text)
            pid = int(info["child-pid"])
            pidfd = os.pidfd_open(pid)
            # Once the pidfd pins a process, check that the pid still names the init (its namespace).
            if os.readlink(f"/proc/{pid}/ns/pid") == f"pid:[{info['pid-namespace']}]":
                self.pidfd = pidfd
            else:
                os.close(pidfd)
        return True

    def kill(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        """Until the init has exited (its pidfd turns readable then)."""
        if self.pidfd is not None:
            with selectors.PollSelector() as sel:
                sel.register(self.pidfd, selectors.EVENT_READ)
                sel.select(timeout)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def run_capped(
    start: Callable[[int], Launched],
    *,
    timeout: float,
    max_output_bytes: int,
    kill: Callable[[Launched], None],
    info_fd: int | None = None,
) -> Finished:
    """Start a command with `start(stdout_fd)` (stderr goes to the same pipe) and collect its output.

    kill: ends the command's whole tree (called at the deadline). info_fd: the read end of bwrap's
    --info-fd, if the command is a bwrap sandbox (see NamespaceInit).
    """
    deadline = time.monotonic() + timeout
    out_read, out_write = os.pipe()
    try:
        launched = start(out_write)
    except BaseException:
        os.close(out_read)
        raise
    finally:
        os.close(out_write)
    reader = _Reader(out_read, max_output_bytes)
    init = NamespaceInit(info_fd)
    timed_out = False
    try:
        with selectors.PollSelector() as sel:
            sel.register(reader.fd, selectors.EVENT_READ)
            sel.register(launched.exit_fd, selectors.EVENT_READ)
            if info_fd is not None:
                sel.register(info_fd, selectors.EVENT_READ)
            exited_at = None
            while not (reader.eof and exited_at is not None):
                limit = deadline if exited_at is None else min(deadline, exited_at + EXIT_GRACE_S)
                wait = limit - time.monotonic()
                if wait <= 0:
                    timed_out = exited_at is None
                    break
                for key, _ in sel.select(wait):
                    if key.fd == launched.exit_fd:
                        exited_at = time.monotonic()
                        sel.unregister(key.fd)
                    elif key.fd == info_fd:
                        if init.read():
                            sel.unregister(info_fd)
                    else:
                        reader.drain()
                        if reader.eof:
                            sel.unregister(reader.fd)
        init.read()
        if timed_out or not reader.eof:
            kill(launched)
            init.kill()
            _drain_until(reader, time.monotonic() + KILL_GRACE_S)
        returncode = launched.wait(KILL_GRACE_S)
        init.wait(KILL_GRACE_S)
    except BaseException:
        kill(launched)
        init.kill()
        raise
    finally:
        init.close()
        launched.close()
        os.close(out_read)
    return Finished(
        exit_code=None if timed_out or returncode is None else exit_code(returncode),
        output=bytes(reader.buf),
        truncated=reader.dropped > 0,
        timed_out=timed_out,
    )


def _drain_until(reader: _Reader, deadline: float) -> None:
    """Read what the killed tree still wrote, until EOF or the deadline."""
    with selectors.PollSelector() as sel:
        sel.register(reader.fd, selectors.EVENT_READ)
        while not reader.eof:
            wait = deadline - time.monotonic()
            if wait <= 0 or not sel.select(wait):
                return
            reader.drain()
