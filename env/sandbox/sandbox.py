"""Sandbox: runs one episode's commands in its workspace, under bubblewrap unless a weaker level is forced.

Each command is a fresh process tree in its own namespaces (see isolation.py), so a timeout or the end of a
command takes every descendant with it. What persists across the commands of one episode is what a
terminal keeps: the working directory of `shell` (run_terminal_cmd semantics), the workspace, and the
slot's /tmp (size-capped, fresh when the sandbox opens, removed when it closes). Background commands run
in their own trees until they exit or the sandbox closes.

Setup that costs more than a few milliseconds happens once per sandbox, not per command: the slot, its
cgroups, its /tmp mount, its synthetic /etc, and the spawner process that starts every command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shlex
import shutil
import signal
import threading
import weakref
from pathlib import Path

from env.sandbox import isolation as iso
from env.sandbox import pythons
from env.sandbox.limits import MB, Limits, SlotCgroups, rlimits
from env.sandbox.process import run_capped
from env.sandbox.slots import Slot, acquire_slot, is_root, kill_uid_processes
from env.sandbox.spawner import Launched, Spawner
from env.sandbox.workspace import (
    adopt,
    mount_info,
    mount_tmpfs,
    reachable_by_others,
    resize_tmpfs,
    tree_bytes,
    unmount,
    unreachable_message,
    workspace_cap_bytes,
)

log = logging.getLogger("env.sandbox")
SANDBOX_ROOT = iso.SANDBOX_ROOT
DEFAULT_LIMITS = Limits()  # frozen, so one shared default is safe
INFO_FD, CWD_FD = 3, 4  # descriptor numbers inside the launcher: bwrap's --info-fd, the shell's cwd report


@dataclasses.dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command timed out
    output: str  # stdout and stderr interleaved, the first max_output_bytes of it
    timed_out: bool
    isolation: str  # 'bwrap' | 'unshare' | 'none'
    cwd: str  # working directory (inside path) after the command
    truncated: bool  # output went past max_output_bytes


def _kill_tree(launched: Launched) -> None:
    """SIGKILL the launcher; under bwrap/unshare its pid-namespace init dies with it (parent-death signal)
    and takes every process of the namespace along."""
    launched.kill()


def _kill_group(launched: Launched) -> None:
    """Without namespaces: the command's process group (children that left it with setsid escape)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(launched.pid, signal.SIGKILL)
    launched.kill()


def _reset_dir(path: Path) -> None:
    while mount_info(path) is not None:
        unmount(path)
    shutil.rmtree(path, ignore_errors=True)


class _Resources:
    """What an open sandbox holds; released exactly once, by close() or when the sandbox is collected."""

    def __init__(self, slot: Slot):
        self.slot = slot
        self.cgroups: SlotCgroups | None = None
        self.spawner: Spawner | None = None
        self.tmp: Path | None = None
        self.background: dict[str, Launched] = {}
        self.kill = _kill_tree

    def release(self) -> None:
        for launched in self.background.values():
            self.kill(launched)
            launched.wait(2.0)
            launched.close()
        self.background.clear()
        if self.spawner is not None:
            self.spawner.close()
        if is_root():
            left = kill_uid_processes(self.slot.uid)
            if left:
                log.warning("sandbox slot %d: killed %d leftover processes", self.slot.index, left)
        if self.cgroups is not None:
            self.cgroups.close()
        if self.tmp is not None:
            _reset_dir(self.tmp)
        self.slot.release()


class Sandbox:
    """One episode's sandbox over `workspace` (a host directory, typically from make_workspace).

    isolation: 'auto' (bubblewrap; IsolationUnavailable where it does not work), or 'bwrap' / 'unshare' /
    'none' to force a level (see isolation.resolve_isolation).
    slot: a fixed slot number (RuntimeError if in use), else the first free one.
    python_env: a venv directory whose interpreter commands run (see pythons.py); None: the project's.
    Thread-safe: several commands may run at once (parallel tool calls); each is its own process tree.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        limits: Limits = DEFAULT_LIMITS,
        isolation: str = "auto",
        slot: int | None = None,
        python_env: Path | str | None = None,
    ):
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise ValueError(f"workspace is not a directory: {workspace}")
        isolation = iso.resolve_isolation(isolation)
        if is_root() and not reachable_by_others(self.workspace):
            raise ValueError(
                unreachable_message(Path(workspace), "the workspace") + ", or make the workspace with "
                "make_workspace or as a directory of mode 0755 (tempfile.mkdtemp makes 0700)"
            )
        self.isolation = isolation
        self.limits = limits
        self.pythons = pythons.pythons(python_env)
        self.python_env = self.pythons.venv
        self._binds = pythons.binds(self.pythons.paths)  # (host source, path inside), read-only
        self._env = self._python_env()
        # Commands see the workspace at SANDBOX_ROOT in their own mount namespace ('none' has none).
        mounted = isolation == "bwrap" or (isolation == "unshare" and iso.has_mount_point())
        if isolation == "unshare" and not mounted:
            iso.warn_once("mount-point", f"sandbox 'unshare': no {SANDBOX_ROOT} to bind the workspace on")
        self.root = SANDBOX_ROOT if mounted else str(self.workspace)
        self.cwd = self.root
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._res = _Resources(acquire_slot(slot))
        self._finalizer = weakref.finalize(self, self._res.release)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _python_env(self) -> dict:
        """The Python part of the commands' environment: the bins, venv and libs of iso.sandbox_env."""
        found = self.pythons
        if self.isolation != "none":
            for path in found.paths:
                if pythons.under(path, SANDBOX_ROOT):
                    iso.warn_once(
                        "python-under-root", f"sandbox: the workspace at {SANDBOX_ROOT} hides {path}"
                    )
            return {"bins": found.bins, "venv": found.venv}
        # Without a mount namespace a command uses each installation where the slot uid reaches it: its
        # route. A venv's bin/python links to its base by the base's own path, which must be reachable.
        if found.venv is not None:
            for base in pythons.venv_base_prefixes(Path(found.venv)):
                if pythons.needs_route(base):
                    message = unreachable_message(Path(base), "the venv's base interpreter")
                    raise ValueError(f"{message}; or use isolation 'bwrap', which binds it")
        own = pythons.python_prefixes()

        def seen(path: str) -> str:
            for source, inside in self._binds:
                if pythons.under(path, inside):
                    return source + path[len(inside) :]
            return path

        return {
            "bins": [seen(b) for b in found.bins],
            "venv": found.venv and seen(found.venv),
            "libs": [f"{seen(p)}/lib" for p in own if seen(p) != p],
        }

    def _open(self) -> None:
        slot, limits, res = self._res.slot, self.limits, self._res
        res.kill = _kill_group if self.isolation == "none" else _kill_tree
        res.tmp = slot.dir / "tmp"
        _reset_dir(res.tmp)
        res.tmp.mkdir()
        if is_root():
            mount_tmpfs(res.tmp, limits.tmp_mb, mode=0o1777)
            res.cgroups = SlotCgroups(slot.index, limits)
        else:
            iso.warn_once("unprivileged", "sandbox not started as root: no slot uid, cgroups or /tmp cap")
        self.tmp = str(res.tmp) if self.isolation == "none" else "/tmp"
        self._setup = (
            iso.unshare_setup(
                workspace=str(self.workspace) if self.root == SANDBOX_ROOT else None,
                tmp=str(res.tmp),
                binds=self._binds,
            )
            if self.isolation == "unshare"
            else []
        )
        self._etc = iso.write_etc(slot.dir / "etc", slot.uid, slot.gid)
        cap = workspace_cap_bytes(self.workspace)
        if cap is not None and cap != limits.workspace_mb * MB and is_root():
            try:
                resize_tmpfs(self.workspace, limits.workspace_mb)
            except OSError as e:
                log.warning("sandbox workspace cap left at %d MB: %s", cap // MB, e)
        self._quota = None if cap is not None else limits.workspace_mb * MB
        if self._quota is not None:
            iso.warn_once(
                "quota", "sandbox workspace is not a size-capped mount; its size is checked per command"
            )
        self.adopt()
        iso.warn_once(
            "features",
            f"sandbox: isolation {self.isolation}, uid {'per slot' if is_root() else 'of the caller'}, "
            f"cgroups {(res.cgroups and res.cgroups.version) or 'none'}, "
            f"workspace cap {'size-capped tmpfs' if self._quota is None else 'size check per command'}",
            logging.INFO,
        )
        res.spawner = Spawner(res.cgroups.procs_files if res.cgroups else [], {"PATH": iso.LAUNCH_PATH})

    @property
    def slot(self) -> int:
        return self._res.slot.index

    @property
    def uid(self) -> int:
        return self._res.slot.uid

    def adopt(self, path: Path | None = None) -> None:
        """Make `path` (default: the whole workspace) owned and writable by the sandbox's uid; needed only for
        files the host created with a mode narrower than 0666 (see workspace.py)."""
        if is_root():
            slot = self._res.slot
            if not adopt(Path(path) if path else self.workspace, slot.uid, slot.gid):
                iso.warn_once("acl", "sandbox workspace has no POSIX ACLs: call adopt() after host writes")

    def host_path(self, inside: str) -> Path:
        """The host path of a path as commands see it (workspace and /tmp)."""
        for prefix, host in ((self.root, self.workspace), (self.tmp, self._res.tmp)):
            if inside == prefix or inside.startswith(prefix.rstrip("/") + "/"):
                return Path(host) / os.path.relpath(inside, prefix)
        raise ValueError(f"{inside} is neither in the workspace nor in /tmp")

    # -- commands ---------------------------------------------------------------------------------------

    def _start(self, command: list[str], cwd: str, env: dict | None, fds: dict[int, int]) -> Launched:
        """Start one command (the whole launcher: bwrap or unshare or nothing, then `command`)."""
        if not self._finalizer.alive:
            raise RuntimeError("the sandbox is closed")
        slot = self._res.slot
        inside_env = iso.sandbox_env(home=self.tmp, tmp=self.tmp, extra=env, **self._env)
        host_cwd = "/"
        if self.isolation == "bwrap":
            argv = iso.bwrap_argv(
                workspace=str(self.workspace), tmp=str(self._res.tmp), tmp_mb=self.limits.tmp_mb,
                etc=self._etc, env=inside_env, cwd=cwd, binds=self._binds,
                info_fd=INFO_FD if INFO_FD in fds else None,
            ) + command  # fmt: skip
            # bwrap clears the environment inside; its own (seen at /proc/1/environ) is the same minimal one.
        elif self.isolation == "unshare":
            argv = iso.unshare_argv(self._setup, uid=slot.uid, gid=slot.gid, cwd=cwd, root=self.root)
            argv += command
        else:
            argv = command
            host_cwd = cwd if os.path.isdir(cwd) else str(self.workspace)
        return self._res.spawner.spawn(
            argv,
            env=inside_env,
            cwd=host_cwd,
            fds=fds,
            uid=slot.uid if is_root() else None,
            gid=slot.gid if is_root() else None,
            rlimits=rlimits(self.limits),
            new_session=self.isolation == "none",
        )

    def _execute(
        self,
        command: list[str],
        cwd: str,
        timeout: float | None,
        env: dict | None,
        cwd_report: int | None = None,
    ) -> tuple[int | None, str, bool, bool]:
        info_read, info_write = os.pipe() if self.isolation == "bwrap" else (None, None)
        fds = {} if info_write is None else {INFO_FD: info_write}
        if cwd_report is not None:
            fds[CWD_FD] = cwd_report

        def start(out: int) -> Launched:
            try:
                return self._start(command, cwd, env, {1: out, **fds})
            finally:
                if info_write is not None:
                    os.close(info_write)  # the launcher has its copy; EOF must follow bwrap's own close

        try:
            done = run_capped(
                start,
                timeout=self.limits.timeout_s if timeout is None else timeout,
                max_output_bytes=self.limits.max_output_bytes,
                kill=self._res.kill,
                info_fd=info_read,
            )
        finally:
            if info_read is not None:
                os.close(info_read)
        output = done.output.decode("utf-8", errors="replace")
        if self._quota is not None:
            used = tree_bytes(self.workspace)
            if used > self._quota:
                output += (
                    f"\n[sandbox] workspace uses {used // MB} MB, over its cap of {self._quota // MB} MB\n"
                )
        return done.exit_code, output, done.timed_out, done.truncated

    def run(
        self,
        command: str | list[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict | None = None,
    ) -> CommandResult:
        """One command (a string runs via `bash -c`), from `cwd` (default: the workspace root); the shell's
        working directory is neither used nor changed."""
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        cwd = cwd or self.root
        code, output, timed_out, truncated = self._execute(argv, cwd, timeout, env)
        return CommandResult(code, output, timed_out, self.isolation, cwd, truncated)

    def shell(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """A `bash` command in the episode's shell: it starts where the previous one left off, and a `cd`
        carries over to the next call. result.cwd is the directory it ended in."""
        with self._lock:
            start = self.cwd
        # The EXIT trap reports the final directory on a private descriptor, also after `exit` or a syntax
        # error.
        script = (
            f"cd -- {shlex.quote(start)} 2>/dev/null || cd -- {shlex.quote(self.root)}\n"
            f"trap 'builtin pwd -P >&{CWD_FD} 2>/dev/null' EXIT\n{command}\n"
        )
        read_fd, write_fd = os.pipe()
        try:
            try:
                code, output, timed_out, truncated = self._execute(
                    ["bash", "-c", script], self.root, timeout, None, cwd_report=write_fd
                )
            finally:
                os.close(write_fd)
            os.set_blocking(read_fd, False)
            try:
                reported = os.read(read_fd, 65536).decode(errors="replace").strip().splitlines()
            except BlockingIOError:
                reported = []
        finally:
            os.close(read_fd)
        cwd = reported[-1] if reported and reported[-1].startswith("/") else start
        with self._lock:
            self.cwd = cwd
        return CommandResult(code, output, timed_out, self.isolation, cwd, truncated)

    def start_background(self, command: str) -> tuple[str, int, str]:
        """Start `command` in the shell's directory without waiting; returns (shell id, host pid of its
        launcher, path inside the sandbox of the file collecting its output). It runs until it exits or the
        sandbox closes."""
        shell_id = str(next(self._ids))
        name = f"background-{shell_id}.log"
        log_path = self._res.tmp / name
        with self._lock:
            start = self.cwd
        script = f"cd -- {shlex.quote(start)} 2>/dev/null || cd -- {shlex.quote(self.root)}\n{command}\n"
        with open(log_path, "wb") as out:
            os.chown(log_path, self.uid, self._res.slot.gid)
            launched = self._start(["bash", "-c", script], self.root, None, {1: out.fileno()})
        with self._lock:
            self._res.background[shell_id] = launched
        return shell_id, launched.pid, f"{self.tmp}/{name}"

    def close(self) -> None:
        """End every process still running, remove the slot's cgroups and /tmp, release the slot."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
