"""File tools: read_file, write, search_replace, delete_file (templates of docs/tools.md).

Lines are numbered `f"{n:>6}|{text}"`; a partial view is framed by `... {k} lines not shown ...` on each
side where lines are hidden. Files are read as UTF-8 (undecodable bytes shown as U+FFFD by read_file; the
editing tools refuse such files rather than corrupt them). A line is what ends in "\\n"; a trailing "\\r" is
not shown.

Writes are atomic on the host (a temporary file in the same directory, then `os.replace`), keep the file's
mode and owner, and give a new file its directory's owner: the sandbox may run commands as a dedicated uid
that must still be able to change what the tools wrote. Replacing the inode also never writes through a hard
link into the task's original repository.
"""

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.paths import WorkspacePath, resolve_path

MAX_READ_CHARS = 100_000
SNIPPET_CONTEXT = 4  # lines shown on each side of an edit
SNIPPET_MAX_LINES = 60


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_NEW_FILE_MODE = 0o666 & ~_current_umask()
_NEW_DIR_MODE = 0o777 & ~_current_umask()


def split_lines(text: str) -> list[str]:
    """The lines of `text` as an editor numbers them (no final empty line after a trailing newline)."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def number_lines(lines: list[str], first: int) -> str:
    """`lines` numbered from `first` (1-based), one `{n:>6}|{text}` per line."""
    return "\n".join(f"{n:>6}|{line}" for n, line in enumerate(lines, first))


def frame_lines(lines: list[str], start: int, end: int) -> str:
    """Lines [start, end) (0-based) numbered, framed by `... k lines not shown ...` where lines are hidden."""
    parts = []
    if start > 0:
        parts.append(f"... {start} lines not shown ...")
    parts.append(number_lines(lines[start:end], start + 1))
    if end < len(lines):
        parts.append(f"... {len(lines) - end} lines not shown ...")
    return "\n".join(parts)


def _existing_file(ctx: ToolContext, raw: str) -> WorkspacePath:
    wp = resolve_path(ctx, raw)
    if not wp.real.exists():
        raise ToolError("Error: File not found")
    if wp.real.is_dir():
        raise ToolError(f"Error: {wp.rel} is a directory, not a file")
    if not wp.real.is_file():  # a pipe or socket: reading it would block or fail
        raise ToolError(f"Error: {wp.rel} is not a regular file")
    return wp


def _read_bytes(wp: WorkspacePath) -> bytes:
    try:
        return wp.real.read_bytes()
    except PermissionError:
        raise ToolError(f"Error: Permission denied: {wp.rel}") from None


def read_file(ctx: ToolContext, args: dict) -> ToolResult:
    wp = _existing_file(ctx, args["target_file"])
    data = _read_bytes(wp)
    if not data:
        return ToolResult("File is empty.")
    if b"\x00" in data[:8192]:
        raise ToolError(f"Error: {wp.rel} is a binary file ({len(data)} bytes) and cannot be shown as text")
    lines = split_lines(data.decode("utf-8", errors="replace"))
    start = max(args.get("offset", 1), 1) - 1
    if start >= len(lines):
        raise ToolError(f"Error: offset {start + 1} is beyond the end of the file ({len(lines)} lines)")
    end = len(lines) if "limit" not in args else min(len(lines), start + args["limit"])
    n_chars = sum(len(line) + 1 for line in lines[start:end])
    if n_chars > MAX_READ_CHARS:
        return ToolResult(
            f"File content ({n_chars} characters) exceeds maximum allowed characters ({MAX_READ_CHARS} "
            "characters). Read a part of it with offset and limit, or search it with grep."
        )
    return ToolResult(frame_lines(lines, start, end))


def _makedirs(path: Path) -> None:
    """Creates missing directories, each owned like its parent."""
    if path.is_dir():
        return
    _makedirs(path.parent)
    os.mkdir(path, _NEW_DIR_MODE)
    parent = os.stat(path.parent)
    if os.geteuid() == 0 and (parent.st_uid, parent.st_gid) != (0, 0):
        os.chown(path, parent.st_uid, parent.st_gid)


def write_atomic(path: Path, data: bytes) -> None:
    """Replaces `path` with `data` atomically, keeping its mode and owner (new: its directory's owner)."""
    try:
        st = os.stat(path)
        mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    except FileNotFoundError:
        parent = os.stat(path.parent)
        mode, uid, gid = _NEW_FILE_MODE, parent.st_uid, parent.st_gid
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        if os.geteuid() == 0 and (uid, gid) != (0, 0):
            os.chown(tmp, uid, gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _snippet(text: str, first_line: int, last_line: int) -> str:
    """Numbered lines around lines [first_line, last_line] (0-based) of `text`, read_file style."""
    lines = split_lines(text)
    if not lines:
        return "File is empty."
    start = max(0, first_line - SNIPPET_CONTEXT)
    end = min(len(lines), last_line + 1 + SNIPPET_CONTEXT, start + SNIPPET_MAX_LINES)
    return frame_lines(lines, start, end)


def _updated(rel: str, snippet: str) -> ToolResult:
    return ToolResult(
        f"The file {rel} has been updated. Here's a relevant snippet of the edited file:\n\n{snippet}"
    )


def _write_checked(ctx: ToolContext, wp: WorkspacePath, data: bytes) -> None:
    try:
        _makedirs(wp.real.parent)
        write_atomic(wp.real, data)
    except PermissionError:
        raise ToolError(f"Error: Permission denied: {wp.rel}") from None
    except (NotADirectoryError, FileExistsError):  # FileExistsError: mkdir where a file is
        raise ToolError(f"Error: a parent of {wp.rel} is not a directory") from None
    ctx.record_edit(wp.real_rel)


def write(ctx: ToolContext, args: dict) -> ToolResult:
    wp = resolve_path(ctx, args["file_path"])
    if wp.real.is_dir():
        raise ToolError(f"Error: {wp.rel} is a directory, not a file")
    contents = args["contents"]
    with ctx.edit_lock:
        _write_checked(ctx, wp, contents.encode("utf-8"))
    return _updated(wp.rel, _snippet(contents, 0, SNIPPET_MAX_LINES))


def search_replace(ctx: ToolContext, args: dict) -> ToolResult:
    old, new = args["old_string"], args["new_string"]
    if old == new:
        raise ToolError("Error: new_string must differ from old_string")
    if not old:
        raise ToolError("Error: old_string must not be empty")
    with ctx.edit_lock:
        wp = _existing_file(ctx, args["file_path"])
        try:
            text = _read_bytes(wp).decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"Error: {wp.rel} is not a UTF-8 text file") from None
        positions = []  # offsets in `text` of the non-overlapping occurrences, left to right
        i = text.find(old)
        while i != -1:
            positions.append(i)
            i = text.find(old, i + len(old))
        if not positions:
            raise ToolError(
                f"Error: old_string not found in {wp.rel}. It must match the file exactly, whitespace and "
                "indentation included: read the file again."
            )
        replace_all = args.get("replace_all", False)
        if len(positions) > 1 and not replace_all:
            raise ToolError(
                f"Error: old_string occurs {len(positions)} times in {wp.rel}. Include more surrounding "
                "lines to make it unique, or set replace_all to true to replace every occurrence."
            )
        new_text = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        _write_checked(ctx, wp, new_text.encode("utf-8"))
    first = positions[0]
    last = positions[-1] + (len(positions) - 1) * (len(new) - len(old))  # the last one's offset in new_text
    first_line = new_text.count("\n", 0, first)
    last_line = new_text.count("\n", 0, last + len(new.rstrip("\n")))
    return _updated(wp.rel, _snippet(new_text, first_line, last_line))


def delete_file(ctx: ToolContext, args: dict) -> ToolResult:
    wp = resolve_path(ctx, args["target_file"])
    with ctx.edit_lock:
        if not os.path.lexists(wp.host):
            return ToolResult(f"File not found: {wp.rel}", is_error=True)
        if wp.host.is_dir() and not wp.host.is_symlink():
            raise ToolError(f"Error: {wp.rel} is a directory; delete_file deletes files only")
        is_link = wp.host.is_symlink()
        try:
            size = os.lstat(wp.host).st_size
            os.unlink(wp.host)
        except PermissionError:
            return ToolResult(f"Permission denied: {wp.rel}", is_error=True)
    ctx.record_edit(wp.rel if is_link else wp.real_rel)
    return ToolResult(f"Successfully deleted file: {wp.rel} ({size} bytes)")
