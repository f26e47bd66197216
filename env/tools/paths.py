"""Workspace path resolution: what a model-given path means on the host, and refusing escapes.

The model sees the workspace at `ctx.display_root` (`/workspace`). A tool accepts a path relative to the
workspace (`pkg/mod.py`, `./pkg/../pkg/mod.py`) or absolute under the display root (`/workspace/pkg/mod.py`).
Refused, as an error result: `..` that climbs out, an absolute path anywhere else, a path whose symbolic
links resolve outside the workspace, an empty path, a NUL character, a path too long for the file system,
a loop of symbolic links.

How paths appear in results (every tool follows this):
- a file is named by its workspace-relative path, normalised (`pkg/mod.py`), whatever form the model used;
  grep and ripgrep's own output use the same form;
- a directory a result is "about" (glob_file_search's `'{dir}'`, list_dir's tree root) is shown absolute,
  as the model sees it (`/workspace/pkg`), and the files under it relative to it.
"""

import dataclasses
import os
import posixpath
from pathlib import Path

from env.tools.context import ToolContext, ToolError

# Linux's NAME_MAX and (less room for the workspace's own path) PATH_MAX.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 3072


class PathError(ToolError):
    """A path that is empty, malformed or outside the workspace."""


@dataclasses.dataclass(frozen=True)
class WorkspacePath:
    """A resolved path.

    host: the host path, symbolic links not followed (delete_file removes a link, not its target).
    real: the host path with every link resolved (known to be inside the workspace).
    rel: workspace-relative, normalised, POSIX separators; "." for the workspace itself.
    display: the absolute path the model sees (`/workspace/rel`).
    real_rel: workspace-relative path of `real` (where an edit through a link actually lands).
    """

    host: Path
    real: Path
    rel: str
    display: str
    real_rel: str


def display_path(ctx: ToolContext, rel: str) -> str:
    """The absolute path the model sees for a workspace-relative `rel`."""
    if rel == ".":
        return ctx.display_root
    return ctx.display_root.rstrip("/") + "/" + rel


def _check_length(raw: str, path: str) -> None:
    """Refuses a path the file system would refuse as too long (ENAMETOOLONG), before any call makes it."""
    try:
        encoded = os.fsencode(path)
    except UnicodeEncodeError:
        raise PathError(f"Error: invalid path {raw!r} (not valid Unicode text)") from None
    if len(encoded) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        shown = raw if len(raw) <= 80 else raw[:80] + "..."
        raise PathError(
            f"Error: path {shown!r} is too long (at most {MAX_NAME_BYTES} bytes a name, "
            f"{MAX_PATH_BYTES} in all)"
        )


def resolve_path(ctx: ToolContext, raw: str) -> WorkspacePath:
    """Resolves a model-given path; raises PathError when it is empty or escapes the workspace."""
    path = raw.strip()
    if not path:
        raise PathError("Error: empty path")
    if "\x00" in path:
        raise PathError(f"Error: invalid path {raw!r} (contains a NUL character)")
    _check_length(raw, path)
    root = ctx.display_root
    if path.startswith("/"):
        path = posixpath.normpath("/" + path.lstrip("/"))
        if path == root:
            rel = "."
        elif path.startswith(root.rstrip("/") + "/"):
            rel = path[len(root.rstrip("/")) + 1 :]
        else:
            raise PathError(f"Error: path '{raw}' is outside the workspace ({root})")
    else:
        rel = posixpath.normpath(path)
    if rel == ".." or rel.startswith("../"):
        raise PathError(f"Error: path '{raw}' is outside the workspace ({root})")
    host = Path(ctx.workspace) if rel == "." else Path(ctx.workspace, rel)
    real = os.path.realpath(host)
    if os.path.islink(real):  # realpath stops at a link only when the links loop
        raise PathError(f"Error: path '{raw}' is a loop of symbolic links")
    ws = ctx.real_workspace
    if real != ws and not real.startswith(ws.rstrip(os.sep) + os.sep):
        raise PathError(
            f"Error: path '{raw}' resolves outside the workspace ({root}) through a symbolic link"
        )
    real_rel = "." if real == ws else os.path.relpath(real, ws).replace(os.sep, "/")
    return WorkspacePath(
        host=host, real=Path(real), rel=rel, display=display_path(ctx, rel), real_rel=real_rel
    )
