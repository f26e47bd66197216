"""Isolation levels and the command lines that enter them.

Every command is started by the sandbox's spawner (spawner.py) inside the slot's cgroups, with its rlimits,
as the slot's unprivileged uid (as root) and with no_new_privs, and enters one of:

- bwrap: new user, pid, net, ipc, uts (and cgroup) namespaces, no further user namespaces, all capabilities
  dropped, a new session, a cleared environment, read-only binds of only /usr, the /bin /lib /lib64 /sbin
  links, the Python installation and a few harmless /etc files, synthetic /etc/passwd and /etc/group, fresh
  /proc and /dev, the workspace read-write at SANDBOX_ROOT, the slot's size-capped /tmp, and / remounted
  read-only. The pid namespace ends the whole tree when its first process dies, setsid'd children included.
- unshare: new user, pid, net, ipc, uts and mount namespaces and a fresh /proc; the host filesystem is
  visible with the host's permissions (the slot uid owns only the workspace and the slot's /tmp, which
  TMPDIR and HOME point to).
- none: a plain process group (its own session) with the rlimits, cgroups and uid; no namespaces at all.

The level is probed once per process (detect_isolation) with the real command line, logged once, and each
fallback warns once.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from env.sandbox.limits import MB
from env.sandbox.process import run_capped
from env.sandbox.slots import UID_BASE, ensure_dir, is_root, state_root
from env.sandbox.spawner import Launched, Spawner
from env.sandbox.workspace import mount_info, reachable_by_others

log = logging.getLogger("env.sandbox")

SANDBOX_ROOT = "/workspace"
LEVELS = ("bwrap", "unshare", "none")
LAUNCH_PATH = "/usr/bin:/bin"

# Host files that programs read and that hold no secrets, copied into each slot's synthetic /etc; nothing
# else of the host's /etc enters the sandbox. /etc/alternatives (Debian's command links) is bound as is.
ETC_COPIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "protocols",
    "services",
)
ETC_BINDS = ("/etc/alternatives",)
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")

_MS_BIND, _MS_REMOUNT, _MS_RDONLY = 4096, 32, 1
_libc = ctypes.CDLL(None, use_errno=True)
_warned: set[str] = set()


def warn_once(key: str, message: str, level: int = logging.WARNING) -> None:
    """Log `message` the first time `key` comes up in this process."""
    if key not in _warned:
        _warned.add(key)
        log.log(level, message)


def python_prefixes() -> list[str]:
    """The Python installation(s) the sandbox needs: the interpreter's prefix and, for a venv, its base."""
    return list(dict.fromkeys([sys.base_prefix, sys.prefix]))


def _host_bind(prefix: str) -> str:
    """A read-only bind of `prefix` at a path every slot uid can traverse, created once per host.

    bwrap resolves a bind's source as the unprivileged slot uid, so a Python under /root (mode 700) is not
    reachable directly. The bind lives under the sandbox state directory; it exposes nothing that was not
    already world-readable, only the route to it.
    """
    target = state_root() / "prefix" / prefix.strip("/").replace("/", "_")
    if mount_info(target) is not None:
        return str(target)
    ensure_dir(target.parent)
    with open(state_root() / "prefix.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if mount_info(target) is None:
            target.mkdir(exist_ok=True)
            source, dest = os.path.realpath(prefix).encode(), str(target).encode()
            for flags in (_MS_BIND, _MS_BIND | _MS_REMOUNT | _MS_RDONLY):
                if _libc.mount(source, dest, None, flags, None) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"bind {prefix} at {target}: {os.strerror(err)}")
    return str(target)


@functools.cache
def python_binds() -> tuple[tuple[str, str], ...]:
    """(host source, path inside) for each Python prefix; inside, it keeps its own path for the shebangs."""
    binds = []
    for prefix in python_prefixes():
        source = os.path.realpath(prefix)
        if is_root() and not reachable_by_others(source):
            source = _host_bind(prefix)
        binds.append((source, prefix))
    return tuple(binds)


def write_etc(directory: Path, uid: int, gid: int) -> str:
    """Build the sandbox's /etc in `directory`: synthetic passwd, group and hosts plus copies of ETC_COPIES.

    One directory is one bind per command instead of one per file. Returns the directory as a string.
    """
    shutil.rmtree(directory, ignore_errors=True)
    ensure_dir(directory)
    for name in ETC_COPIES:
        source = Path("/etc") / name
        if source.is_dir():
            shutil.copytree(source, directory / name)
        elif source.exists():
            shutil.copyfile(source, directory / name)
    files = {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\nsandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "hostname": "sandbox\n",
    }
    for name, text in files.items():
        (directory / name).write_text(text)
    for name in ETC_BINDS:
        (directory / os.path.basename(name)).mkdir()  # mount points: the bound /etc is read-only
    for root, dirs, names in os.walk(directory):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in names:
            os.chmod(os.path.join(root, name), 0o644)
    return str(directory)


def host_python_prefixes() -> list[str]:
    """Where a command that sees the host's filesystem (levels 'unshare' and 'none') finds Python: each
    prefix itself where the slot uid can reach it, else its read-only bind under the state directory (a
    Python under /root, mode 700, is not reachable as the slot uid)."""
    return [source for source, _ in python_binds()]


def sandbox_env(
    home: str, tmp: str, extra: dict[str, str] | None = None, *, prefixes: list[str] | None = None
) -> dict[str, str]:
    """The whole environment of a sandboxed command: nothing is inherited from the host.

    prefixes: the Python installations as the command sees them (default: at their own paths, where bwrap
    binds them). One seen elsewhere also gets its lib/ on LD_LIBRARY_PATH: an interpreter built with a
    shared libpython finds it through a RUNPATH that names the original path.
    """
    own = python_prefixes()
    prefixes = own if prefixes is None else prefixes
    path = [f"{p}/bin" for p in reversed(prefixes)] + ["/usr/local/bin", "/usr/bin", "/bin"]
    env = {
        "PATH": ":".join(path),
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        # pytest would otherwise import the plugins of every package installed beside it (seconds per run).
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
    }
    moved = [f"{p}/lib" for p in prefixes if p not in own]
    if moved:
        env["LD_LIBRARY_PATH"] = ":".join(moved)
    env.update(extra or {})
    return env


def bwrap_argv(
    *,
    workspace: str,
    tmp: str | None,
    tmp_mb: int,
    etc: str | None,
    env: dict[str, str],
    cwd: str,
    info_fd: int | None = None,
) -> list[str]:
    argv = [
        "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--disable-userns", "--hostname", "sandbox", "--cap-drop", "ALL",
        "--die-with-parent", "--new-session", "--clearenv",
    ]  # fmt: skip
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_LINKS:
        if os.path.islink(name):
            argv += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            argv += ["--ro-bind", name, name]
    if etc:
        argv += ["--ro-bind", etc, "/etc"]
    for name in ETC_BINDS:
        argv += ["--ro-bind-try", name, name]
    for source, inside in python_binds():
        argv += ["--ro-bind", source, inside]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(16 * MB), "--tmpfs", "/dev/shm"]
    argv += ["--bind", workspace, SANDBOX_ROOT]
    argv += ["--bind", tmp, "/tmp"] if tmp else ["--size", str(tmp_mb * MB), "--tmpfs", "/tmp"]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return argv + ["--chdir", cwd, "--remount-ro", "/", "--"]


def unshare_argv() -> list[str]:
    """New user (mapping only the current uid), net, pid, mount, ipc and uts namespaces; a fresh /proc."""
    return [
        "unshare", "--map-current-user", "--net", "--pid", "--fork", "--kill-child", "--mount-proc",
        "--ipc", "--uts", "--",
    ]  # fmt: skip


def _probe(level: str, spawner: Spawner) -> str | None:
    """Run a check at `level` with the real command line; returns None on success, else the reason."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        env = sandbox_env("/tmp", "/tmp")
        if level == "bwrap":
            inner = bwrap_argv(workspace=d, tmp=None, tmp_mb=1, etc=None, env=env, cwd=SANDBOX_ROOT)
        else:
            inner = unshare_argv()
        argv = inner + ["sh", "-c", "test $(id -u) != 0"]  # never root inside
        uid = UID_BASE - 1 if is_root() else None  # a uid no slot uses
        try:
            done = run_capped(
                lambda out: spawner.spawn(argv, env=env, cwd=d, fds={1: out}, uid=uid, gid=uid, rlimits=[]),
                timeout=10,
                max_output_bytes=4096,
                kill=Launched.kill,
            )
        except OSError as e:
            return str(e)
    if done.exit_code == 0:
        return None
    return done.output.decode(errors="replace").strip() or f"exit code {done.exit_code}"


@functools.cache
def detect_isolation() -> str:
    """The strongest level that works here: 'bwrap', 'unshare' or 'none' (probed once, logged once)."""
    reasons = []
    spawner = Spawner([], {"PATH": LAUNCH_PATH})
    try:
        for level in ("bwrap", "unshare"):
            reason = _probe(level, spawner)
            if reason is None:
                break
            reasons.append(f"{level}: {reason}")
        else:
            level = "none"
    finally:
        spawner.close()
    user = "a dedicated uid per slot" if is_root() else f"uid {os.getuid()}"
    if reasons:
        warn_once(level, f"sandbox isolation falls back to {level!r} ({'; '.join(reasons)})")
    log.info("sandbox isolation: %s, commands run as %s", level, user)
    return level
