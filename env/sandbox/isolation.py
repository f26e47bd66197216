"""Isolation levels and the command lines that enter them.

Every command is started by the sandbox's spawner (spawner.py) inside the slot's cgroups, with its rlimits,
as the slot's unprivileged uid (as root) and with no_new_privs, and enters one of:

- bwrap: new user, pid, net, ipc, uts (and cgroup) namespaces, no further user namespaces, all capabilities
  dropped, a new session, a cleared environment, read-only binds of only /usr, the /bin /lib /lib64 /sbin
  links, the Python installations (pythons.py) and a few harmless /etc files, synthetic /etc/passwd and
  /etc/group, fresh /proc and /dev, the workspace read-write at SANDBOX_ROOT, the slot's size-capped /tmp,
  and / remounted read-only. The pid namespace ends the whole tree when its first process dies, setsid'd
  children included.
- unshare: new user, pid, net, ipc, uts and mount namespaces and a fresh /proc; in its mount namespace the
  workspace at SANDBOX_ROOT, the slot's /tmp at /tmp, a fresh /dev/shm and the Python installations
  read-only at their own paths, so commands and tool results see the same paths as under bwrap. The rest
  of the host filesystem is visible with the host's permissions, and the command may make further
  namespaces. The workspace stays at its host path if SANDBOX_ROOT is missing and cannot be made (not
  root).
- none: a plain process group (its own session) with the rlimits, cgroups and uid; no namespaces, so
  commands see the workspace and the slot's /tmp at their host paths (the host-side tools still name files
  by /workspace paths).

Choosing a level fails closed: 'auto' means bwrap, and where bwrap does not work `resolve_isolation` raises
IsolationUnavailable (how to install it, how to force a weaker level) instead of falling back. A forced
weaker level warns once. Each level is probed once per process with the real command line (`probe`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import shutil
import tempfile
from pathlib import Path

from env.sandbox import pythons
from env.sandbox.limits import MB
from env.sandbox.process import run_capped
from env.sandbox.pythons import needs_route, under
from env.sandbox.slots import UID_BASE, ensure_dir, is_root, state_root
from env.sandbox.spawner import Launched, Spawner
from env.sandbox.workspace import untraversable

log = logging.getLogger("env.sandbox")

SANDBOX_ROOT = "/workspace"
LEVELS = ("bwrap", "unshare", "none")
LAUNCH_PATH = "/usr/bin:/bin"
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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

_warned: set[str] = set()


def warn_once(key: str, message: str, level: int = logging.WARNING) -> None:
    """Log `message` the first time `key` comes up in this process."""
    if key not in _warned:
        _warned.add(key)
        log.log(level, message)


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


@functools.cache
def _which(name: str) -> str | None:
    return shutil.which(name, path=TOOL_PATH)


def tool(name: str) -> str:
    """The absolute path of a host program the sandbox starts commands with, looked up on TOOL_PATH only: a
    command's PATH starts with Python bin directories, whose files must not stand in for the launcher."""
    found = _which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed (not found in {TOOL_PATH})")
    return found


def sandbox_env(
    home: str,
    tmp: str,
    extra: dict[str, str] | None = None,
    *,
    bins: tuple[str, ...] | list[str],
    venv: str | None = None,
    libs: tuple[str, ...] | list[str] = (),
) -> dict[str, str]:
    """The whole environment of a sandboxed command: nothing is inherited from the host.

    bins: the Python bin directories, first on PATH; venv: the venv as the command sees it (VIRTUAL_ENV).
    libs: LD_LIBRARY_PATH, for an interpreter seen away from its own path (a shared libpython is found
    through a RUNPATH that names the original path).
    """
    env = {
        "PATH": ":".join([*bins, "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
    }
    if venv:
        # A task's venv holds only what its tests need, pytest plugins included: they load as they would
        # for the project's developers.
        env["VIRTUAL_ENV"] = venv
    else:
        # The project's interpreter: pytest would import the plugins of every package installed beside it
        # (seconds per run).
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if libs:
        env["LD_LIBRARY_PATH"] = ":".join(libs)
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
    binds: tuple[tuple[str, str], ...],
    info_fd: int | None = None,
) -> list[str]:
    """binds: (host source, path inside) of the Python installations, read-only; those under /tmp are
    bound after the slot's /tmp, which would hide them."""
    argv = [
        tool("bwrap"), "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
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
    in_tmp = [b for b in binds if under(b[1], "/tmp")]
    for source, inside in binds:
        if (source, inside) not in in_tmp:
            argv += ["--ro-bind", source, inside]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(16 * MB), "--tmpfs", "/dev/shm"]
    argv += ["--bind", workspace, SANDBOX_ROOT]
    argv += ["--bind", tmp, "/tmp"] if tmp else ["--size", str(tmp_mb * MB), "--tmpfs", "/tmp"]
    for source, inside in in_tmp:
        argv += ["--ro-bind", source, inside]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    return argv + ["--chdir", cwd, "--remount-ro", "/", "--"]


# The unshare level's setup, run by sh as root of the new user namespace (mapped to the slot uid, so with no
# more rights on host files than the slot uid): it performs the mount operations that follow its first four
# arguments (uid, gid, cwd, root) up to `--`, enters the directory, then drops to uid/gid in a nested user
# namespace (which clears its capabilities at exec) and execs the command. Operations: `bind SRC DST`,
# `robind SRC DST` (read-only, DST made first), `rbind SRC DST` (with the mounts below SRC), `tmpfs DST OPTS`.
_UNSHARE_SETUP = r"""
uid=$1 gid=$2 cwd=$3 root=$4; shift 4
while [ "$1" != -- ]; do
  case $1 in
    bind) {mount} --bind "$2" "$3" || exit 125; shift 3 ;;
    robind) {mkdir} -p -- "$3" && {mount} --bind -o ro "$2" "$3" || exit 125; shift 3 ;;
    rbind) {mount} --rbind "$2" "$3" || exit 125; shift 3 ;;
    tmpfs) {mount} -t tmpfs -o "$3" tmpfs "$2" || exit 125; shift 3 ;;
    *) echo "sandbox setup: unknown operation $1" >&2; exit 125 ;;
  esac
done
shift
cd -- "$cwd" 2>/dev/null || cd -- "$root" || exit 125
exec {unshare} --user --map-user="$uid" --map-group="$gid" -- "$@"
"""


@functools.cache
def has_mount_point() -> bool:
    """Whether SANDBOX_ROOT is a directory on the host that the unshare level can bind the workspace on
    (inside its own mount namespace only). As root an empty one is made once; otherwise the workspace is
    seen at its host path under 'unshare' (`sudo mkdir /workspace` fixes that)."""
    if is_root() and not os.path.lexists(SANDBOX_ROOT):
        with contextlib.suppress(FileExistsError):
            os.mkdir(SANDBOX_ROOT, 0o755)
    return os.path.isdir(SANDBOX_ROOT) and not os.path.islink(SANDBOX_ROOT)


def unshare_setup(
    *, workspace: str | None, tmp: str, binds: tuple[tuple[str, str], ...], shm_mb: int = 16
) -> list[str]:
    """The mount operations of the unshare helper: the workspace at SANDBOX_ROOT (None: seen at its host
    path), the slot's `tmp` at /tmp, a fresh /dev/shm, and each Python installation read-only at its own
    path. One the slot uid cannot reach (under /root) is bound from its route on a tmpfs laid over the
    first directory that blocks it (in this mount namespace only; it hides that directory's contents).
    Last, an empty tmpfs hides the sandbox state directory: the other slots' /tmp and /etc."""
    ops, covers, late = [], [], []
    if workspace is not None:
        ops += ["bind", workspace, SANDBOX_ROOT]
    for source, inside in binds:
        if under(inside, "/tmp"):
            ops += ["robind", source, tmp + inside[len("/tmp") :]]  # before /tmp hides its source
            continue
        blocked = untraversable(Path(inside)) if needs_route(inside) else None
        if blocked is not None and str(blocked) not in covers:
            covers.append(str(blocked))
        late += ["robind", source, inside]
    ops += ["rbind", tmp, "/tmp", "tmpfs", "/dev/shm", f"mode=1777,size={shm_mb}m"]
    for cover in covers:
        ops += ["tmpfs", cover, "mode=755,size=1m"]
    ops += late
    if is_root():  # otherwise the state directory is under /tmp, already replaced
        ops += ["tmpfs", str(state_root()), "mode=755,size=1m"]
    return ops


def unshare_argv(setup: list[str], *, uid: int, gid: int, cwd: str, root: str) -> list[str]:
    """New user, net, pid, mount, ipc and uts namespaces and a fresh /proc, then `setup` (see
    unshare_setup) and the drop to uid/gid; the command follows."""
    script = _UNSHARE_SETUP.format(
        **{name: shlex.quote(tool(name)) for name in ("mount", "mkdir", "unshare")}
    )
    return [
        tool("unshare"), "--map-root-user", "--mount", "--propagation", "private", "--net", "--pid",
        "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts", "--",
        tool("sh"), "-c", script, "sandbox-setup", str(uid), str(gid), cwd, root, *setup, "--",
    ]  # fmt: skip


# -- choosing the level ---------------------------------------------------------------------------------


class IsolationUnavailable(RuntimeError):
    """The isolation level asked for does not work on this machine; the message says how to fix that."""


def _probe_argv(level: str, workspace: str, tmp: str, env: dict[str, str], uid: int, gid: int) -> list[str]:
    binds = pythons.binds(pythons.pythons().paths)
    if level == "bwrap":
        return bwrap_argv(
            workspace=workspace, tmp=None, tmp_mb=1, etc=None, env=env, cwd=SANDBOX_ROOT, binds=binds
        )
    root = SANDBOX_ROOT if has_mount_point() else workspace
    setup = unshare_setup(workspace=workspace if has_mount_point() else None, tmp=tmp, binds=binds)
    return unshare_argv(setup, uid=uid, gid=gid, cwd=root, root=root)


@functools.cache
def probe(level: str) -> str | None:
    """Run a check at `level` ('bwrap' or 'unshare') with the real command line, as a uid no slot uses;
    None when it works, else the reason."""
    with tempfile.TemporaryDirectory() as d:
        workspace, tmp = Path(d, "workspace"), Path(d, "tmp")
        workspace.mkdir()
        tmp.mkdir()
        os.chmod(d, 0o755)
        os.chmod(workspace, 0o755)
        os.chmod(tmp, 0o1777)
        uid = UID_BASE - 1 if is_root() else os.getuid()
        gid = UID_BASE - 1 if is_root() else os.getgid()
        env = sandbox_env("/tmp", "/tmp", bins=pythons.pythons().bins)
        spawner = Spawner([], {"PATH": LAUNCH_PATH})
        try:
            argv = _probe_argv(level, str(workspace), str(tmp), env, uid, gid)
            argv += [tool("sh"), "-c", "test $(id -u) != 0"]  # never root inside
            done = run_capped(
                lambda out: spawner.spawn(
                    argv,
                    env=env,
                    cwd=d,
                    fds={1: out},
                    uid=uid if is_root() else None,
                    gid=gid if is_root() else None,
                    rlimits=[],
                ),  # fmt: skip
                timeout=10,
                max_output_bytes=4096,
                kill=Launched.kill,
            )
        except OSError as e:
            return str(e)
        finally:
            spawner.close()
    if done.exit_code == 0:
        return None
    return done.output.decode(errors="replace").strip() or f"exit code {done.exit_code}"


def detect_isolation() -> str:
    """The strongest level that works here: 'bwrap', 'unshare' or 'none'. For reports and tests: a sandbox
    never picks a weaker level by itself (see resolve_isolation)."""
    for level in ("bwrap", "unshare"):
        if probe(level) is None:
            return level
    return "none"


def resolve_isolation(requested: str) -> str:
    """The level a sandbox asked for `requested` runs at: 'auto' and 'bwrap' mean bubblewrap, and fail
    with IsolationUnavailable (saying how to install it, or how to force a weaker level) where it does not
    work; 'unshare' and 'none' are taken as forced, with a warning once per process. Call it at start-up to
    stop before any work when the machine cannot sandbox."""
    if requested not in ("auto", *LEVELS):
        raise ValueError(f"isolation must be 'auto' or one of {LEVELS}, got {requested!r}")
    level = "bwrap" if requested == "auto" else requested
    reason = None if level == "none" else probe(level)
    if reason is not None and level == "bwrap":
        raise IsolationUnavailable(
            f"sandbox isolation {requested!r} needs bubblewrap, which does not work here: {reason}. "
            "Install it with: apt-get install -y bubblewrap. Or run model commands with less isolation "
            "by forcing a level: --config.env.isolation=unshare (namespaces without bubblewrap) or "
            "--config.env.isolation=none (no namespaces at all); the CLIs take --isolation=unshare|none."
        )
    if reason is not None:
        raise IsolationUnavailable(
            f"sandbox isolation 'unshare' does not work here: {reason}. Install bubblewrap "
            "(apt-get install -y bubblewrap) and use isolation 'auto', or force 'none'."
        )
    user = "a dedicated uid per slot" if is_root() else f"uid {os.getuid()}"
    if level != "bwrap":
        warn_once(level, f"sandbox isolation forced to {level!r}, weaker than bubblewrap ('auto')")
    warn_once(f"level-{level}", f"sandbox isolation: {level}, commands run as {user}", logging.INFO)
    return level
