"""The conversation and tool-call format, in plain Python (no JAX: the host-side env/ code imports it).

A conversation renders as ChatML turns in the style of the Qwen3/Hermes template, so that Qwen3 tokenizers
and checkpoints work unchanged:

    <|im_start|>system\\n{instructions}\\n\\n# Tools ...<tools>\\n{schema}\\n...</tools>...<|im_end|>\\n
    <|im_start|>user\\n{task}<|im_end|>\\n
    <|im_start|>assistant\\n{text}\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    <tool_call>\\n{...}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n{result 1}\\n</tool_response>\\n<tool_response>\\n{result 2}
    </tool_response><|im_end|>\\n

Several `<tool_call>` blocks in one assistant turn are parallel calls. Consecutive 'tool' messages (the
results of one turn's calls, in call order) share one user turn. Only the assistant's own tokens carry loss:
`render_segments` marks them (the content, the calls and the closing `<|im_end|>`, not the
`<|im_start|>assistant\\n` header nor the newline after `<|im_end|>`).

`parse_assistant` turns generated text back into text plus calls. It never raises: a malformed call becomes a
`CallError` naming the problem, which the environment answers with an error result.

Assistant content is rendered with its leading whitespace removed. The header ends in a newline, and a
byte-level pre-tokenizer would merge that newline with leading whitespace of the content into one token; with
the content starting on a non-space character the header and the content tokenize apart, so encoding the
segments one by one gives exactly the tokens of the whole text (and the tokens a model generates after the
header). To train on exactly what a model generated, use the sampled token ids, not a re-render.
"""

import dataclasses
import json
import re
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
PAD = "<|endoftext|>"
THINK_OPEN = "<think>"  # a reasoning block that opens a turn (Qwen3's templates; not a special token here)
THINK_CLOSE = "</think>"
SPECIAL_TOKENS: list[str] = [
    IM_START,
    IM_END,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    PAD,
]
ROLES = ("system", "user", "assistant", "tool")
CALL_KEYS = ("name", "arguments")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One well-formed call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class CallError:
    """A malformed call. `message` names the problem; `raw` is the block as generated, tags included."""

    message: str
    raw: str


@dataclasses.dataclass
class Message:
    """One turn. role: 'system' | 'user' | 'assistant' | 'tool' (a tool result, rendered in a user turn).

    `tools` (a system message's only): the JSON schemas of the callable tools, in the OpenAI form
    `{"type": "function", "function": {...}}`; each chat format renders them its own way.
    """

    role: str
    content: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tools: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read back: its text (outside the calls, stripped) and its calls in order."""

    text: str
    calls: list[ToolCall | CallError]


# ---------------------------------------------------------------------------------------------- rendering


def format_call(call: ToolCall) -> str:
    """One call as the model writes it: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    # A special-token string inside an argument (say, a file that holds chat markup) would end the call or
    # the turn early; escaping its "<" keeps the JSON equal and the markup out of the token stream.
    for token in SPECIAL_TOKENS:
        body = body.replace(token, "\\u003c" + token[1:])
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def assistant_body(message: Message) -> str:
    """The generated part of an assistant turn, without `<|im_end|>`: text, then the calls.

    The text is separated from the first call by a newline and calls from each other by a newline; leading
    whitespace of the text is dropped (see the module docstring).
    """
    parts = [message.content.lstrip()] if message.content.strip() else []
    parts += [format_call(c) for c in message.tool_calls]
    return "\n".join(parts)


def render_segments(messages: list[Message], add_generation_prompt: bool = False) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, is_generated) segments; their concatenation is `render_text`.

    `is_generated` is True exactly on each assistant turn's body plus its closing `<|im_end|>`: the tokens the
    policy produces and the ones that carry loss. Adjacent segments with the same flag are merged, and every
    boundary falls either next to a special token or right after `<|im_start|>assistant\\n`.
    """
    segments: list[tuple[str, bool]] = []

    def emit(text: str, generated: bool) -> None:
        if not text:
            return
        if segments and segments[-1][1] == generated:
            segments[-1] = (segments[-1][0] + text, generated)
        else:
            segments.append((text, generated))

    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role not in ROLES:
            raise ValueError(f"unknown role {m.role!r} (expected one of {ROLES})")
        if m.role != "assistant" and m.tool_calls:
            raise ValueError(f"a {m.role!r} message cannot carry tool calls")
        if m.role != "system" and m.tools:
            raise ValueError(f"a {m.role!r} message cannot carry tool schemas")
        if m.role == "tool":
            # One user turn holds the results of consecutive tool messages, in order.
            blocks = []
            while i < len(messages) and messages[i].role == "tool":
                blocks.append(f"{TOOL_RESPONSE_OPEN}\n{messages[i].content}\n{TOOL_RESPONSE_CLOSE}")
                i += 1
            emit(f"{IM_START}user\n" + "\n".join(blocks) + f"{IM_END}\n", False)
            continue
        if m.role == "assistant":
            emit(f"{IM_START}assistant\n", False)
            emit(assistant_body(m) + IM_END, True)
            emit("\n", False)
        else:
            content = system_content(m.content, m.tools) if m.role == "system" else m.content
            emit(f"{IM_START}{m.role}\n{content}{IM_END}\n", False)
        i += 1
    if add_generation_prompt:
        emit(f"{IM_START}assistant\n", False)
    return segments


def render_text(messages: list[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as one string; with `add_generation_prompt`, ends in `<|im_start|>assistant\\n`."""
    return "".join(text for text, _ in render_segments(messages, add_generation_prompt))


def system_message(tool_schemas: list[dict], instructions: str) -> Message:
    """The system turn: the instructions, and the tool schemas the model may call (rendered by the chat
    format: `system_content` for composer's own, the `tools` argument of a checkpoint's template)."""
    return Message("system", instructions, tools=list(tool_schemas))


# composer's system text around the tool schemas (one JSON object a line between them).
TOOLS_BEFORE = "\n\n# Tools\n\nThe tools you can call, one JSON schema a line:\n<tools>\n"
TOOLS_AFTER = (
    "\n</tools>\n\nCall a tool by writing its name and arguments as one JSON object between tags:\n"
    f'{TOOL_CALL_OPEN}\n{{"name": <tool name>, "arguments": <arguments object>}}\n{TOOL_CALL_CLOSE}\n'
    "Several calls in one turn run in parallel; their results come back in order."
)


def system_content(instructions: str, tool_schemas: list[dict]) -> str:
    """composer's own system text: the instructions, then the tool schemas (one JSON object a line in
    `<tools>`) and how to call them. With no schemas, the instructions alone."""
    if not tool_schemas:
        return instructions
    schemas = "\n".join(json.dumps(s, ensure_ascii=False) for s in tool_schemas)
    return f"{instructions}{TOOLS_BEFORE}{schemas}{TOOLS_AFTER}"


# ---------------------------------------------------------------------------------------------- parsing

_TAG = re.compile(re.escape(TOOL_CALL_OPEN) + "|" + re.escape(TOOL_CALL_CLOSE))


def parse_call(body: str) -> ToolCall | CallError:
    """Parses the text between `<tool_call>` and `</tool_call>`.

    A well-formed call is exactly one JSON object with the keys "name" (a non-empty string) and "arguments"
    (a JSON object), and no other key: extra keys are an error, so that the policy is held to the format
    the tools are called with.
    """
    raw = body
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return CallError(f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})", raw)
    except (ValueError, RecursionError) as e:  # e.g. an integer too long to convert, nesting too deep
        return CallError(f"invalid JSON: {type(e).__name__}", raw)
    if not isinstance(value, dict):
        return CallError(f"the call is not a JSON object (got {_json_type(value)})", raw)
    if "name" not in value:
        return CallError('missing "name"', raw)
    if not isinstance(value["name"], str):
        return CallError(f'"name" is not a string (got {_json_type(value["name"])})', raw)
    if not value["name"].strip():
        return CallError('"name" is empty', raw)
    if "arguments" not in value:
        return CallError('missing "arguments"', raw)
    if not isinstance(value["arguments"], dict):
        return CallError(f'"arguments" is not a JSON object (got {_json_type(value["arguments"])})', raw)
    extra = sorted(k for k in value if k not in CALL_KEYS)
    if extra:
        return CallError(f'unexpected keys {extra} (a call has only "name" and "arguments")', raw)
    return ToolCall(value["name"], value["arguments"])


def parse_assistant(text: str) -> ParsedTurn:
    """Reads a generated assistant turn back into its text and calls. Never raises.

    The turn ends at the first `<|im_end|>` (anything after it is not part of the turn). Each
    `<tool_call>...</tool_call>` block gives a ToolCall, or a CallError for: invalid JSON, JSON that is not an
    object, a missing / non-string / empty "name", missing "arguments", "arguments" not an object, keys other
    than the two; an opening tag with no closing tag (`unclosed <tool_call>`: the block runs to the next
    opening tag or to the end); a closing tag with no opening tag (`stray </tool_call>`). The text is what
    lies outside the blocks, each piece stripped, joined by newlines.
    """
    try:
        return _parse_assistant(text)
    except Exception as e:  # the parser must not take the rollout down, whatever the model wrote
        return ParsedTurn("", [CallError(f"unparseable turn: {type(e).__name__}", str(text))])


def _parse_assistant(text: str) -> ParsedTurn:
    end = text.find(IM_END)
    if end >= 0:
        text = text[:end]
    pieces: list[str] = []
    calls: list[ToolCall | CallError] = []
    pos = 0
    open_at = -1  # where the opening tag of the current call starts; -1 outside a call
    for tag in _TAG.finditer(text):
        if tag.group() == TOOL_CALL_OPEN:
            if open_at >= 0:
                calls.append(_unclosed(text[open_at : tag.start()]))
            else:
                pieces.append(text[pos : tag.start()])
            open_at = tag.start()
        elif open_at >= 0:
            call = parse_call(text[open_at + len(TOOL_CALL_OPEN) : tag.start()])
            if isinstance(call, CallError):
                call = dataclasses.replace(call, raw=text[open_at : tag.end()])
            calls.append(call)
            open_at = -1
        else:
            pieces.append(text[pos : tag.start()])
            calls.append(
                CallError(f"stray {TOOL_CALL_CLOSE} without an opening {TOOL_CALL_OPEN}", tag.group())
            )
        pos = tag.end()
    if open_at >= 0:
        calls.append(_unclosed(text[open_at:]))
    else:
        pieces.append(text[pos:])
    body = "\n".join(p.strip() for p in pieces if p.strip())
    return ParsedTurn(body, calls)


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a turn that opens with a `<think>` block, else ("", text). A block that is not
    closed is all reasoning. Newlines around the reasoning and before the answer are not part of them."""
    head = text.lstrip()
    if not head.startswith(THINK_OPEN):
        return "", text
    body = head[len(THINK_OPEN) :]
    end = body.find(THINK_CLOSE)
    if end < 0:
        return body.strip("\n"), ""
    return body[:end].strip("\n"), body[end + len(THINK_CLOSE) :].lstrip("\n")


def _unclosed(raw: str) -> CallError:
    return CallError(f"unclosed {TOOL_CALL_OPEN}: no {TOOL_CALL_CLOSE} after it", raw)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# ---------------------------------------------------------------------------------------------- storage


def message_to_dict(message: Message) -> dict:
    """A JSON-able dict: {"role", "content", "tool_calls": [{"name", "arguments"}, ...]}, and "tools" for a
    system message that has schemas."""
    out = {
        "role": message.role,
        "content": message.content,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls],
    }
    if message.tools:
        out["tools"] = message.tools
    return out


def message_from_dict(d: dict) -> Message:
    """The inverse of `message_to_dict` ("content", "tool_calls" and "tools" may be absent)."""
    calls = [ToolCall(c["name"], c["arguments"]) for c in d.get("tool_calls", [])]
    return Message(d["role"], d.get("content", ""), calls, list(d.get("tools", [])))
