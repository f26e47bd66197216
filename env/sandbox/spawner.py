"""A small per-sandbox process that starts the sandbox's commands, so each starts cheaply and already limited.

Why a separate process: a command must start inside the slot's cgroups with its rlimits and uid set. Moving
a process into a v1 cgroup costs an RCU grace period (~10 ms measured here, per hierarchy); forking the
caller (often a large Python process) for a preexec hook costs 20-60 ms; and without CAP_SYS_RESOURCE
(missing here) root cannot prlimit another uid's process. The spawner joins the cgroups once; each command
is then a fork of this small process (born in the cgroups), which sets its rlimits, drops to the slot uid
(setgroups/setresgid/setresuid, as setpriv does), sets no_new_privs and execs the launcher (bwrap) directly.

Protocol, over a SOCK_SEQPACKET socketpair: the client sends one JSON request with file descriptors
(SCM_RIGHTS): first a per-request reply socket, then the descriptors to install in the child (request
"fds": their target numbers). The spawner answers on the reply socket with {"pid"} plus a pidfd of the child,
and later {"status"} (a waitstatus_to_exitcode value) when the child has exited and been reaped.

Lifetime: when the control socket closes (the sandbox closed, or its process died), the spawner kills the
children still running and exits; each child also dies with the spawner (PR_SET_PDEATHSIG). The spawner
itself does not use PR_SET_PDEATHSIG: that signal follows the creating *thread*, and a sandbox opened in a
short-lived thread would lose its spawner when the thread ended. Its oom_score_adj is -1000 so a
memory bomb in the slot's cgroup never takes it down (where allowed; it needs CAP_SYS_RESOURCE), and the
children's is +1000, so the OOM killer picks them first in any case.

This file runs as a script under `python -I -S` and so imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading

MAX_FDS = 8
MAX_MESSAGE = 1 << 20
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


# -- the spawner process --------------------------------------------------------------------------------


def _exec_child(request: dict, fds: list[int]) -> None:
    """In the forked child: install descriptors, limits, identity, then exec. Never returns."""
    try:
        targets = request["fds"]
        top = max([2, *targets])
        # Move every received descriptor above all targets first, so no dup2 overwrites a pending source.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, top + 1) for fd in fds]
        for src, dst in zip(high, targets):
            os.dup2(src, dst)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        if 1 in targets and 2 not in targets:
            os.dup2(1, 2)
        for fd in range(3, top + 1):
            if fd not in targets:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.closerange(top + 1, os.sysconf("SC_OPEN_MAX"))
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer's first choice, before the spawner (raising needs no privilege)
        for name, soft, hard in request["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if request["new_session"]:
            os.setsid()
        if request["uid"] is not None:
            os.setgroups([])
            os.setresgid(request["gid"], request["gid"], request["gid"])
            os.setresuid(request["uid"], request["uid"], request["uid"])
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        # After the uid change (which clears it): die if the spawner dies.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != request["spawner"]:
            os._exit(137)
        os.chdir(request["cwd"])
        os.execvpe(request["argv"][0], request["argv"], request["env"])
    except BaseException as e:  # noqa: BLE001 - report anything, then leave without running Python cleanup
        os.write(2, f"sandbox: cannot start {request['argv'][:1]}: {e}\n".encode())
    finally:
        os._exit(127)


def serve(control_fd: int) -> None:
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")  # needs CAP_SYS_RESOURCE; without it, the children's +1000 still puts them first
    control = socket.socket(fileno=control_fd)
    control.send(b'{"ready": true}')
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    with selectors.DefaultSelector() as sel:
        sel.register(control, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select():
                if key.fileobj is control:
                    try:
                        message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, MAX_FDS)
                    except OSError:
                        message, fds = b"", []
                    if not message:
                        for pidfd in children:
                            with contextlib.suppress(ProcessLookupError):
                                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        return
                    request = json.loads(message)
                    reply = socket.socket(fileno=fds[0])
                    request["spawner"] = os.getpid()
                    pid = os.fork()
                    if pid == 0:
                        _exec_child(request, fds[1:])
                    for fd in fds[1:]:
                        os.close(fd)
                    pidfd = os.pidfd_open(pid)  # before reaping, so it names this child
                    socket.send_fds(reply, [json.dumps({"pid": pid}).encode()], [pidfd])
                    children[pidfd] = (pid, reply)
                    sel.register(pidfd, selectors.EVENT_READ)
                else:
                    pidfd = key.fd
                    sel.unregister(pidfd)
                    pid, reply = children.pop(pidfd)
                    _, status = os.waitpid(pid, 0)
                    with contextlib.suppress(OSError):  # the client may have stopped listening
                        reply.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
                    reply.close()
                    os.close(pidfd)


# -- the client, in the sandbox's own process ----------------------------------------------------------


class Launched:
    """A command started by the spawner: its pid, a pidfd to signal it, and where its exit status arrives."""

    def __init__(self, pid: int, pidfd: int, reply: socket.socket):
        self.pid, self.pidfd, self._reply = pid, pidfd, reply
        self.returncode: int | None = None

    @property
    def exit_fd(self) -> int:
        """Turns readable when the status has arrived (or the spawner died)."""
        return self._reply.fileno()

    def collect(self) -> int:
        """The exit code (negative: killed by that signal); blocks until known."""
        if self.returncode is None:
            self._reply.setblocking(True)
            message = self._reply.recv(4096)
            self.returncode = json.loads(message)["status"] if message else -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._reply, selectors.EVENT_READ)
            if self.returncode is None and not sel.select(timeout):
                return None
        return self.collect()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
            self._reply.close()


class Spawner:
    """Client of one spawner process, started by the sandbox and placed in its slot's cgroups."""

    def __init__(self, cgroup_procs_files: list[str], env: dict[str, str]):
        control, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.Lock()
        with child:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(child.fileno())],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        self._control = control
        try:
            for path in cgroup_procs_files:  # before it starts anything, so every command is born inside
                with open(path, "w") as f:
                    f.write(str(self.proc.pid))
            control.settimeout(30)
            if not control.recv(64):
                raise RuntimeError("the sandbox spawner did not start")
            control.settimeout(None)
        except BaseException:
            self.close()
            raise

    def spawn(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        fds: dict[int, int],
        uid: int | None,
        gid: int | None,
        rlimits: list[tuple[str, int, int]],
        new_session: bool = False,
    ) -> Launched:
        """Start argv with `fds` ({target number: our descriptor}) installed; 0 is /dev/null, 2 follows 1."""
        request = {
            "argv": argv, "env": env, "cwd": cwd, "fds": list(fds), "uid": uid, "gid": gid,
            "rlimits": rlimits, "new_session": new_session,
        }  # fmt: skip
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per read
        try:
            with self._lock, theirs:
                socket.send_fds(
                    self._control, [json.dumps(request).encode()], [theirs.fileno(), *fds.values()]
                )
            mine.settimeout(30)
            message, received, _, _ = socket.recv_fds(mine, 4096, 1)
            if not message or not received:
                raise RuntimeError("the sandbox spawner died")
            return Launched(json.loads(message)["pid"], received[0], mine)
        except BaseException:
            mine.close()
            raise

    def close(self) -> None:
        """Stop the spawner; it kills whatever it started that is still running."""
        self._control.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
