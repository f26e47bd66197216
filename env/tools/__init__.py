"""The IDE tools a policy calls, in the Cursor agent's formats (docs/tools.md).

    ctx = ToolContext(workspace, sandbox)            # one per episode
    system_message(tool_schemas(), ...)              # schemas for the prompt, in TOOL_NAMES order
    ToolContext(workspace, sandbox, tools=offered_tools("read_file,grep"))  # a subset of the tools
    execute(ctx, ToolCall("read_file", {"target_file": "pkg/mod.py"})) -> ToolResult(text, is_error)
    execute_parallel(ctx, calls)                     # one turn's calls, concurrently, results in order

Modules: context (ToolResult, ToolContext), paths (workspace path resolution and how paths are shown),
schemas (JSON schemas and argument validation), files, search (grep, glob_file_search, list_dir),
codebase_search, terminal, lints, todos, binaries (rg and ruff), dispatch. `python -m env.tools call` runs one
call from the command line.
"""

from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.dispatch import execute, execute_json, execute_parallel
from env.tools.schemas import (
    EDIT_TOOLS,
    READ_TOOLS,
    TOOL_NAMES,
    first_edit_after_read,
    offered_tools,
    tool_schemas,
)

__all__ = [
    "EDIT_TOOLS",
    "READ_TOOLS",
    "first_edit_after_read",
    "TOOL_NAMES",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "execute",
    "execute_json",
    "execute_parallel",
    "offered_tools",
    "tool_schemas",
]
