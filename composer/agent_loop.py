"""The agent's loop over an OpenAI-compatible endpoint, with the tools in a sandbox on a workspace copy, and
the diff of that copy against the repository (composer/agent.py's CLI, and the EVAL of a served model,
composer/pipeline/endpoint_eval.py)."""

import dataclasses
import difflib
import json
import sys
from pathlib import Path

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


@dataclasses.dataclass
class AgentRun:
    """What one run of the loop leaves: the conversation (OpenAI messages), the tool names called each turn,
    how many calls got an error result, and why it stopped ('answer' | 'turns' | 'refused')."""

    messages: list[dict]
    turn_calls: list[list[str]]
    tool_errors: int
    stop: str


def run_agent(client, model: str, task: str, ctx, *, tools: list[str], max_turns: int, max_tokens: int,
              temperature: float, out=sys.stdout) -> AgentRun:  # fmt: skip
    """The agent's loop over `ctx` (an env.tools.ToolContext on a workspace copy and its sandbox): the
    instructions and `task`, then model turns whose calls run until a turn calls nothing."""
    import openai

    from env.chat import CallError, ToolCall
    from env.expert import INSTRUCTIONS
    from env.tools import execute_parallel, tool_schemas

    schemas = tool_schemas(tools)
    run = AgentRun(
        [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": task}], [], 0, "turns"
    )
    for turn in range(1, max_turns + 1):
        try:
            r = client.chat.completions.create(
                model=model,
                messages=run.messages,
                tools=schemas,
                max_tokens=max_tokens,
                temperature=temperature,
            )
        except openai.BadRequestError as e:  # e.g. the conversation outgrew the context: stop here
            print(f"[turn {turn}] the endpoint refused the request: {e.message}", file=out)
            run.stop = "refused"
            break
        message = r.choices[0].message
        calls = message.tool_calls or []
        print(f"[turn {turn}] {(message.content or '').strip()}", file=out, flush=True)
        run.messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                "tool_calls": [c.model_dump() for c in calls] or None,
            }
        )
        if not calls:
            run.stop = "answer"
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
        results = execute_parallel(ctx, parsed)
        run.turn_calls.append([p.name if isinstance(p, ToolCall) else "" for p in parsed])
        run.tool_errors += sum(bool(r.is_error) for r in results)
        for c, result in zip(calls, results, strict=True):
            flag = " (error)" if result.is_error else ""
            print(f"  -> {c.function.name}({c.function.arguments}){flag}\n{_short(result.text)}", file=out)
            run.messages.append({"role": "tool", "tool_call_id": c.id, "content": result.text})
    else:
        print(f"[stopped after {max_turns} turns]", file=out)
    return run
