"""Run the agent on your own repository: the model calls the Cursor tools in a sandbox on a copy of it.

    python -m composer.agent --repo PATH "the task" --base-url http://127.0.0.1:8000/v1 [--model composer]
    python -m composer.agent --repo PATH "the task" --config=experiments/composer.py --workdir=RUN
    ... --apply                                       # write the agent's changes back to PATH

The model is any OpenAI-compatible endpoint (`python -m composer.serve`, vLLM, a hosted API), or a run's
model served in this process (--config / --workdir, as composer.serve loads it). Each turn's text, calls
and the first lines of their results stream to the terminal; the run ends with the unified diff of the copy
against the repository. Nothing is written to the repository without --apply. Terminal commands run in the
sandbox (env.sandbox: bubblewrap), never on the host.
"""

import difflib
import json
import shutil
import sys
import threading
import time
from pathlib import Path

from absl import app, flags

from composer import serve, xla_flags

_REPO = flags.DEFINE_string("repo", None, "The repository to work on (copied; untouched without --apply).")
_BASE_URL = flags.DEFINE_string("base_url", None, "An OpenAI-compatible endpoint, e.g. http://host:8000/v1.")
_MODEL = flags.DEFINE_string("model", "composer", "The endpoint's model name.")
_API_KEY = flags.DEFINE_string("api_key", "none", "The endpoint's API key.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 20, "Model turns at most.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Tokens a turn at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_TOOLS = flags.DEFINE_string("tools", "", "Comma-separated tools to offer ('': all).")
_APPLY = flags.DEFINE_bool("apply", False, "Write the agent's changes back to --repo.")
_SHOWN_LINES = 12  # lines of each tool result shown in the terminal


def changed_files(original: Path, copy: Path) -> dict[str, tuple[str | None, str | None]]:
    """Relative path -> (original text, new text) of every file that differs (None: absent); binary and
    cache files are left out."""

    def texts(root: Path) -> dict[str, str]:
        out = {}
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if not path.is_file() or any(p in (".git", "__pycache__", ".pytest_cache") for p in rel.parts):
                continue
            try:
                out[str(rel)] = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
        return out

    before, after = texts(original), texts(copy)
    return {
        rel: (before.get(rel), after.get(rel))
        for rel in sorted(before.keys() | after.keys())
        if before.get(rel) != after.get(rel)
    }


def unified_diff(changes: dict[str, tuple[str | None, str | None]]) -> str:
    parts = []
    for rel, (old, new) in changes.items():
        parts.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                fromfile=f"a/{rel}" if old is not None else "/dev/null",
                tofile=f"b/{rel}" if new is not None else "/dev/null",
            )
        )  # fmt: skip
    return "".join(parts)


def apply_changes(repo: Path, changes: dict[str, tuple[str | None, str | None]]) -> None:
    for rel, (_, new) in changes.items():
        target = repo / rel
        if new is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(new)


def _short(text: str) -> str:
    """The first lines of a tool result, for the terminal."""
    lines = text.splitlines()
    more = [f"... ({len(lines) - _SHOWN_LINES} more lines)"] if len(lines) > _SHOWN_LINES else []
    return "\n".join("      " + line for line in lines[:_SHOWN_LINES] + more)


def run_agent(client, model: str, task: str, workspace: Path, *, tools: str, max_turns: int, max_tokens: int,
              temperature: float, out=sys.stdout) -> list[dict]:  # fmt: skip
    """The agent's loop on `workspace` (already a copy): returns the conversation (OpenAI messages)."""
    import openai

    from env.chat import CallError, ToolCall
    from env.expert import INSTRUCTIONS
    from env.sandbox import Sandbox
    from env.tools import ToolContext, execute_parallel, offered_tools, tool_schemas

    offered = offered_tools(tools)
    schemas = tool_schemas(offered)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": task}]
    sandbox = Sandbox(workspace)
    try:
        ctx = ToolContext(workspace, sandbox, tools=offered)
        for turn in range(1, max_turns + 1):
            try:
                r = client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=schemas,
                    max_tokens=max_tokens,
                    temperature=temperature,
                )
            except openai.BadRequestError as e:  # e.g. the conversation outgrew the context: stop here
                print(f"[turn {turn}] the endpoint refused the request: {e.message}", file=out)
                break
            message = r.choices[0].message
            calls = message.tool_calls or []
            print(f"[turn {turn}] {(message.content or '').strip()}", file=out, flush=True)
            messages.append(
                {"role": "assistant", "content": message.content or "",
                 "tool_calls": [c.model_dump() for c in calls] or None}
            )  # fmt: skip
            if not calls:
                break
            parsed = []
            for c in calls:
                try:
                    arguments = json.loads(c.function.arguments)
                    if not isinstance(arguments, dict):
                        raise json.JSONDecodeError("not an object", c.function.arguments, 0)
                    parsed.append(ToolCall(c.function.name, arguments))
                except json.JSONDecodeError as e:
                    parsed.append(CallError(f"arguments are not a JSON object: {e}", c.function.arguments))
            for c, result in zip(calls, execute_parallel(ctx, parsed), strict=True):
                flag = " (error)" if result.is_error else ""
                print(
                    f"  -> {c.function.name}({c.function.arguments}){flag}\n{_short(result.text)}", file=out
                )
                messages.append({"role": "tool", "tool_call_id": c.id, "content": result.text})
        else:
            print(f"[stopped after {max_turns} turns]", file=out)
    finally:
        sandbox.close()
    return messages


def _local_endpoint(config, workdir: str | None):
    """A run's model served in this process on a free port: (base_url, stop)."""
    import socket

    import uvicorn

    api, engine = serve.build(config, workdir, "composer")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)
        engine.close()

    return f"http://127.0.0.1:{port}/v1", stop


def main(argv: list[str]) -> None:
    import openai

    from env.sandbox.workspace import make_workspace

    if len(argv) != 2:
        raise app.UsageError('give the task as one argument: python -m composer.agent --repo PATH "task"')
    if not _REPO.value or not Path(_REPO.value).is_dir():
        sys.exit(f"FATAL: --repo {_REPO.value!r} is not a directory")
    repo = Path(_REPO.value).resolve()
    stop = None
    base_url = _BASE_URL.value
    if base_url is None:
        if serve.CONFIG.value is None:
            sys.exit("FATAL: give --base-url URL (an OpenAI-compatible endpoint) or --config (and --workdir)")
        try:
            base_url, stop = _local_endpoint(serve.CONFIG.value, serve.WORKDIR.value)
        except ValueError as e:
            sys.exit(f"FATAL: {e}")
    workspace = make_workspace(repo)
    try:
        client = openai.OpenAI(base_url=base_url, api_key=_API_KEY.value, max_retries=0, timeout=600)
        run_agent(
            client, _MODEL.value, argv[1], workspace, tools=_TOOLS.value, max_turns=_MAX_TURNS.value,
            max_tokens=_MAX_TOKENS.value, temperature=_TEMPERATURE.value,
        )  # fmt: skip
        changes = changed_files(repo, workspace)
        print("\n" + (unified_diff(changes) or "(no changes)"))
        if _APPLY.value and changes:
            apply_changes(repo, changes)
            print(f"applied {len(changes)} file(s) to {repo}")
        elif changes:
            print(f"(not applied: rerun with --apply to write {len(changes)} file(s) to {repo})")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        if stop is not None:
            stop()


if __name__ == "__main__":
    xla_flags.apply()
    app.run(main)
