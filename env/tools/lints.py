"""read_lints: ruff's diagnostics in the template of docs/tools.md.

Runs `ruff check --output-format=json --isolated --select E4,E7,E9,F` (ruff's classic default rule set:
pyflakes plus the syntax-level pycodestyle errors). `--isolated` ignores any ruff configuration in the
workspace, so the diagnostics a policy sees depend only on the code. Only `.py` and `.pyi` files are linted
(ruff would parse any file named explicitly as Python); a named pipe called `*.py` is skipped (ruff would
block on it).

Severity: ERROR for what fails at import or run time (syntax errors, E9, F7 misplaced statements, F82
undefined names); WARNING for the rest (unused imports and variables, style). `(source)` is `ruff` followed by
the rule code, e.g. `(ruff F821)`; a syntax error is ERROR with ruff's code for it (`(ruff invalid-syntax)`
in ruff 0.17; older versions give none: `(ruff)`). Paths are workspace-relative;
files in path order, diagnostics by line and column. The counts in the header lines count every diagnostic.
"""

import json
import os
import re
import stat

from env.tools.binaries import find_binary, run_binary
from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.paths import resolve_path

RULES = "E4,E7,E9,F"
RUFF_TIMEOUT_S = 30.0
MAX_OUTPUT_CHARS = 20_000
_PYTHON_SUFFIXES = (".py", ".pyi")
_ERROR_PREFIXES = ("E9", "F7", "F82")
_RULE_CODE = re.compile(r"[A-Z]+[0-9]+")


def severity(code: str | None) -> str:
    """ERROR for diagnostics of code that cannot run as written, WARNING for the others."""
    if code is None or not _RULE_CODE.fullmatch(code) or code.startswith(_ERROR_PREFIXES):
        return "ERROR"
    return "WARNING"


def _without_special_files(root: str, targets: list[str]) -> list[str]:
    """`targets` (workspace-relative), where a directory holding a `.py` that is not a regular file (a named
    pipe, on which ruff would block until its timeout) is replaced by the regular Python files under it
    (hidden directories and __pycache__ left out, as ruff leaves them)."""
    out = []
    for rel in targets:
        top = os.path.join(root, rel)
        if not os.path.isdir(top):
            out.append(rel)
            continue
        regular, special = [], False
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
            for name in sorted(filenames):
                if not name.endswith(_PYTHON_SUFFIXES):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    mode = os.lstat(full).st_mode
                except OSError:  # gone since the walk listed it
                    continue
                if stat.S_ISREG(mode):
                    regular.append(os.path.relpath(full, root).replace(os.sep, "/"))
                elif not stat.S_ISLNK(mode):
                    special = True
        out += regular if special else [rel]
    return out


def read_lints(ctx: ToolContext, args: dict) -> ToolResult:
    targets = []
    for raw in args.get("paths", ["."]):
        wp = resolve_path(ctx, raw)
        if not wp.real.exists():
            raise ToolError(f"Error: path not found: {wp.rel}")
        if wp.real.is_dir() or (wp.real.is_file() and wp.real.suffix in _PYTHON_SUFFIXES):
            targets.append(wp.real_rel)
    targets = _without_special_files(ctx.real_workspace, targets)
    if not targets:
        return ToolResult("No linter errors found.")
    argv = [find_binary("ruff"), "check", "--output-format=json", "--isolated", "--no-cache", "--exit-zero"]
    argv += ["--select", RULES, "--", *targets]
    run = run_binary(argv, ctx.real_workspace, timeout=RUFF_TIMEOUT_S, max_bytes=64 << 20)
    if run.timed_out or run.truncated:
        raise ToolError(f"Error: the linter did not finish within {RUFF_TIMEOUT_S:g} s")
    try:
        diagnostics = json.loads(run.stdout or b"[]")
    except ValueError:
        message = run.stderr.decode("utf-8", errors="replace").strip()
        raise ToolError(f"Error: the linter failed: {message}") from None
    by_file: dict[str, list[tuple[int, int, str]]] = {}
    for d in diagnostics:
        rel = os.path.relpath(d["filename"], ctx.real_workspace).replace(os.sep, "/")
        code = d.get("code")
        source = f"ruff {code}" if code else "ruff"
        row, col = d["location"]["row"], d["location"]["column"]
        line = f"  [{severity(code)}] Line {row}:{col} - {d['message']} ({source})"
        by_file.setdefault(rel, []).append((row, col, line))
    if not by_file:
        return ToolResult("No linter errors found.")
    lines = [f"Found {len(diagnostics)} linter errors in {len(by_file)} files:"]
    for rel in sorted(by_file):
        entries = sorted(by_file[rel])
        lines.append(f"{rel} ({len(entries)} errors):")
        lines += [line for _, _, line in entries]
    text = "\n".join(lines)
    if len(text) > MAX_OUTPUT_CHARS:
        cut = text.rfind("\n", 0, MAX_OUTPUT_CHARS)
        hidden = text.count("\n  [", cut)
        text = text[:cut] + f"\n... at least {hidden} more linter errors not shown ..."
    return ToolResult(text)
