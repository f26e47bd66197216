"""Chat formats: how a conversation becomes the text a model reads and writes.

Two implement `ChatFormat`:

- `NATIVE`, composer's own (env.chat): ChatML turns in the layout of Qwen3's template, with its own system
  text for the tools. The default, and what the generated-task models are trained in.
- `TemplateFormat`, a checkpoint's own Jinja chat template (`tokenizer_config.json` / `chat_template.jinja`),
  rendered the way `transformers`' `apply_chat_template` renders it: tools passed as JSON schemas, the
  template's own system text, its own turn layout. Tool calls are read back from `<tool_call>` JSON blocks
  and turns end at `<|im_end|>` (the Qwen / Hermes family); a template that writes calls or ends turns
  otherwise is refused when it is loaded.

Two views of a conversation with several assistant turns:

- the prompt (`prompt_text`): the template's rendering of the whole history plus the generation prompt,
  what a served request or a fresh episode starts from; equal to `apply_chat_template(...,
  add_generation_prompt=True)`.
- the stream (`render_segments`): what an episode's sampler reads and writes, append-only: the first
  prompt, then each assistant turn exactly as the template renders that turn when it is the newest one, then
  the tool results and the next generation prompt, and so on. RL scores the tokens the sampler saw, and SFT
  trains on the same layout. A template that renders history differently from the newest turn (Qwen3 drops
  an empty `<think></think>` of earlier assistant turns) gives a stream that differs from its prompt view
  there and only there; the turns themselves, and the tokens that carry loss, are the template's.
"""

import dataclasses
import functools
import json
from datetime import datetime
from typing import Protocol

import jinja2
import jinja2.ext
import jinja2.sandbox

from env import chat

_ANCHOR = "\u2063anchor\u2063"  # a marker no template or conversation writes (invisible separator)


class ChatFormat(Protocol):
    """Renders conversations (env.chat.Message lists) to text and reads generated turns back."""

    source: str  # the format as a Jinja chat template (what an exported checkpoint carries)

    def render_segments(
        self, messages: list[chat.Message], add_generation_prompt: bool = False
    ) -> list[tuple[str, bool]]:
        """The stream as (text, is_generated) segments; is_generated marks exactly each assistant turn's
        own text through its `<|im_end|>`. Every boundary lies next to a special token or after a newline."""
        ...

    def prompt_text(self, messages: list[chat.Message]) -> str:
        """The history then the generation prompt: the text to generate the next assistant turn from."""
        ...

    def continuation(self, messages: list[chat.Message]) -> str:
        """What follows a generated turn's `<|im_end|>` in the stream: the text of `messages` (the turn's
        tool results) then the next generation prompt."""
        ...

    def assistant_text(self, message: chat.Message) -> str:
        """The text a model writes for `message` (an assistant turn), through its `<|im_end|>`."""
        ...

    def parse_assistant(self, text: str) -> chat.ParsedTurn:
        """A generated turn read back into text and calls (never raises)."""
        ...


class NativeFormat:
    """composer's own format (env.chat)."""

    name = "native"

    @property
    def source(self) -> str:
        """The format as a Jinja chat template (NATIVE_TEMPLATE), for other stacks."""
        return NATIVE_TEMPLATE

    def render_segments(self, messages, add_generation_prompt=False):
        return chat.render_segments(messages, add_generation_prompt)

    def prompt_text(self, messages):
        return chat.render_text(messages, add_generation_prompt=True)

    def continuation(self, messages):
        return "\n" + chat.render_text(messages, add_generation_prompt=True)

    def assistant_text(self, message):
        return chat.assistant_body(message) + chat.IM_END

    def parse_assistant(self, text):
        return chat.parse_assistant(text)


NATIVE = NativeFormat()


def _literal(text: str) -> str:
    # A Jinja string literal of `text` (Jinja reads a JSON string's escapes).
    return json.dumps(text)


def _escape_specials(expr: str) -> str:
    # format_call's escaping of special-token strings inside a call's JSON, as Jinja filters.
    return expr + "".join(f" | replace('{t}', '\\\\u003c{t[1:]}')" for t in chat.SPECIAL_TOKENS)


# composer's own format as a Jinja chat template, written beside an exported checkpoint so that other
# stacks (transformers, vLLM) prompt the model exactly as composer does (tests/env/test_chat_format.py).
NATIVE_TEMPLATE = "".join(
    [
        "{%- macro system_text(instructions) -%}",
        "{%- if tools -%}",
        "{{- instructions ~ " + _literal(chat.TOOLS_BEFORE) + " -}}",
        "{%- for tool in tools -%}{{- (tool | tojson) ~ ('' if loop.last else '\\n') -}}{%- endfor -%}",
        "{{- " + _literal(chat.TOOLS_AFTER) + " -}}",
        "{%- else -%}{{- instructions -}}{%- endif -%}",
        "{%- endmacro -%}",
        "{%- if tools and (not messages or messages[0].role != 'system') -%}",
        "{{- '<|im_start|>system\\n' ~ system_text('') ~ '<|im_end|>\\n' -}}",
        "{%- endif -%}",
        "{%- for message in messages -%}",
        "{%- set content = message.content if message.content is string else '' -%}",
        "{%- if message.role == 'assistant' -%}",
        "{%- set ns = namespace(body=(content.lstrip() if content.strip() else '')) -%}",
        "{%- for call in message.tool_calls or [] -%}",
        "{%- set fn = call.function if call.function is defined else call -%}",
        "{%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}",
        "{%- set text = '{\"name\": ' ~ (fn.name | tojson) ~ ', \"arguments\": ' ~ args ~ '}' -%}",
        "{%- set ns.body = ns.body ~ ('\\n' if ns.body else '') ~ '<tool_call>\\n' ~ ("
        + _escape_specials("text")
        + ") ~ '\\n</tool_call>' -%}",
        "{%- endfor -%}",
        "{{- '<|im_start|>assistant\\n' ~ ns.body ~ '<|im_end|>\\n' -}}",
        "{%- elif message.role == 'tool' -%}",
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user\\n' -}}",
        "{%- else -%}{{- '\\n' -}}{%- endif -%}",
        "{{- '<tool_response>\\n' ~ content ~ '\\n</tool_response>' -}}",
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}",
        "{{- '<|im_end|>\\n' -}}{%- endif -%}",
        "{%- elif message.role == 'system' and loop.first -%}",
        "{{- '<|im_start|>system\\n' ~ system_text(content) ~ '<|im_end|>\\n' -}}",
        "{%- else -%}",
        "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ content ~ '<|im_end|>\\n' -}}",
        "{%- endif -%}",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
    ]
)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (templates that mark assistant text for transformers'
    assistant mask): rendered as its body; the stream marks assistant text itself."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Like transformers' filter: plain json.dumps, no HTML escaping (Jinja's own tojson escapes '<', '&').
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    # The settings transformers renders chat templates with: a sandbox (templates are untrusted code),
    # trimmed blocks, loop controls, its tojson, raise_exception and strftime_now.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@dataclasses.dataclass(frozen=True)
class TemplateFormat:
    """A checkpoint's chat template. `source`: the Jinja text; `special`: the special-token strings the
    template may reference (bos_token, eos_token...) from tokenizer_config.json. Construct with `load`,
    which checks that composer can read what the template writes."""

    source: str
    special: tuple[tuple[str, str], ...] = ()
    name: str = "checkpoint"

    @classmethod
    def load(cls, source: str, special: dict[str, str] | None = None) -> "TemplateFormat":
        fmt = cls(source, tuple(sorted((special or {}).items())))
        fmt.check()
        return fmt

    # ------------------------------------------------------------------------------------------ rendering

    def render(self, messages: list[chat.Message], add_generation_prompt: bool) -> str:
        """The template applied to `messages` (apply_chat_template's text)."""
        tools = next((m.tools for m in messages if m.role == "system" and m.tools), None)
        uses_tools = "tools" in self.source
        dicts = [self._message_dict(m, inline_tools=not uses_tools) for m in messages]
        return _compile(self.source).render(
            messages=dicts,
            tools=tools if uses_tools else None,
            add_generation_prompt=add_generation_prompt,
            **dict(self.special),
        )

    @staticmethod
    def _message_dict(m: chat.Message, inline_tools: bool) -> dict:
        if m.role not in chat.ROLES:
            raise ValueError(f"unknown role {m.role!r} (expected one of {chat.ROLES})")
        content = m.content
        if m.role == "system" and m.tools and inline_tools:
            # A template that takes no tools argument: the schemas go in the system text, composer's way.
            content = chat.system_content(m.content, m.tools)
        out = {"role": m.role, "content": content}
        if m.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        return out

    def prompt_text(self, messages):
        return self.render(messages, add_generation_prompt=True)

    def _turn(self, messages: list[chat.Message]) -> tuple[str, str]:
        """(the last message's generated text through <|im_end|>, what the template writes after it)."""
        before = self.render(messages[:-1], add_generation_prompt=True)
        full = self.render(messages, add_generation_prompt=False)
        if not full.startswith(before):
            raise ValueError(
                "the chat template renders the conversation before an assistant turn differently once the "
                "turn follows it: the turn's tokens cannot be told apart"
            )
        body = full[len(before) :]
        end = body.rfind(chat.IM_END)
        if end < 0:
            raise ValueError(f"the chat template ends an assistant turn without {chat.IM_END}")
        end += len(chat.IM_END)
        return body[:end], body[end:]

    def assistant_text(self, message):
        return self._turn([chat.Message("user", "-"), message])[0]

    def continuation(self, messages, add_generation_prompt: bool = True):
        # After an assistant turn the template writes the results and the next prompt; what it writes there
        # depends on those messages alone, so a one-turn anchor conversation in front finds it.
        anchor = [chat.Message("user", "-"), chat.Message("assistant", _ANCHOR)]
        text = self.render(anchor + list(messages), add_generation_prompt)
        at = text.find(_ANCHOR)
        end = text.find(chat.IM_END, at) if at >= 0 else -1
        if end < 0:
            raise ValueError("the chat template does not render an assistant turn's content and its end")
        return text[end + len(chat.IM_END) :]

    def render_segments(self, messages, add_generation_prompt=False):
        first = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
        if first == len(messages):
            return [(self.render(messages, add_generation_prompt), False)]
        segments = [(self.render(messages[:first], add_generation_prompt=True), False)]
        i = first
        while i < len(messages):
            body, rest = self._turn(messages[: i + 1])
            segments.append((body, True))
            j = i + 1
            while j < len(messages) and messages[j].role != "assistant":
                j += 1
            if j == i + 1 and j == len(messages) and not add_generation_prompt:
                segments.append((rest, False))
            else:
                prompt_next = j < len(messages) or add_generation_prompt
                segments.append((self.continuation(messages[i + 1 : j], prompt_next), False))
            i = j
        return [s for s in _merged(segments) if s[0]]

    def parse_assistant(self, text):
        return chat.parse_assistant(text)

    # ------------------------------------------------------------------------------------------ checking

    def check(self) -> None:
        """Raises ValueError unless the template writes what composer's sampler and parser read: turns that
        end at `<|im_end|>`, calls as `<tool_call>` JSON blocks that parse back to themselves, and results
        and prompts that the stream can follow."""
        calls = [
            chat.ToolCall("read_file", {"target_file": "a.py"}),
            chat.ToolCall("grep", {"pattern": "x <y>", "path": "é"}),
        ]
        conversation = [
            chat.system_message([_PROBE_TOOL], "Fix it."),
            chat.Message("user", "It fails."),
            chat.Message("assistant", "Looking.", calls),
            chat.Message("tool", "1"),
            chat.Message("tool", "2"),
            chat.Message("assistant", "Done."),
        ]
        hint = (
            "; composer reads ChatML-style templates that call tools in <tool_call> JSON blocks (Qwen, "
            "Hermes): use model.chat_template = 'native' for this checkpoint"
        )
        try:
            prompt = self.prompt_text(conversation[:2])
            segments = self.render_segments(conversation)
        except jinja2.exceptions.TemplateError as e:
            raise ValueError(f"the chat template fails on a conversation with tool calls: {e}{hint}") from e
        except ValueError as e:
            raise ValueError(f"{e}{hint}") from e
        if f"{chat.IM_START}assistant" not in prompt[-64:]:
            raise ValueError(f"the chat template's generation prompt does not open an assistant turn{hint}")
        turns = [text for text, generated in segments if generated]
        parsed = [chat.parse_assistant(t) for t in turns]
        if len(turns) != 2 or parsed[0].calls != calls or parsed[1].calls:
            raise ValueError(
                f"the chat template does not write tool calls as {chat.TOOL_CALL_OPEN} JSON blocks ending "
                f"the turn with {chat.IM_END}{hint}"
            )
        if _PROBE_TOOL["function"]["name"] not in prompt:
            raise ValueError(f"the chat template does not show the tool schemas to the model{hint}")


_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "A tool.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


def _merged(segments: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    for text, generated in segments:
        if out and out[-1][1] == generated:
            out[-1] = (out[-1][0] + text, generated)
        else:
            out.append((text, generated))
    return out
