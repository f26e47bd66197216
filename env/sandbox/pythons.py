"""The Python installations sandboxed commands run: the project's own, or a task's venv (`python_env`).

A venv (`python -m venv DIR`) holds bin/python, a link to its base interpreter, and pyvenv.cfg, whose `home`
names the base interpreter's bin directory. Commands see the venv and its base prefix read-only at their own
host paths (the links and `home` name those paths), with the venv's bin/ first on PATH and VIRTUAL_ENV set,
so `python` and `pytest` are the venv's; the project's bin directories follow on PATH.

Routes. Slot uids are unprivileged, and an installation under a directory they cannot traverse (the
project's Python under /root, mode 700; a venv cache under ~/.cache) is bound read-only once per host at a
path they can reach under the sandbox state directory (`host_bind`); bwrap and the unshare helper bind that
route back at the installation's own path. Without namespaces ('none') commands use the route itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import os
import sys
from pathlib import Path

from env.sandbox.slots import ensure_dir, is_root, state_root
from env.sandbox.workspace import mount_info, reachable_by_others, unmount

# Bound or visible as a whole at every level, so an installation inside needs no bind of its own.
SYSTEM_PREFIXES = ("/usr",)

_MS_BIND, _MS_REMOUNT, _MS_RDONLY = 4096, 32, 1
_libc = ctypes.CDLL(None, use_errno=True)


def python_prefixes() -> list[str]:
    """The project's Python installation(s): the interpreter's prefix and, for a venv, its base."""
    return list(dict.fromkeys([sys.base_prefix, sys.prefix]))


def under(path: str, top: str) -> bool:
    """Whether `path` is `top` or lies below it (plain string paths, no resolution)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def venv_base_prefixes(venv: Path) -> list[str]:
    """The base interpreter prefix(es) a venv points to: the parent of pyvenv.cfg's `home`, and that of
    the target of bin/python where it differs. Raises ValueError when `venv` is not a venv."""
    cfg = venv / "pyvenv.cfg"
    if not (venv / "bin" / "python").exists() or not cfg.is_file():
        raise ValueError(f"python_env {venv} is not a venv: it needs bin/python and pyvenv.cfg")
    home = None
    for line in cfg.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip().lower() == "home":
            home = value.strip()
    if not home or not os.path.isabs(home):
        raise ValueError(f"python_env {venv}: pyvenv.cfg names no absolute `home` (the base bin directory)")
    target = os.path.realpath(venv / "bin" / "python")
    return list(dict.fromkeys([os.path.dirname(home.rstrip("/")), os.path.dirname(os.path.dirname(target))]))


def _needs_bind(prefix: str) -> bool:
    return prefix != "/" and not any(under(prefix, top) for top in SYSTEM_PREFIXES)


@dataclasses.dataclass(frozen=True)
class Pythons:
    """What commands need of Python: `paths` to see at their own host paths (outermost only), `bins` for
    PATH in order, and the venv (None: the project's interpreter)."""

    paths: tuple[str, ...]
    bins: tuple[str, ...]
    venv: str | None = None


def pythons(python_env: Path | str | None = None) -> Pythons:
    """The installations a sandbox's commands use: the project's, plus the venv `python_env` first."""
    own = python_prefixes()
    bins = [f"{p}/bin" for p in reversed(own)]
    paths = list(own)
    venv = None
    if python_env is not None:
        venv_path = Path(python_env).resolve()
        if not venv_path.is_dir():
            raise ValueError(f"python_env is not a directory: {python_env}")
        venv = str(venv_path)
        bins.insert(0, f"{venv}/bin")
        paths = [venv, *venv_base_prefixes(venv_path), *paths]
    paths = [p for p in dict.fromkeys(paths) if _needs_bind(p)]
    outer = [p for p in paths if not any(q != p and under(p, q) for q in paths)]
    return Pythons(tuple(outer), tuple(bins), venv)


def needs_route(path: str) -> bool:
    """Whether the slot uids cannot reach `path` themselves (only when running as root)."""
    return is_root() and not reachable_by_others(path)


def host_bind(prefix: str) -> str:
    """A read-only bind of `prefix` at a path every slot uid can traverse, created once per host.

    bwrap and the unshare helper resolve a bind's source as the unprivileged slot uid, so a Python under
    /root (mode 700) is not reachable directly. The bind lives under the sandbox state directory; it
    exposes nothing that was not already world-readable, only the route to it.
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


def remove_host_bind(prefix: str) -> None:
    """Undo host_bind(prefix), e.g. before its installation is deleted."""
    target = state_root() / "prefix" / prefix.strip("/").replace("/", "_")
    while mount_info(target) is not None:
        unmount(target)
    with contextlib.suppress(OSError):
        target.rmdir()


def _route(path: str) -> str:
    return host_bind(path) if needs_route(path) else os.path.realpath(path)


@functools.cache
def _project_routes() -> tuple[tuple[str, str], ...]:
    return tuple((_route(p), p) for p in python_prefixes())


def binds(paths: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(host source, path inside) for each installation; inside, it keeps its own path."""
    project = dict((inside, source) for source, inside in _project_routes())
    return tuple((project.get(p) or _route(p), p) for p in paths)
