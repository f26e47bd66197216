"""The tools' JSON schemas (for the system prompt) and the validation of call arguments against them.

Names and argument schemas follow docs/tools.md. The descriptions are ours. Validation is strict: a
missing required argument, an argument of the wrong JSON type (an integer is not a boolean, "10" is not an
integer), a string that is not valid Unicode text (a lone surrogate), a value outside its enum or range,
and an argument the tool does not have are each an error result naming the argument.
"""

import copy
from collections.abc import Iterable, Sequence
from typing import Any

# The tools that only look at the workspace, and those that change it (behaviour metrics: search before edit).
READ_TOOLS = frozenset({"read_file", "grep", "codebase_search", "glob_file_search", "list_dir"})
EDIT_TOOLS = frozenset({"search_replace", "write", "delete_file"})


def first_edit_after_read(turn_calls: Sequence[Iterable[str]]) -> bool | None:
    """Whether a read or search ran in a turn before the turn of the first edit (None: no edit at all).

    `turn_calls` holds the tool names of each turn's calls, in order. Calls of one turn run in parallel, so a
    read in the same turn as the first edit does not count as before it.
    """
    for i, names in enumerate(turn_calls):
        if any(n in EDIT_TOOLS for n in names):
            return any(n in READ_TOOLS for earlier in turn_calls[:i] for n in earlier)
    return None


def _obj(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _str(description: str, **extra) -> dict:
    return {"type": "string", "description": description, **extra}


def _int(description: str, minimum: int) -> dict:
    return {"type": "integer", "description": description, "minimum": minimum}


def _bool(description: str) -> dict:
    return {"type": "boolean", "description": description}


def _strs(description: str) -> dict:
    return {"type": "array", "items": {"type": "string"}, "description": description}


_EXPLANATION = _str("One sentence on why this call is made and how it serves the goal.")

_TODO_ITEM = _obj(
    {
        "id": _str("A unique identifier of the item."),
        "content": _str("What the item is about."),
        "status": _str("The item's state.", enum=["pending", "in_progress", "completed", "cancelled"]),
    },
    ["id", "content", "status"],
)

_SPECS: list[tuple[str, str, dict]] = [
    (
        "read_file",
        "Read a file of the workspace. Lines come back numbered as `{n:>6}|{text}`. Without offset and "
        "limit the whole file is read; for long files give offset (1-based first line) and limit (a number "
        "of lines).",
        _obj(
            {
                "target_file": _str("The file, relative to the workspace or absolute under /workspace."),
                "offset": _int("First line to read, 1-based (0 reads from the start).", 0),
                "limit": _int("How many lines to read.", 1),
            },
            ["target_file"],
        ),
    ),
    (
        "search_replace",
        "Replace an exact string in a file. old_string must occur exactly once (add surrounding lines to "
        "make it unique) unless replace_all is true; new_string must differ from it. Read the file first.",
        _obj(
            {
                "file_path": _str(
                    "The file to edit, relative to the workspace or absolute under /workspace."
                ),
                "old_string": _str("The exact text to replace, whitespace and indentation included."),
                "new_string": _str("The text to put in its place."),
                "replace_all": _bool("Replace every occurrence of old_string (default false)."),
            },
            ["file_path", "old_string", "new_string"],
        ),
    ),
    (
        "write",
        "Write a file, creating it (and its directories) or overwriting it entirely.",
        _obj(
            {
                "file_path": _str(
                    "The file to write, relative to the workspace or absolute under /workspace."
                ),
                "contents": _str("The complete new contents of the file."),
            },
            ["file_path", "contents"],
        ),
    ),
    (
        "grep",
        "Search file contents with ripgrep (Rust regex syntax). Prefer it for exact symbols and strings. "
        "Results are ripgrep's lines `path:line:text` (context lines `path-line-text`); large results are "
        "cut.",
        _obj(
            {
                "pattern": _str("The regular expression to search for."),
                "path": _str("File or directory to search (default: the whole workspace)."),
                "glob": _str("Only search files matching this glob, e.g. `*.py` or `src/**/*.ts`."),
                "output_mode": _str(
                    "content: matching lines (default); files_with_matches: file paths; count: matching "
                    "lines per file.",
                    enum=["content", "files_with_matches", "count"],
                ),
                "-A": _int("Lines of context after each match (content mode).", 0),
                "-B": _int("Lines of context before each match (content mode).", 0),
                "-C": _int("Lines of context before and after each match (content mode).", 0),
                "-i": _bool("Case-insensitive search."),
                "multiline": _bool("Let patterns span lines (`.` also matches newlines)."),
                "type": _str("Only search files of this ripgrep type, e.g. py, js, rust."),
                "head_limit": _int("Show only the first N lines, files or counts.", 1),
            },
            ["pattern"],
        ),
    ),
    (
        "glob_file_search",
        "Find files whose path matches a glob (`**/` is prepended when the pattern does not start with it). "
        "Results are sorted newest first.",
        _obj(
            {
                "glob_pattern": _str("The glob, e.g. `*.py` or `tests/**/test_*.py`."),
                "target_directory": _str("Directory to search in (default: the whole workspace)."),
            },
            ["glob_pattern"],
        ),
    ),
    (
        "list_dir",
        "List a directory as a tree (directories end with `/`; dot-files are hidden).",
        _obj(
            {
                "target_directory": _str(
                    "The directory, relative to the workspace or absolute under /workspace."
                ),
                "ignore_globs": _strs("Globs of names or paths to leave out, e.g. `*.pyc`."),
            },
            ["target_directory"],
        ),
    ),
    (
        "codebase_search",
        "Search the code by meaning: returns the code chunks (functions, classes, blocks) that best match a "
        "question, best first. For exact text use grep.",
        _obj(
            {
                "query": _str(
                    "A complete question about the code, e.g. `Where are the tests' fixtures built?`"
                ),
                "target_directories": _strs(
                    "Directories or files to limit the search to; [] searches everything."
                ),
                "explanation": _EXPLANATION,
            },
            ["query", "target_directories"],
        ),
    ),
    (
        "run_terminal_cmd",
        "Run a one-line shell command in the workspace's sandbox. The working directory persists between "
        "calls. Use non-interactive flags; set is_background for commands that do not finish.",
        _obj(
            {
                "command": _str("The command (a single line)."),
                "is_background": _bool("Start the command in the background and return at once."),
                "explanation": _EXPLANATION,
            },
            ["command", "is_background"],
        ),
    ),
    (
        "read_lints",
        "Read linter diagnostics (ruff) for files or directories of the workspace.",
        _obj({"paths": _strs("Files or directories to check; omit to check the whole workspace.")}, []),
    ),
    (
        "todo_write",
        "Create or update the task's todo list. With merge, items are updated by id and new ids are added; "
        "without merge, the list is replaced. At most one item may be in_progress.",
        _obj(
            {
                "merge": _bool("Merge into the existing list by id (true) or replace it (false)."),
                "todos": {
                    "type": "array",
                    "items": _TODO_ITEM,
                    "minItems": 2,
                    "description": "The todo items.",
                },
            },
            ["merge", "todos"],
        ),
    ),
    (
        "delete_file",
        "Delete a file of the workspace.",
        _obj(
            {
                "target_file": _str("The file, relative to the workspace or absolute under /workspace."),
                "explanation": _EXPLANATION,
            },
            ["target_file"],
        ),
    ),
]

TOOL_NAMES: tuple[str, ...] = tuple(name for name, _, _ in _SPECS)
_PARAMETERS: dict[str, dict] = {name: params for name, _, params in _SPECS}


def tool_schemas(names: tuple[str, ...] | None = None) -> list[dict]:
    """`{"type": "function", "function": {"name", "description", "parameters"}}` per tool, in TOOL_NAMES
    order; only those in `names` when given."""
    return [
        {"type": "function", "function": {"name": n, "description": d, "parameters": copy.deepcopy(p)}}
        for n, d, p in _SPECS
        if names is None or n in names
    ]


def offered_tools(spec: str) -> tuple[str, ...] | None:
    """The tools named by a comma-separated list ('' or 'all': every tool, None), in TOOL_NAMES order.
    Raises ValueError naming any tool that does not exist."""
    if spec.strip() in ("", "all"):
        return None
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOOL_NAMES]
    if unknown:
        raise ValueError(f"unknown tools {unknown} in {spec!r}; the tools are {', '.join(TOOL_NAMES)}")
    return tuple(n for n in TOOL_NAMES if n in names)


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_ARTICLE = {"integer": "an integer", "array": "an array", "object": "an object"}


def _is_text(value: str) -> bool:
    """Whether `value` is valid Unicode text: JSON's `\\ud800`-style escapes can give lone surrogates, which
    no file, process or encoder takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check(value: Any, schema: dict, where: str) -> str | None:
    """The first violation of `schema` by `value`, as a sentence about `where`, or None."""
    want = schema["type"]
    if json_type(value) != want:
        return f"{where} must be {_ARTICLE.get(want, 'a ' + want)}, got {json_type(value)}"
    if want == "string" and not _is_text(value):
        return f"{where} is not valid Unicode text (it holds a lone surrogate)"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(schema['enum'])}; got {value!r}"
    if "minimum" in schema and value < schema["minimum"]:
        return f"{where} must be at least {schema['minimum']}, got {value}"
    if want == "array":
        if len(value) < schema.get("minItems", 0):
            return f"{where} must have at least {schema['minItems']} items, got {len(value)}"
        for i, item in enumerate(value):
            problem = _check(item, schema["items"], f"{where}[{i}]")
            if problem:
                return problem
    if want == "object":
        for key in schema["required"]:
            if key not in value:
                return f"{where} is missing required field '{key}'"
        for key, item in value.items():
            if key not in schema["properties"]:
                return f"{where} has unknown field '{key}'"
            problem = _check(item, schema["properties"][key], f"{where}.{key}")
            if problem:
                return problem
    return None


def validate_arguments(name: str, arguments: dict) -> str | None:
    """None when `arguments` fit tool `name`'s schema, else an error text naming the argument."""
    params = _PARAMETERS[name]
    props = params["properties"]
    for key in params["required"]:
        if key not in arguments:
            return f"Error: missing required argument '{key}' for {name}"
    for key, value in arguments.items():
        if key not in props:
            valid = ", ".join(props)
            return f"Error: unknown argument '{key}' for {name} (valid arguments: {valid})"
        problem = _check(value, props[key], f"argument '{key}'")
        if problem:
            return f"Error: {name}: {problem}"
    return None
