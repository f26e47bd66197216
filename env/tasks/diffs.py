"""Unified diffs in `git diff` form: made from file texts, read back, and applied without git.

The gold `patch` and the `test_patch` of a task are such diffs (paths prefixed `a/` and `b/`, new files from
`/dev/null`), so `git apply` and `patch -p1` accept them too. Applying here needs no git and no subprocess,
and it never follows a symbolic link out of the tree it patches.
"""

import dataclasses
import difflib
import os
import re
from pathlib import Path


class PatchError(ValueError):
    """A patch that cannot be read or does not apply; the message names the file and hunk."""


@dataclasses.dataclass
class FilePatch:
    old_path: str | None  # None: a new file
    new_path: str | None  # None: a deleted file
    hunks: list[tuple[int, list[str]]]  # (old start line, body lines with their ' ', '-', '+' prefix)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path


def make_diff(path: str, old: str | None, new: str | None, context: int = 3) -> str:
    """The diff from `old` to `new` (None: absent) of the file at repository-relative `path`."""
    a = [] if old is None else old.splitlines(keepends=True)
    b = [] if new is None else new.splitlines(keepends=True)
    for lines in (a, b):
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n\\ No newline at end of file\n"
    head = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        head.append("new file mode 100644\n")
    elif new is None:
        head.append("deleted file mode 100644\n")
    body = list(
        difflib.unified_diff(
            a,
            b,
            "/dev/null" if old is None else f"a/{path}",
            "/dev/null" if new is None else f"b/{path}",
            n=context,
        )
    )
    if not body:
        return ""
    return "".join(head + body)


def make_tree_diff(old: dict[str, str], new: dict[str, str]) -> str:
    """The diff between two trees given as {relative path: text}, files in path order."""
    paths = sorted(set(old) | set(new))
    return "".join(make_diff(p, old.get(p), new.get(p)) for p in paths if old.get(p) != new.get(p))


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(patch: str) -> list[FilePatch]:
    """The files of a unified diff with their hunks."""
    lines = patch.splitlines(keepends=True)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip(line[4:]), _strip(lines[i + 1][4:])
            current = FilePatch(old, new, [])
            files.append(current)
            i += 2
            while i < len(lines) and (m := _HUNK.match(lines[i])):
                n_old = int(m.group(2)) if m.group(2) is not None else 1
                n_new = int(m.group(4)) if m.group(4) is not None else 1
                i += 1
                body = []
                while (n_old > 0 or n_new > 0) and i < len(lines):
                    tag = lines[i][:1]
                    if tag == "\\":
                        body[-1] = body[-1].rstrip("\n")
                        i += 1
                        continue
                    if tag not in (" ", "-", "+", "\n"):
                        raise PatchError(f"{current.path}: malformed hunk line {lines[i]!r}")
                    text = lines[i] if tag != "\n" else " \n"  # an empty context line may lose its space
                    body.append(text)
                    n_old -= text[0] in " -"
                    n_new -= text[0] in " +"
                    i += 1
                while i < len(lines) and lines[i].startswith("\\"):
                    body[-1] = body[-1].rstrip("\n")
                    i += 1
                if n_old or n_new:
                    raise PatchError(f"{current.path}: hunk at line {m.group(1)} is truncated")
                current.hunks.append((int(m.group(1)), body))
            continue
        i += 1
    return files


def _strip(name: str) -> str | None:
    name = name.rstrip("\n").split("\t")[0]
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def patch_paths(patch: str) -> list[str]:
    """Repository-relative paths a patch touches, in patch order."""
    return [f.path for f in parse_patch(patch)]


def apply_patch(root: Path, patch: str) -> list[str]:
    """Applies `patch` to the tree at `root`; returns the paths it touched. All or nothing per file.

    Refuses paths that leave `root` (absolute, `..`, or through a symbolic link). A file is replaced by
    unlinking and recreating it, so a hard link to it elsewhere keeps its old content.
    """
    root = Path(root)
    touched = []
    for fp in parse_patch(patch):
        target = safe_path(root, fp.path)
        if fp.old_path is None:
            old_lines: list[str] = []
            if os.path.lexists(target):
                raise PatchError(f"{fp.path}: new file already exists")
        else:
            if not target.is_file() or target.is_symlink():
                raise PatchError(f"{fp.path}: no such file to patch")
            old_lines = target.read_text().splitlines(keepends=True)
        new_lines = _apply_hunks(fp, old_lines)
        if fp.new_path is None:
            target.unlink()
        else:
            write_file(root, fp.path, "".join(new_lines))
        touched.append(fp.path)
    return touched


def _apply_hunks(fp: FilePatch, lines: list[str]) -> list[str]:
    out = list(lines)
    shift = 0
    for start, body in fp.hunks:
        old = [b[1:] for b in body if b[0] in " -"]
        new = [b[1:] for b in body if b[0] in " +"]
        at = max(start - 1 + shift, 0) if old else start + shift
        if out[at : at + len(old)] != old:
            # The hunk moved (earlier hunks or an edited file): take the nearest exact match.
            matches = [j for j in range(len(out) - len(old) + 1) if out[j : j + len(old)] == old]
            if not matches:
                raise PatchError(f"{fp.path}: hunk at line {start} does not apply")
            at = min(matches, key=lambda j: abs(j - at))
        out[at : at + len(old)] = new
        shift += len(new) - len(old)
    return out


def safe_path(root: Path, rel: str) -> Path:
    """`root / rel` after checking that `rel` stays inside `root` and crosses no symbolic link."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise PatchError(f"{rel}: path leaves the tree")
    cur = Path(root)
    for part in parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise PatchError(f"{rel}: path goes through a symbolic link")
    return cur / parts[-1]


def write_file(root: Path, rel: str, text: str | bytes) -> None:
    """Writes `root/rel` as a fresh file: symbolic links and non-directories on the way are removed first,
    an existing entry is unlinked (never written through), missing directories are created."""
    cur = Path(root)
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise PatchError(f"{rel}: path leaves the tree")
    for part in parts[:-1]:
        cur = cur / part
        if cur.is_symlink() or (os.path.lexists(cur) and not cur.is_dir()):
            cur.unlink()
        cur.mkdir(exist_ok=True)
    target = cur / parts[-1]
    remove_entry(target)
    if isinstance(text, bytes):
        target.write_bytes(text)
    else:
        target.write_text(text)


def remove_entry(path: Path) -> None:
    """Removes a file, symbolic link or directory tree at `path`, never following links."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        for child in path.iterdir():
            remove_entry(child)
        path.rmdir()
