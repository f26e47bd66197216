"""Search tools: grep (real ripgrep), glob_file_search and list_dir.

grep prints ripgrep's own layout, sorted by path so that results are reproducible: `path:line:text` for
matching lines, `path-line-text` for context lines, `--` between non-adjacent groups when context is asked
for; files_with_matches prints one path a line, count prints `path:count`. Paths are workspace-relative. In
content mode ripgrep runs with `--null` (a NUL after each path), so that matching lines are told from context
lines without guessing where a path ends; the NUL is then replaced by the separator ripgrep prints there (a
test checks the result against ripgrep's plain output).

Caps: lines longer than 500 characters are cut by ripgrep (`--max-columns-preview`: the line's start then
`[... omitted end of long line]`); head_limit (the model's) and a cap of 20000 characters, cut at a line.
A cut result ends in one line,
    `... at least {n} more matches in at least {m} files ... (Do a more specific search if needed)` (content),
    `... at least {n} more files ... (Do a more specific search if needed)` (files_with_matches, count):
"at least" because ripgrep is stopped after 4 MiB of output or 10 s, so the true totals may be larger.
No match: `No matches found`.

ripgrep's defaults apply: hidden files, binary files and what .gitignore excludes are skipped, symbolic links
are not followed (so a link cannot lead the search out of the workspace).
"""

import fnmatch
import os

from env.tools.binaries import find_binary, run_binary
from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.paths import resolve_path

MAX_OUTPUT_CHARS = 20_000
RG_TIMEOUT_S = 10.0
RG_MAX_BYTES = 4 << 20
MAX_LINE_CHARS = 500  # longer lines (minified code, data) are cut by ripgrep with a note
GLOB_MAX_FILES = 100
LIST_MAX_CHARS = 10_000
MORE_HINT = "(Do a more specific search if needed)"


def split_rg_lines(stdout: bytes) -> list[tuple[str, str, bool]]:
    """ripgrep's `--null` content output as its normal lines: (line, path, is_match); `--` has path "".

    With `--null` each line is `path\\0{n}:text` (match) or `path\\0{n}-text` (context), so the path is
    found without guessing where it ends; the NUL is then replaced by the separator ripgrep prints there.
    """
    text = stdout.decode("utf-8", errors="replace")
    raw_lines = text.split("\n")[:-1]  # drops what follows the last newline: "" or a line cut in the middle
    lines = []
    for raw in raw_lines:
        path, nul, rest = raw.partition("\0")
        if not nul:
            lines.append((raw, "", False))  # `--` between groups
            continue
        digits = len(rest) - len(rest.lstrip("0123456789"))
        sep = rest[digits : digits + 1]
        lines.append((f"{path}{sep}{rest}", path, sep == ":"))
    return lines


def _cut(lines: list[str], head_limit: int | None) -> int:
    """How many of `lines` fit in head_limit lines and MAX_OUTPUT_CHARS characters."""
    n = len(lines) if head_limit is None else min(len(lines), head_limit)
    total = 0
    for i in range(n):
        total += len(lines[i]) + 1
        if total > MAX_OUTPUT_CHARS:
            return i
    return n


def _no_nul(args: dict, names: tuple[str, ...]) -> None:
    """ripgrep takes its arguments as C strings: a NUL byte in one cannot be passed, so it is an error."""
    for name in names:
        if "\x00" in args.get(name, ""):
            raise ToolError(f"Error: argument '{name}' must not contain a NUL character")


def grep(ctx: ToolContext, args: dict) -> ToolResult:
    _no_nul(args, ("pattern", "glob", "type"))
    wp = resolve_path(ctx, args.get("path", "."))
    if not wp.real.exists():
        raise ToolError(f"Error: path not found: {wp.rel}")
    if not (wp.real.is_dir() or wp.real.is_file()):  # a pipe would block ripgrep until its timeout
        raise ToolError(f"Error: {wp.rel} is not a regular file or directory")
    mode = args.get("output_mode", "content")
    argv = [find_binary("rg"), "--no-config", "--color=never", "--sort=path", "--no-messages"]
    if args.get("-i", False):
        argv.append("-i")
    if args.get("multiline", False):
        argv += ["-U", "--multiline-dotall"]
    if "type" in args:
        argv += ["--type", args["type"]]
    if "glob" in args:
        argv += ["--glob", args["glob"]]
    context = {flag: args[flag] for flag in ("-A", "-B", "-C") if flag in args}
    if mode == "content":
        argv += ["--no-heading", "--with-filename", "--line-number", "--null"]
        argv += [f"--max-columns={MAX_LINE_CHARS}", "--max-columns-preview"]
        for flag, n in context.items():
            argv += [flag, str(n)]
    elif mode == "files_with_matches":
        argv.append("-l")
    else:
        argv += ["-c", "-H"]
    argv += ["-e", args["pattern"]]
    if wp.rel != ".":  # with no path (and stdin not a pipe) ripgrep searches its cwd without a `./` prefix
        argv += ["--", wp.rel]
    run = run_binary(argv, ctx.real_workspace, timeout=RG_TIMEOUT_S, max_bytes=RG_MAX_BYTES)
    if run.returncode == 2 and not run.stdout:
        message = run.stderr.decode("utf-8", errors="replace").strip()
        raise ToolError(f"Error: ripgrep failed: {message}")
    head_limit = args.get("head_limit")
    if mode == "content":
        rendered = split_rg_lines(run.stdout)
        if not any(is_match for _, _, is_match in rendered):
            return _no_match(run)
        texts = [line for line, _, _ in rendered]
        shown = _cut(texts, head_limit)
        while shown > 0 and texts[shown - 1] == "--":
            shown -= 1
        hidden = [(path, is_match) for _, path, is_match in rendered[shown:] if is_match]
        body = "\n".join(texts[:shown])
        if hidden or run.truncated or run.timed_out:
            files = len({path for path, _ in hidden})
            body += f"\n... at least {len(hidden)} more matches in at least {files} files ... {MORE_HINT}"
    else:
        texts = run.stdout.decode("utf-8", errors="replace").splitlines()
        if run.truncated and texts:
            texts.pop()  # possibly cut in the middle
        if not texts:
            return _no_match(run)
        shown = _cut(texts, head_limit)
        body = "\n".join(texts[:shown])
        if shown < len(texts) or run.truncated or run.timed_out:
            body += f"\n... at least {len(texts) - shown} more files ... {MORE_HINT}"
    if run.timed_out:
        body += f"\n... ripgrep stopped after {RG_TIMEOUT_S:g} s; the results are incomplete ..."
    return ToolResult(body)


def _no_match(run) -> ToolResult:
    if run.timed_out:
        return ToolResult(
            f"No matches found (ripgrep stopped after {RG_TIMEOUT_S:g} s; the search is incomplete)",
            found_nothing=True,
        )
    return ToolResult("No matches found", found_nothing=True)


def _directory(ctx: ToolContext, raw: str):
    wp = resolve_path(ctx, raw)
    if not wp.real.exists():
        raise ToolError(f"Error: Directory not found: {wp.display}")
    if not wp.real.is_dir():
        raise ToolError(f"Error: {wp.display} is not a directory")
    return wp


def glob_file_search(ctx: ToolContext, args: dict) -> ToolResult:
    _no_nul(args, ("glob_pattern",))
    wp = _directory(ctx, args.get("target_directory", "."))
    pattern = args["glob_pattern"]
    if not pattern.startswith("**/"):
        pattern = "**/" + pattern
    argv = [find_binary("rg"), "--no-config", "--files", "--no-messages", "--glob", pattern]
    run = run_binary(argv, str(wp.real), timeout=RG_TIMEOUT_S, max_bytes=RG_MAX_BYTES)
    if run.returncode == 2 and not run.stdout:
        message = run.stderr.decode("utf-8", errors="replace").strip()
        raise ToolError(f"Error: invalid glob pattern: {message}")
    paths = run.stdout.decode("utf-8", errors="replace").splitlines()
    if run.truncated and paths:
        paths.pop()
    if not any(part.startswith(".") for part in pattern.split("/")):
        # ripgrep lets a --glob override its hiding of dot-files; hide them unless the pattern names one
        paths = [p for p in paths if not any(part.startswith(".") for part in p.split("/"))]
    if not paths:
        return ToolResult(f"Result of search in '{wp.display}': 0 files found")

    def newest_first(rel: str) -> tuple[int, str]:
        try:
            return -os.stat(os.path.join(wp.real, rel)).st_mtime_ns, rel
        except OSError:
            return 0, rel

    paths.sort(key=newest_first)
    lines = [f"Result of search in '{wp.display}' (total {len(paths)} files):"]
    lines += [f"- {p}" for p in paths[:GLOB_MAX_FILES]]
    if len(paths) > GLOB_MAX_FILES or run.truncated or run.timed_out:
        lines.append(
            f"... at least {len(paths) - min(len(paths), GLOB_MAX_FILES)} more files ... {MORE_HINT}"
        )
    return ToolResult("\n".join(lines))


def _scan(path: str, rel: str, ignore: list[str]) -> list[tuple[str, str, bool]]:
    """Visible children of `path` as (name, rel path, is_dir), directories first, each group by name."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return []
    children = []
    for entry in entries:
        child_rel = entry.name if rel == "." else f"{rel}/{entry.name}"
        if entry.name.startswith("."):
            continue
        if any(fnmatch.fnmatchcase(entry.name, g) or fnmatch.fnmatchcase(child_rel, g) for g in ignore):
            continue
        children.append((entry.name, child_rel, entry.is_dir(follow_symlinks=False)))
    children.sort(key=lambda c: (not c[2], c[0]))
    return children


def list_dir(ctx: ToolContext, args: dict) -> ToolResult:
    """A tree under the directory, breadth-first until ~LIST_MAX_CHARS characters: deeper levels are then
    left out whole (a note says so), so that the top of a large tree is always shown."""
    wp = _directory(ctx, args["target_directory"])
    ignore = args.get("ignore_globs", [])
    children: dict[str, list[tuple[str, str, bool]]] = {}
    frontier, depth, total, complete = ["."], 1, 0, True
    while frontier:
        level: dict[str, list] = {}
        for rel in frontier:
            level[rel] = _scan(os.path.join(wp.real, rel), rel, ignore)
        size = sum(2 * depth + 2 + len(name) + 1 for kids in level.values() for name, _, _ in kids)
        if total + size > LIST_MAX_CHARS and depth > 1:
            complete = False
            break
        children.update(level)
        total += size
        frontier = [child for kids in level.values() for _, child, is_dir in kids if is_dir]
        depth += 1
    if not children["."]:
        return ToolResult("... no children found ...")
    lines = [f"- {wp.display.rstrip('/')}/"]

    def walk(rel: str, indent: int) -> None:
        for name, child, is_dir in children.get(rel, []):
            lines.append(f"{'  ' * indent}- {name}{'/' if is_dir else ''}")
            if is_dir:
                walk(child, indent + 1)

    walk(".", 1)
    text = "\n".join(lines)
    if len(text) > LIST_MAX_CHARS:
        text = text[: text.rfind("\n", 0, LIST_MAX_CHARS)]
        complete = False
    if not complete:
        text += (
            "\n\nNote: the directory is too large to list in full; deeper entries are not shown. "
            "List a subdirectory or use glob_file_search to see more."
        )
    return ToolResult(text)
