"""A checkpoint's tokenizer under composer's chat format: the checkpoint's special-token ids, the chat
template's rendering, tool calls parsed back; tokenizers that lack the chat tokens or add a prefix space."""

import json
from pathlib import Path

import pytest
import tokenizers as hf

from composer.checkpoints import hf_tokenizer, read_hf_config
from env import chat
from env.chat_format import NATIVE, TemplateFormat
from env.tokenizer import Tokenizer, render, render_prompt
from env.tools import tool_schemas

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
ARCHS = ("qwen3_moe", "olmoe", "mixtral")


def _load(arch: str) -> Tokenizer:
    directory = FIXTURES / arch
    return hf_tokenizer.load_tokenizer(directory, read_hf_config(directory)["vocab_size"])


def _reference(arch: str) -> tuple[list[chat.Message], str]:
    """The fixture's conversation (transformers' message dicts) and the chat template's rendering of it."""
    ref = json.loads((FIXTURES / arch / "chat_reference.json").read_text())
    messages = [
        chat.Message(
            m["role"],
            m["content"],
            [
                chat.ToolCall(c["function"]["name"], c["function"]["arguments"])
                for c in m.get("tool_calls", [])
            ],
        )
        for m in ref["messages"]
    ]
    return messages, ref["text"]


@pytest.mark.parametrize("arch", ARCHS)
def test_special_tokens_keep_the_checkpoint_ids(arch):
    tok = _load(arch)
    raw = json.loads((FIXTURES / arch / "tokenizer.json").read_text())
    checkpoint_ids = {t["content"]: t["id"] for t in raw["added_tokens"]}
    for token in chat.SPECIAL_TOKENS:
        assert tok.token_id(token) == checkpoint_ids[token]
        assert tok.encode(f"a{token}b").count(checkpoint_ids[token]) == 1
    assert tok.im_end_id == checkpoint_ids["<|im_end|>"]


@pytest.mark.parametrize("arch", ARCHS)
def test_renders_like_the_chat_template_and_parses_the_calls_back(arch):
    tok = _load(arch)
    messages, template_text = _reference(arch)
    assert "<tool_call>" in hf_tokenizer.chat_template(FIXTURES / arch)
    assert chat.render_text(messages) == template_text
    ids, mask = render(messages, tok)
    assert tok.decode(ids) == template_text
    assert list(ids) == tok.encode(template_text)
    # What the model would generate for the first assistant turn, decoded and parsed: the same calls.
    start = len(render_prompt(messages[:2], tok))
    end = start + list(mask[start:]).index(0)
    generated = tok.decode(ids[start:end])
    assert generated.endswith(chat.IM_END)
    parsed = chat.parse_assistant(generated)
    assert parsed.text == messages[2].content
    assert parsed.calls == messages[2].tool_calls


def test_sentencepiece_prefix_space_is_switched_off():
    """The Mixtral-style fixture prepends '▁' per encode call: as stored it fails the round trip; loaded, it
    passes, and only the tokenizer's pre-tokenizer and decoder changed."""
    raw = Tokenizer.load(FIXTURES / "mixtral" / "tokenizer.json")
    with pytest.raises(ValueError, match="segment by segment"):
        hf_tokenizer.check_chat_round_trip(raw)
    tok = _load("mixtral")
    assert tok.decode(tok.encode(" two  spaces\tand é€")) == " two  spaces\tand é€"
    assert raw.backend.get_vocab() == tok.backend.get_vocab()
    assert tok.encode("x\n<|im_end|>") == raw.encode("x\n<|im_end|>")[1:]  # no leading '▁' token


def _without_chat_tokens(tmp_path: Path, vocab_size: int) -> Path:
    """The OLMoE-style fixture tokenizer with the chat tokens removed (like OLMoE's real one)."""
    spec = json.loads((FIXTURES / "olmoe" / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] not in chat.SPECIAL_TOKENS[:-1]]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return tmp_path


def test_missing_chat_tokens_are_added_in_spare_rows(tmp_path):
    before = Tokenizer.load(_without_chat_tokens(tmp_path, 302) / "tokenizer.json")
    assert before.backend.token_to_id("<|im_start|>") is None
    tok = hf_tokenizer.load_tokenizer(tmp_path, 302)
    ids = [tok.token_id(t) for t in chat.SPECIAL_TOKENS[:-1]]
    assert ids == list(range(before.vocab_size, before.vocab_size + 6)) and max(ids) < 302
    assert tok.encode("hello world") == before.encode("hello world")  # existing ids unchanged
    messages, text = _reference("olmoe")
    assert tok.decode(render(messages, tok)[0]) == text


def test_missing_chat_tokens_without_spare_rows_is_an_error(tmp_path):
    directory = _without_chat_tokens(tmp_path, 282)
    with pytest.raises(ValueError, match="no embedding rows"):
        hf_tokenizer.load_tokenizer(directory, 282)


def test_tokenizer_larger_than_the_model_is_an_error():
    with pytest.raises(ValueError, match="rows"):
        hf_tokenizer.load_tokenizer(FIXTURES / "qwen3_moe", 200)


def test_chat_template_from_a_jinja_file(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert hf_tokenizer.chat_template(tmp_path) == "{{ messages }}"
    assert hf_tokenizer.chat_template(tmp_path / "nowhere") is None


def test_a_tokenizer_that_normalises_text_is_refused(tmp_path):
    """A lowercasing normaliser would change what the model reads: the round-trip check catches it."""
    spec = json.loads((FIXTURES / "qwen3_moe" / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert hf.Tokenizer.from_file(str(tmp_path / "tokenizer.json")).normalizer is not None
    with pytest.raises(ValueError, match="decode"):
        hf_tokenizer.load_tokenizer(tmp_path, 303)


def _with_template(tmp_path: Path, template: str) -> Path:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (directory / name).write_text((FIXTURES / "qwen3_moe" / name).read_text())
    (directory / "chat_template.jinja").write_text(template)
    return directory


def test_a_checkpoint_s_own_template_is_used_unless_native_is_asked_for(tmp_path):
    qwen3 = (FIXTURES.parent / "chat_templates" / "qwen3.jinja").read_text()
    directory = _with_template(tmp_path, qwen3)
    vocab = read_hf_config(directory)["vocab_size"]
    tok = hf_tokenizer.load_tokenizer(directory, vocab)
    assert isinstance(tok.chat_format, TemplateFormat) and tok.chat_format.source == qwen3
    assert dict(tok.chat_format.special)["eos_token"] == "<|im_end|>"
    messages, _ = _reference("qwen3_moe")
    prompt = [chat.system_message(tool_schemas(), messages[0].content), messages[1]]
    assert tok.decode(render_prompt(prompt, tok)) == tok.chat_format.render(prompt, True)
    assert "# Tools\n\nYou may call one or more functions" in tok.chat_format.render(prompt, True)
    assert tok.decode(render_prompt(prompt, tok)) != chat.render_text(prompt, True)
    assert hf_tokenizer.load_tokenizer(directory, vocab, "native").chat_format is NATIVE
    with pytest.raises(ValueError, match="model.chat_template"):
        hf_tokenizer.load_tokenizer(directory, vocab, "qwen")


def test_a_template_composer_cannot_read_is_an_error_naming_the_checkpoint(tmp_path):
    directory = _with_template(
        tmp_path, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    )
    with pytest.raises(ValueError, match=f"{directory}.*native"):
        hf_tokenizer.load_tokenizer(directory, read_hf_config(directory)["vocab_size"])
    tok = hf_tokenizer.load_tokenizer(directory, read_hf_config(directory)["vocab_size"], "native")
    assert tok.chat_format is NATIVE
