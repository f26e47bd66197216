"""Executing calls: name -> tool, argument validation, errors as results, parallel calls.

Nothing here raises to the caller: a CallError from the parser, an unknown tool (or one the context does
not offer), arguments that do not fit the schema, a ToolError inside a tool and any unexpected exception all
come back as a ToolResult with the error flag (the last one is also logged with its traceback, since it is
a bug of ours, not the model's). A result's text is valid Unicode: lone surrogates (file names that are
not UTF-8, arguments echoed back) are shown as U+FFFD.
"""

import concurrent.futures
import dataclasses
import importlib
import logging
import re
from collections.abc import Callable

from env.chat import CallError, ToolCall, parse_call
from env.tools import files, lints, search, terminal, todos
from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.schemas import TOOL_NAMES, validate_arguments

log = logging.getLogger(__name__)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _codebase_search(ctx: ToolContext, args: dict) -> ToolResult:
    # Imported on first use: numpy and bm25s cost ~0.3 s, which other tools (and the CLI) need not pay.
    module = importlib.import_module("env.tools.codebase_search")
    return module.codebase_search(ctx, args)


TOOLS: dict[str, Callable[[ToolContext, dict], ToolResult]] = {
    "read_file": files.read_file,
    "search_replace": files.search_replace,
    "write": files.write,
    "grep": search.grep,
    "glob_file_search": search.glob_file_search,
    "list_dir": search.list_dir,
    "codebase_search": _codebase_search,
    "run_terminal_cmd": terminal.run_terminal_cmd,
    "read_lints": lints.read_lints,
    "todo_write": todos.todo_write,
    "delete_file": files.delete_file,
}
assert tuple(TOOLS) == TOOL_NAMES, "the registry and the schemas list the same tools in the same order"


def execute(ctx: ToolContext, call: ToolCall | CallError) -> ToolResult:
    """Runs one parsed call. Never raises."""
    result = _execute(ctx, call)
    if _SURROGATE.search(result.text):
        # A file name that is not UTF-8 (os.scandir gives it as lone surrogates) or an argument echoed back:
        # the conversation holds only valid text.
        result = dataclasses.replace(result, text=_SURROGATE.sub("\ufffd", result.text))
    return result


def _execute(ctx: ToolContext, call: ToolCall | CallError) -> ToolResult:
    try:
        if isinstance(call, CallError):
            return ToolResult(f"Error: malformed tool call: {call.message}", is_error=True)
        offered = TOOL_NAMES if ctx.tools is None else ctx.tools
        if call.name not in TOOLS or call.name not in offered:
            return ToolResult(
                f"Error: unknown tool '{call.name}'. Valid tools: {', '.join(offered)}", is_error=True
            )
        if not isinstance(call.arguments, dict):
            return ToolResult(f"Error: the arguments of {call.name} must be a JSON object", is_error=True)
        problem = validate_arguments(call.name, call.arguments)
        if problem:
            return ToolResult(problem, is_error=True)
        return TOOLS[call.name](ctx, call.arguments)
    except ToolError as e:
        return ToolResult(str(e), is_error=True)
    except Exception as e:  # a bug in a tool: the episode goes on, the log keeps the traceback
        log.exception("tool %s failed", getattr(call, "name", "?"))
        name = getattr(call, "name", "?")
        return ToolResult(f"Error: internal error in {name}: {type(e).__name__}: {e}", is_error=True)


def execute_json(ctx: ToolContext, raw: str) -> ToolResult:
    """Runs a call given as JSON text `{"name": ..., "arguments": {...}}`. Never raises."""
    try:
        call = parse_call(raw)
    except Exception as e:  # parse_call does not raise; this keeps the promise if it ever did
        call = CallError(f"{type(e).__name__}: {e}", raw)
    return execute(ctx, call)


def execute_parallel(ctx: ToolContext, calls: list) -> list[ToolResult]:
    """Runs the calls of one turn concurrently (a thread each); results in call order. Never raises."""
    if len(calls) <= 1:
        return [execute(ctx, c) for c in calls]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda c: execute(ctx, c), calls))
