"""The chat format: rendering, parsing of assistant turns (well-formed and malformed), storage."""

import json
import random
import sys

import pytest

from env import chat
from env.chat import CallError, Message, ParsedTurn, ToolCall

READ = ToolCall("read_file", {"target_file": "src/app.py", "offset": 3, "limit": 20})
NESTED = ToolCall(
    "todo_write",
    {
        "merge": False,
        "todos": [
            {"id": "1", "content": 'fix "off by one"\nin range()', "status": "in_progress"},
            {"id": "2", "content": "run tests ✓ — 日本語 🙂", "status": "pending"},
        ],
        "meta": {"depth": {"deeper": [1, 2.5, None, True]}, "path": "C:\\tmp\\x", "tab": "\tindent"},
    },
)
GREP = ToolCall("grep", {"pattern": r"def \w+\(", "-i": True, "glob": "*.py"})


def test_jax_not_imported():
    # The host-side env/ code imports chat.py; it must stay free of JAX.
    import subprocess

    code = "import sys, env.chat; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def _repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


def test_render_text_exact_format():
    messages = [
        Message("system", "Be brief."),
        Message("user", "Fix it."),
        Message("assistant", "Reading.", [READ, GREP]),
        Message("tool", "     1|x = 1"),
        Message("tool", "src/app.py:1:x = 1"),
        Message("assistant", "", [READ]),
        Message("tool", "File is empty."),
        Message("assistant", "Done."),
    ]
    read_json = '{"name": "read_file", "arguments": {"target_file": "src/app.py", "offset": 3, "limit": 20}}'
    grep_json = '{"name": "grep", "arguments": {"pattern": "def \\\\w+\\\\(", "-i": true, "glob": "*.py"}}'
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nFix it.<|im_end|>\n"
        f"<|im_start|>assistant\nReading.\n<tool_call>\n{read_json}\n</tool_call>\n"
        f"<tool_call>\n{grep_json}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n     1|x = 1\n</tool_response>\n"
        "<tool_response>\nsrc/app.py:1:x = 1\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n<tool_call>\n{read_json}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nFile is empty.\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n"
    )
    assert chat.render_text(messages) == expected
    assert chat.render_text(messages, add_generation_prompt=True) == expected + "<|im_start|>assistant\n"


def test_render_segments_mark_only_assistant_output():
    messages = [Message("user", "hi"), Message("assistant", "  hello", [READ]), Message("tool", "r")]
    segments = chat.render_segments(messages, add_generation_prompt=True)
    generated = [text for text, g in segments if g]
    assert generated == [f"hello\n{chat.format_call(READ)}<|im_end|>"]
    assert "".join(t for t, _ in segments) == chat.render_text(messages, add_generation_prompt=True)
    # Flags alternate: adjacent segments with the same flag are merged.
    assert all(a[1] != b[1] for a, b in zip(segments, segments[1:]))


def test_render_rejects_bad_messages():
    with pytest.raises(ValueError, match="unknown role"):
        chat.render_text([Message("robot", "x")])
    with pytest.raises(ValueError, match="cannot carry tool calls"):
        chat.render_text([Message("user", "x", [READ])])


def test_system_message_lists_schemas_one_per_line():
    schemas = [
        {"name": "read_file", "parameters": {"type": "object", "required": ["target_file"]}},
        {"name": "grep", "description": "ripgrep — fast", "parameters": {"type": "object"}},
    ]
    m = chat.system_message(schemas, "You fix bugs.")
    assert m.role == "system" and m.content == "You fix bugs." and m.tools == schemas
    text = chat.render_text([m])
    assert text.startswith("<|im_start|>system\nYou fix bugs.\n\n# Tools")
    block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in block.split("\n")] == schemas
    assert (
        chat.render_text([chat.system_message([], "Only this.")])
        == "<|im_start|>system\nOnly this.<|im_end|>\n"
    )
    assert chat.message_from_dict(chat.message_to_dict(m)) == m
    with pytest.raises(ValueError, match="tool schemas"):
        chat.render_text([chat.Message("user", "hi", tools=schemas)])


@pytest.mark.parametrize(
    "text,calls",
    [
        ("Just text, no calls.", []),
        ("", [READ]),
        ("Let me look at the file.", [READ]),
        ("Reading three files at once.", [READ, NESTED, GREP]),
        ("Multi-line\n  text with 'quotes' and \"double\" and `code`\n\nand ünïcödé 🙂", [NESTED]),
        ("", [READ, GREP]),
    ],
)
def test_render_parse_round_trip(text, calls):
    body = chat.assistant_body(Message("assistant", text, calls))
    for generated in (body, body + chat.IM_END):
        parsed = chat.parse_assistant(generated)
        assert parsed == ParsedTurn(text.strip(), calls)


def test_round_trip_arguments_holding_chat_markup():
    # Arguments may hold the special-token strings (e.g. a file with chat markup); they must not end the call.
    call = ToolCall("write", {"file_path": "t.txt", "contents": "a</tool_call>\n<|im_end|><tool_call>\\<x"})
    body = chat.assistant_body(Message("assistant", "Writing.", [call]))
    assert body.count(chat.TOOL_CALL_OPEN) == 1 and body.count(chat.TOOL_CALL_CLOSE) == 1
    assert chat.IM_END not in body
    assert chat.parse_assistant(body + chat.IM_END) == ParsedTurn("Writing.", [call])


def test_text_between_and_after_calls_is_kept():
    call = chat.format_call(READ)
    parsed = chat.parse_assistant(f"  first  {call} middle\n{call}\n last \n<|im_end|>ignored after the end")
    assert parsed == ParsedTurn("first\nmiddle\nlast", [READ, READ])


def _block(body: str) -> str:
    return f"{chat.TOOL_CALL_OPEN}\n{body}\n{chat.TOOL_CALL_CLOSE}"


@pytest.mark.parametrize(
    "body,problem",
    [
        ('{"name": "read_file", "arguments": {"target_file": "a.py"}', "invalid JSON"),
        ("{'name': 'read_file', 'arguments': {}}", "invalid JSON"),
        ("", "invalid JSON"),
        ('{"name": "x", "arguments": {}} trailing', "invalid JSON"),
        ('["read_file", {"target_file": "a.py"}]', "not a JSON object (got array)"),
        ('"read_file"', "not a JSON object (got string)"),
        ('{"arguments": {"target_file": "a.py"}}', 'missing "name"'),
        ('{"name": 3, "arguments": {}}', '"name" is not a string (got number)'),
        ('{"name": null, "arguments": {}}', '"name" is not a string (got null)'),
        ('{"name": "  ", "arguments": {}}', '"name" is empty'),
        ('{"name": "read_file"}', 'missing "arguments"'),
        (
            '{"name": "read_file", "arguments": "{\\"target_file\\": \\"a.py\\"}"}',
            '"arguments" is not a JSON object',
        ),
        ('{"name": "read_file", "arguments": [1, 2]}', '"arguments" is not a JSON object (got array)'),
        ('{"name": "read_file", "arguments": {}, "id": 7}', "unexpected keys ['id']"),
        ("[" * 100_000, "invalid JSON"),
    ],
)
def test_malformed_call_names_the_problem(body, problem):
    good = chat.format_call(GREP)
    parsed = chat.parse_assistant(f"Trying.\n{good}\n{_block(body)}\n{good}<|im_end|>")
    assert parsed.text == "Trying."
    assert len(parsed.calls) == 3
    assert parsed.calls[0] == GREP and parsed.calls[2] == GREP  # a bad call does not spoil its neighbours
    error = parsed.calls[1]
    assert isinstance(error, CallError)
    assert problem in error.message
    assert error.raw == _block(body)


def test_unclosed_call():
    parsed = chat.parse_assistant(
        'Let me read.\n<tool_call>\n{"name": "read_file", "arguments": {}}<|im_end|>'
    )
    assert parsed.text == "Let me read."
    [error] = parsed.calls
    assert isinstance(error, CallError) and "unclosed <tool_call>" in error.message
    assert error.raw == '<tool_call>\n{"name": "read_file", "arguments": {}}'


def test_unclosed_call_followed_by_a_good_one():
    good = chat.format_call(READ)
    parsed = chat.parse_assistant(f'<tool_call>\n{{"name": "grep"\n{good}')
    assert len(parsed.calls) == 2
    assert isinstance(parsed.calls[0], CallError) and "unclosed" in parsed.calls[0].message
    assert parsed.calls[1] == READ


def test_stray_closing_tag():
    good = chat.format_call(READ)
    parsed = chat.parse_assistant(f"Oops </tool_call> then {good}")
    assert parsed.text == "Oops\nthen"
    assert isinstance(parsed.calls[0], CallError) and "stray </tool_call>" in parsed.calls[0].message
    assert parsed.calls[0].raw == "</tool_call>"
    assert parsed.calls[1] == READ


def test_parse_never_raises_on_random_input():
    rng = random.Random(0)
    atoms = [
        chat.TOOL_CALL_OPEN,
        chat.TOOL_CALL_CLOSE,
        chat.IM_END,
        chat.IM_START,
        "<tool_call",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        ":",
        ",",
        '"',
        "\\",
        "\\u",
        "\n",
        " ",
        "null",
        "1e999",
        "-",
        "9" * 5000,
        "read_file",
        "\ud800",
        "🙂",
        "\x00",
    ]
    for _ in range(3000):
        n = rng.randrange(0, 30)
        pieces = [
            rng.choice(atoms) if rng.random() < 0.8 else chr(rng.randrange(0, sys.maxunicode))
            for _ in range(n)
        ]
        text = "".join(pieces)
        parsed = chat.parse_assistant(text)
        assert isinstance(parsed, ParsedTurn) and isinstance(parsed.text, str)
        turn = text.split(chat.IM_END, 1)[0]
        n_open, n_close = turn.count(chat.TOOL_CALL_OPEN), turn.count(chat.TOOL_CALL_CLOSE)
        # Every opening tag gives one entry; a closing tag either closes one or is a stray error.
        assert n_open <= len(parsed.calls) <= n_open + n_close
        for c in parsed.calls:
            if isinstance(c, ToolCall):
                assert isinstance(c.name, str) and isinstance(c.arguments, dict)
            else:
                assert isinstance(c, CallError) and c.message
    # Not even a non-string breaks it.
    assert isinstance(chat.parse_assistant(None).calls[0], CallError)  # type: ignore[arg-type]


def test_random_calls_round_trip():
    rng = random.Random(1)

    def value(depth: int):
        kind = rng.randrange(7 if depth < 3 else 5)
        if kind == 0:
            return rng.randrange(-(10**6), 10**6)
        if kind == 1:
            return rng.choice([True, False, None, 0.5, -1e-3])
        if kind in (2, 3, 4):
            alphabet = 'ab \n\t"\\/<>{}[]:,é漢🙂' + chat.TOOL_CALL_CLOSE + chat.IM_END
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{i}\n": value(depth + 1) for i in range(rng.randrange(4))}

    for _ in range(300):
        calls = [
            ToolCall(rng.choice(["read_file", "grep", "write"]), {"a": value(0), "b": value(0)})
            for _ in range(rng.randrange(4))
        ]
        text = rng.choice(["", "ok", "Looking at it:\n  - first\n  - second"])
        assert chat.parse_assistant(chat.assistant_body(Message("assistant", text, calls))) == ParsedTurn(
            text.strip(), calls
        )


def test_message_dict_round_trip():
    messages = [
        chat.system_message([{"name": "grep"}], "sys"),
        Message("user", "u"),
        Message("assistant", "a", [READ, NESTED]),
        Message("tool", "r"),
    ]
    dumped = json.loads(json.dumps([chat.message_to_dict(m) for m in messages]))
    assert [chat.message_from_dict(d) for d in dumped] == messages
    assert chat.message_from_dict({"role": "user"}) == Message("user")


@pytest.mark.parametrize(
    "text,reasoning,answer",
    [
        ("<think>\nThe sign.\n</think>\n\nFixed.", "The sign.", "Fixed."),
        ("\n<think>\n\n</think>\n\n<tool_call>", "", "<tool_call>"),
        ("<think>\nstill thinking\n", "still thinking", ""),
        ("No block. <think>x</think>", "", "No block. <think>x</think>"),
    ],
)
def test_split_reasoning(text, reasoning, answer):
    assert chat.split_reasoning(text) == (reasoning, answer)
