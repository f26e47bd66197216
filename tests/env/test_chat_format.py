"""A checkpoint's own chat template (env.chat_format.TemplateFormat) against `transformers`' rendering of
the same template: Qwen3's, and the fixtures' hand-written one."""

import json
import re
from pathlib import Path

import pytest

from env import chat
from env.chat_format import NATIVE, NATIVE_TEMPLATE, TemplateFormat
from env.tokenizer import Tokenizer, render, render_prompt
from env.tools import tool_schemas

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3 = (FIXTURES / "chat_templates" / "qwen3.jinja").read_text()
HANDWRITTEN = json.loads((FIXTURES / "hf" / "qwen3_moe" / "tokenizer_config.json").read_text())[
    "chat_template"
]
EMPTY_THINK = "<think>\n\n</think>\n\n"

CALLS = [
    chat.ToolCall("read_file", {"target_file": "src/calc.py"}),
    chat.ToolCall("grep", {"pattern": "def add(", "path": "é €/<dir>"}),
]
EDIT = chat.ToolCall(
    "search_replace", {"file_path": "src/calc.py", "old_string": "a - b", "new_string": "a + b"}
)
CONVERSATION = [
    chat.system_message(tool_schemas(), "You fix bugs in Python repositories."),
    chat.Message("user", "add(2, 3) returns -1."),
    chat.Message("assistant", "Let me look.", CALLS),
    chat.Message("tool", "     1|def add(a, b):\n     2|    return a - b"),
    chat.Message("tool", "src/calc.py:1:def add(a, b):"),
    chat.Message("assistant", "", [EDIT]),
    chat.Message("tool", "The file src/calc.py has been updated."),
    chat.Message("assistant", "Fixed: add adds."),
]  # fmt: skip


@pytest.fixture(scope="module")
def hf_tokenizer():
    """transformers' tokenizer over the Qwen3-style fixture vocabulary (no chat template of its own)."""
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(FIXTURES / "hf" / "qwen3_moe" / "tokenizer.json")
    )


def _dicts(messages: list[chat.Message], inline_tools: bool = False) -> list[dict]:
    """The conversation as a transformers user writes it (with the tool schemas in the system text for a
    template that takes no tools argument)."""
    out = []
    for m in messages:
        d = {
            "role": m.role,
            "content": chat.system_content(m.content, m.tools) if inline_tools else m.content,
        }
        if m.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in m.tool_calls
            ]
        out.append(d)
    return out


def _apply(hf_tok, template: str, messages: list[chat.Message], add_generation_prompt: bool) -> str:
    takes_tools = "tools" in template
    return hf_tok.apply_chat_template(
        _dicts(messages, not takes_tools), tools=messages[0].tools if takes_tools else None,
        chat_template=template, tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )  # fmt: skip


@pytest.mark.parametrize("template", [QWEN3, HANDWRITTEN], ids=["qwen3", "handwritten"])
def test_prompts_equal_transformers_apply_chat_template(hf_tokenizer, template):
    fmt = TemplateFormat.load(template)
    for n in range(2, len(CONVERSATION) + 1):
        for gen in (True, False):
            assert fmt.render(CONVERSATION[:n], gen) == _apply(hf_tokenizer, template, CONVERSATION[:n], gen)
        if CONVERSATION[n - 1].role != "assistant":
            assert fmt.prompt_text(CONVERSATION[:n]) == _apply(hf_tokenizer, template, CONVERSATION[:n], True)


def test_qwen3_shows_tools_as_json_schemas_in_its_own_system_text(hf_tokenizer):
    text = TemplateFormat.load(QWEN3).prompt_text(CONVERSATION[:2])
    assert text.startswith("<|im_start|>system\nYou fix bugs in Python repositories.\n\n# Tools\n")
    listed = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in listed] == tool_schemas()
    assert "The tools you can call" not in text  # not composer's own system text
    assert text.endswith("<|im_start|>user\nadd(2, 3) returns -1.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [QWEN3, HANDWRITTEN], ids=["qwen3", "handwritten"])
def test_each_turn_is_what_the_template_writes_for_it_and_only_it_carries_loss(hf_tokenizer, template):
    tok = Tokenizer.load(FIXTURES / "hf" / "qwen3_moe" / "tokenizer.json")
    tok.chat_format = TemplateFormat.load(template)
    ids, mask = render(CONVERSATION, tok)
    assert list(ids) == tok.encode(tok.decode(ids))  # segment by segment = the whole text
    spans = [tok.decode(ids[m.start() : m.end()]) for m in re.finditer("1+", "".join(map(str, mask)))]
    assistant_at = [i for i, m in enumerate(CONVERSATION) if m.role == "assistant"]
    assert len(spans) == len(assistant_at)
    for span, i in zip(spans, assistant_at):
        before = _apply(hf_tokenizer, template, CONVERSATION[:i], True)
        turn = _apply(hf_tokenizer, template, CONVERSATION[: i + 1], False)
        assert turn.startswith(before)
        assert span == turn[len(before) :].split(chat.IM_END)[0] + chat.IM_END
        assert chat.parse_assistant(span).calls == CONVERSATION[i].tool_calls
    # The stream opens with the template's prompt.
    first = _apply(hf_tokenizer, template, CONVERSATION[:2], True)
    assert tok.decode(ids).startswith(first)
    assert list(render_prompt(CONVERSATION[:2], tok)) == tok.encode(first)


def test_stream_differs_from_qwen3_history_only_by_the_empty_think_of_earlier_turns(hf_tokenizer):
    """Qwen3 drops an earlier turn's empty think block from the history; the sampler saw it (it wrote it),
    so the stream keeps it. Nothing else differs, and with reasoning in every turn nothing differs at all."""
    fmt = TemplateFormat.load(QWEN3)
    stream = "".join(t for t, _ in fmt.render_segments(CONVERSATION))
    history = _apply(hf_tokenizer, QWEN3, CONVERSATION, False)
    assert stream != history
    last = stream.rindex(EMPTY_THINK)
    assert stream[:last].replace(EMPTY_THINK, "") + stream[last:] == history
    thinking = [
        chat.Message(m.role, f"<think>\nStep {i}.\n</think>\n\n{m.content}", m.tool_calls)
        if m.role == "assistant"
        else m
        for i, m in enumerate(CONVERSATION)
    ]
    stream = "".join(t for t, _ in fmt.render_segments(thinking))
    assert stream == _apply(hf_tokenizer, QWEN3, thinking, False)


def test_append_only_template_stream_is_its_rendering(hf_tokenizer):
    fmt = TemplateFormat.load(HANDWRITTEN)
    stream = "".join(t for t, _ in fmt.render_segments(CONVERSATION))
    assert stream == _apply(hf_tokenizer, HANDWRITTEN, CONVERSATION, False)
    # With no tools argument in the template, the schemas go in the system text, composer's way.
    assert chat.system_content(CONVERSATION[0].content, tool_schemas()) in stream


def test_continuation_is_what_follows_a_turn(hf_tokenizer):
    fmt = TemplateFormat.load(QWEN3)
    results = CONVERSATION[3:5]
    after = fmt.continuation(results)
    assert after == (
        "\n<|im_start|>user\n<tool_response>\n" + results[0].content + "\n</tool_response>\n<tool_response>\n"
        + results[1].content + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )  # fmt: skip
    assert NATIVE.continuation(results) == "\n" + chat.render_text(results, add_generation_prompt=True)


def test_a_turn_with_reasoning_reads_back_to_its_calls():
    fmt = TemplateFormat.load(QWEN3)
    turn = chat.Message("assistant", "<think>\nThe sign.\n</think>\n\nLooking.", CALLS)
    text = fmt.assistant_text(turn)
    assert text.startswith("<think>\nThe sign.\n</think>\n\nLooking.\n<tool_call>\n")
    parsed = fmt.parse_assistant(text)
    assert parsed.calls == CALLS and parsed.text.endswith("Looking.")
    assert fmt.assistant_text(chat.Message("assistant", parsed.text, parsed.calls)) == text


def test_templates_composer_cannot_read_are_refused():
    mistral_like = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% for c in m.tool_calls | default([]) %}"
        "[TOOL_CALLS]{{ c.function | tojson }}{% endfor %}{{ m.content }}</s>{% else %}[INST]{{ m.content }}"
        "[/INST]{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match="chat_template = 'native'"):
        TemplateFormat.load(mistral_like)
    with pytest.raises(ValueError, match="fails"):
        TemplateFormat.load("{{ raise_exception('no tools here') }}")


def test_generation_blocks_render_as_their_text():
    end = "{{- '<|im_end|>\\n' }}{%- elif message.role == 'tool' %}"
    marked = HANDWRITTEN.replace(end, "{% generation %}" + end.replace("{%-", "{% endgeneration %}{%-", 1))
    assert marked != HANDWRITTEN
    assert TemplateFormat.load(marked).render(CONVERSATION, False) == TemplateFormat.load(HANDWRITTEN).render(
        CONVERSATION, False
    )


def test_composer_s_own_format_as_a_template_renders_as_composer_does():
    """NATIVE_TEMPLATE (what an exported checkpoint carries) against env.chat on random conversations:
    special-token strings inside calls, whitespace, unicode, parallel calls, grouped results."""
    import random

    fmt = TemplateFormat.load(NATIVE_TEMPLATE)
    rng = random.Random(0)
    alphabet = 'ab \n\t"\\/<>{}[]:,é漢🙂' + "".join(chat.SPECIAL_TOKENS)

    def text(n: int = 12) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(n)))

    for _ in range(150):
        messages = []
        if rng.random() < 0.8:
            messages.append(chat.system_message(tool_schemas() if rng.random() < 0.7 else [], text()))
        messages.append(chat.Message("user", text()))
        for _ in range(rng.randrange(4)):
            calls = [
                chat.ToolCall(rng.choice(["read_file", "grep"]), {"a": text(), "b": [1, None, text()]})
                for _ in range(rng.randrange(3))
            ]
            messages.append(chat.Message("assistant", text(), calls))
            messages += [chat.Message("tool", text()) for _ in range(rng.randrange(3))]
        for gen in (True, False):
            assert fmt.render(messages, gen) == chat.render_text(messages, gen)
