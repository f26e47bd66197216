"""Command line for debugging sandboxes.

    python -m env.sandbox run --workspace WS --timeout S -- CMD ...

prints one JSON object {"exit_code", "output", "timed_out", "isolation", "cwd", "truncated"}. A single CMD
word runs as a bash command line (`-- 'pytest -q | tail -3'`), several run as an argv. The workspace is
used in place and handed to the sandbox's uid; `--copy` runs on a private copy instead; `--python-env VENV`
runs it with that venv's interpreter. Where the isolation asked for does not work, it prints why and how to
fix it, and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from env.sandbox import (
    IsolationUnavailable,
    Limits,
    Sandbox,
    make_workspace,
    remove_workspace,
    resolve_isolation,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m env.sandbox", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="run one command in a sandbox over a workspace")
    run.add_argument("--workspace", required=True, type=Path)
    run.add_argument("--timeout", type=float, default=Limits().timeout_s, help="seconds of wall clock")
    run.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "unshare", "none"])
    run.add_argument("--copy", action="store_true", help="run on a private copy of the workspace")
    run.add_argument("--python-env", type=Path, help="a venv whose interpreter the command runs with")
    run.add_argument("command", nargs="+", help="after --: one bash command line, or an argv")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        resolve_isolation(args.isolation)
    except IsolationUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    workspace = make_workspace(args.workspace) if args.copy else args.workspace
    try:
        limits = dataclasses.replace(Limits(), timeout_s=args.timeout)
        with Sandbox(
            workspace, limits=limits, isolation=args.isolation, python_env=args.python_env
        ) as sandbox:
            command = args.command[0] if len(args.command) == 1 else args.command
            result = sandbox.run(command)
    finally:
        if args.copy:
            remove_workspace(workspace)
    print(json.dumps(dataclasses.asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
