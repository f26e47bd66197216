"""Workspaces: private, size-capped copies of a task repository, and the file ownership that lets both the
sandbox uid and the host-side tools write them.

Size cap. As root, each workspace is its own tmpfs mounted with `size=`, so a command that fills the disk
gets ENOSPC at the cap and the host disk is never touched (tmpfs pages written inside a sandbox are also
charged to its memory cgroup). Without the right to mount, the workspace is a plain directory and the
sandbox checks its size after every command instead (`tree_bytes`).

Copying. A plain copy, by design: hard links would share inodes with the task repository, so an in-place
write in the sandbox (`>>`, `open(..., "r+")`) would corrupt the original, and neither hard links nor
reflinks can cross into a tmpfs. Copying a small generated repository into a fresh tmpfs takes ~3 ms here
(mount ~1.7 ms + copytree ~1.2 ms for 17 files, 112 KB).

Ownership. A sandbox running as slot uid U first `adopt`s its workspace: every entry is chowned to U, and
every directory gets a default POSIX ACL granting U rwx. Files the host tools (root) create later inherit
that ACL, so U can write them without further steps, provided they are created with open()'s default mode
0666 (Path.write_text, open(path, "w")). A writer that creates files with a narrower mode (tempfile.mkstemp
uses 0600) must call `Sandbox.adopt(path)` afterwards. Root on the host reads and writes everything U makes.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path

from env.sandbox.limits import Limits
from env.sandbox.slots import is_root

_libc = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
_MS_REMOUNT = 32


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(target: Path, size_mb: int, mode: int = 0o755) -> None:
    options = f"size={size_mb}m,mode={mode:o}".encode()
    _check(_libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", 0, options), f"mount tmpfs on {target}")


def resize_tmpfs(target: Path, size_mb: int) -> None:
    options = f"size={size_mb}m".encode()
    _check(_libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", _MS_REMOUNT, options), f"resize {target}")


def unmount(target: Path) -> None:
    """Detach the mount at `target` (lazily, so a process still inside it does not block removal)."""
    _check(_libc.umount2(str(target).encode(), _MNT_DETACH), f"umount {target}")


def mount_info(path: Path) -> tuple[str, int] | None:
    """(filesystem type, size in bytes) of the mount whose mount point is exactly `path`, else None."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in reversed(lines):  # the last mount on a point is the visible one
        left, _, right = line.partition(" - ")
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), left.split()[4])  # octal escapes
        if point == target:
            fstype = right.split()[0]
            st = os.statvfs(target)
            return fstype, st.f_blocks * st.f_frsize
    return None


def can_mount() -> bool:
    return is_root()


def _default_parent() -> Path:
    suffix = "" if is_root() else f"-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"composer-workspaces{suffix}"


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _sweep_stale(parent: Path) -> None:
    """Remove workspaces left by processes that died without removing them (their tmpfs holds memory)."""
    for entry in parent.glob("ws-*-*"):
        pid = entry.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            remove_workspace(entry)


def make_workspace(repo: Path, parent: Path | None = None, *, size_mb: int | None = None) -> Path:
    """A private copy of `repo` in a new directory under `parent`, size-capped where mounting is allowed.

    size_mb: the cap (default Limits().workspace_mb); a Sandbox with other limits resizes it on open.
    Raises ValueError if the repository does not fit under the cap.
    """
    repo = Path(repo)
    if not repo.is_dir():
        raise ValueError(f"not a directory: {repo}")
    default = parent is None
    parent = ensure_traversable(_default_parent() if default else Path(parent))
    if default:
        _sweep_stale(parent)
    path = Path(tempfile.mkdtemp(prefix=f"ws-{os.getpid()}-", dir=parent))
    os.chmod(path, 0o755)
    try:
        if can_mount():
            mount_tmpfs(path, size_mb or Limits().workspace_mb)
        shutil.copytree(repo, path, symlinks=True, dirs_exist_ok=True)
        os.chmod(path, 0o755)  # copytree gives the root the repository's mode (0700 from mkdtemp)
    except OSError as e:
        remove_workspace(path)
        raise ValueError(f"cannot copy {repo} into a workspace: {e}") from e
    return path


def remove_workspace(path: Path) -> None:
    """Unmount (if it is a mount) and delete a workspace made by make_workspace."""
    path = Path(path)
    if not path.exists():
        return
    while mount_info(path) is not None:
        unmount(path)
    shutil.rmtree(path, ignore_errors=True)


def ensure_traversable(path: Path) -> Path:
    """Create `path` if needed; it and its ancestors must be searchable by others (the slot uids)."""
    path.mkdir(parents=True, exist_ok=True)
    if is_root():
        os.chmod(path, os.stat(path).st_mode | 0o755)
    return path


def reachable_by_others(path: Path) -> bool:
    """Whether an unrelated uid can traverse every ancestor of `path` (o+x on each)."""
    return untraversable(Path(os.path.realpath(path))) is None


def untraversable(path: Path) -> Path | None:
    """The first directory on the way to `path` (from / down, `path` included) that other users may not
    search (no o+x), else None."""
    path = Path(path)
    for a in [*reversed(path.parents), path]:
        if not os.stat(a).st_mode & 0o001:
            return a
    return None


def unreachable_message(path: Path, what: str) -> str:
    """Why the slot uids cannot reach `path` (a directory without o+x on the way), and what to change."""
    real = Path(os.path.realpath(path))
    blocked = untraversable(real) or real
    mode = os.stat(blocked).st_mode & 0o7777
    where = "" if str(real) == str(path) else f" (really {real})"
    return (
        f"the sandbox's uid cannot reach {what} {path}{where}: {blocked} has mode {mode:04o}, so other "
        f"users may not enter it: run `chmod o+x {blocked}`"
    )


# POSIX ACL xattr layout (linux/posix_acl_xattr.h): a u32 version, then (u16 tag, u16 perm, u32 id) entries
# sorted by tag. ACL_UNDEFINED_ID marks the entries that name no particular user or group.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED = 0xFFFFFFFF


def _acl(uid: int, mode: int) -> bytes:
    entries = [
        (_USER_OBJ, (mode >> 6) & 7, _UNDEFINED),
        (_USER, 7, uid),
        (_GROUP_OBJ, (mode >> 3) & 7, _UNDEFINED),
        (_MASK, 7, _UNDEFINED),
        (_OTHER, mode & 7, _UNDEFINED),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def adopt(path: Path, uid: int, gid: int) -> bool:
    """Give `path` (recursively) to uid/gid, with a default ACL on directories granting uid rwx.

    Returns False if the filesystem refused ACLs (ownership is still set); host tools' new files are then
    writable inside only after another adopt.
    """
    acl_ok = True

    def fix(p: str, is_dir: bool) -> None:
        nonlocal acl_ok
        os.lchown(p, uid, gid)
        if is_dir and acl_ok:
            try:
                os.setxattr(p, "system.posix_acl_default", _acl(uid, 0o755))
            except OSError:
                acl_ok = False

    root = str(path)
    if os.path.islink(root) or not os.path.isdir(root):
        os.lchown(root, uid, gid)
        return acl_ok
    fix(root, True)
    for top, dirs, files in os.walk(root):
        for name in dirs:
            full = os.path.join(top, name)
            fix(full, not os.path.islink(full))
        for name in files:
            os.lchown(os.path.join(top, name), uid, gid)
    return acl_ok


def tree_bytes(path: Path) -> int:
    """Disk blocks used under `path` in bytes (the quota check where no size-capped mount exists)."""
    total = 0
    stack = [str(path)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total


def workspace_cap_bytes(path: Path) -> int | None:
    """The size cap of a workspace that is its own tmpfs, else None."""
    info = mount_info(path)
    return info[1] if info and info[0] == "tmpfs" else None
