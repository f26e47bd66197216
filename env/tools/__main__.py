"""Command line: run one tool call on a workspace and print the result as the model sees it.

    python -m env.tools call --workspace WS \
        --json '{"name": "read_file", "arguments": {"target_file": "a.py"}}'
    python -m env.tools call --workspace WS --json '...' --json-output   # {"text": ..., "is_error": ...}
    python -m env.tools call --workspace WS --search-model DIR \
        --json '{"name": "codebase_search", "arguments": {"query": "...", "target_directories": []}}'

The result text is printed followed by one newline. run_terminal_cmd runs in an env.sandbox.Sandbox on WS
(created only for that tool; without env.sandbox it answers that no sandbox is available). The exit status
is 0 for a result without the error flag, 1 for an error result. `--search-model DIR` gives codebase_search
the trained encoder in DIR (`python -m composer.search_model train --out DIR`); without it, the hashed
fallback.
"""

import argparse
import json
import sys
from pathlib import Path

from env.chat import ToolCall, parse_call
from env.tools.context import ToolContext
from env.tools.dispatch import execute


def _sandbox(workspace: Path):
    try:
        from env.sandbox import Sandbox
    except ImportError:
        return None
    return Sandbox(workspace)


def call(args: argparse.Namespace) -> int:
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        print(f"error: workspace {workspace} is not a directory", file=sys.stderr)
        return 2
    parsed = parse_call(args.json)
    sandbox = None
    if isinstance(parsed, ToolCall) and parsed.name == "run_terminal_cmd":
        sandbox = _sandbox(workspace)
    try:
        ctx = ToolContext(workspace, sandbox, display_root=args.display_root, search_model=args.search_model)
        result = execute(ctx, parsed)
    finally:
        if sandbox is not None:
            sandbox.close()
    if args.json_output:
        print(json.dumps({"text": result.text, "is_error": result.is_error}, ensure_ascii=False))
    else:
        print(result.text)
    return 1 if result.is_error else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.tools", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("call", help="run one tool call and print its result")
    p.add_argument("--workspace", required=True, help="the workspace directory (seen as /workspace)")
    p.add_argument("--json", required=True, help='the call: {"name": ..., "arguments": {...}}')
    p.add_argument("--json-output", action="store_true", help='print {"text": ..., "is_error": ...}')
    p.add_argument("--display-root", default="/workspace", help="where the model sees the workspace")
    p.add_argument("--search-model", default="", help="codebase_search's trained encoder (a model directory)")
    args = parser.parse_args(argv)
    return call(args)


if __name__ == "__main__":
    sys.exit(main())
