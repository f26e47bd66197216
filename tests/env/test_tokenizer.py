"""The byte-level BPE tokenizer and the rendering of conversations to ids and loss masks."""

import json
import random
import time

import numpy as np
import pytest
import tokenizers as hf

from env import chat
from env import tokenizer as tk
from env.chat import Message, ToolCall

SOURCE = '''\
def mean(xs: list[float]) -> float:
    """Arithmetic mean."""
    if not xs:
        raise ValueError("empty")
    return sum(xs) / len(xs)


class Stack:
    def __init__(self):
        self.items = []

    def push(self, x):
        self.items.append(x)
'''


def _corpus(n: int = 200) -> list[str]:
    rng = random.Random(0)
    texts = []
    for i in range(n):
        name = rng.choice(["mean", "total", "count_items", "parse_line"])
        # Made-up words, so that the corpus has merges to learn (digits are never merged).
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        texts.append(SOURCE.replace("mean", name).replace("Stack", f"Stack{word.title()}{i}"))
        call = ToolCall("read_file", {"target_file": f"pkg/{word}_{i}.py"})
        conv = [
            Message("user", f"Fix bug {i}"),
            Message("assistant", "Reading.", [call]),
            Message("tool", SOURCE),
        ]
        texts.append(chat.render_text(conv))
    return texts


@pytest.fixture(scope="module")
def tok() -> tk.Tokenizer:
    return tk.train_tokenizer(_corpus(), vocab_size=512)


def _conversation() -> list[Message]:
    read = ToolCall("read_file", {"target_file": "src/stats.py"})
    grep = ToolCall("grep", {"pattern": 'raise ValueError\\("', "path": "src", "-n": True})
    fix = ToolCall(
        "search_replace",
        {
            "file_path": "src/stats.py",
            "old_string": "    return sum(xs) / len(xs)\n",
            "new_string": "ü\t🙂\n",
        },
    )
    return [
        chat.system_message(
            [{"name": "read_file", "parameters": {"type": "object"}}], "You fix Python bugs."
        ),
        Message("user", "mean() of [] should raise.\n\n  Make the tests pass."),
        Message("assistant", "\n\n   Let me read the file and search.", [read, grep]),
        Message("tool", "     1|def mean(xs):\n     2|    return sum(xs) / len(xs)\n"),
        Message("tool", 'src/stats.py:4:        raise ValueError("empty")'),
        Message("assistant", "", [fix]),
        Message("tool", "The file src/stats.py has been updated."),
        Message("assistant", "  Done: the empty case raises now.  "),
    ]


def test_training_is_fast_and_sized():
    corpus = _corpus(400)
    start = time.perf_counter()
    t = tk.train_tokenizer(corpus, vocab_size=1024)
    assert time.perf_counter() - start < 10.0
    assert t.vocab_size == 1024
    with pytest.raises(ValueError, match="vocab_size"):
        tk.train_tokenizer(corpus, vocab_size=200)


def test_special_tokens_are_single_ids(tok):
    ids = [tok.token_id(t) for t in chat.SPECIAL_TOKENS]
    assert len(set(ids)) == len(chat.SPECIAL_TOKENS)
    for token, i in zip(chat.SPECIAL_TOKENS, ids):
        assert tok.encode(token) == [i]
        assert tok.encode(f"x = a{token}b\n") == tok.encode("x = a") + [i] + tok.encode("b\n")
        assert tok.decode([i]) == token
    assert (tok.im_start_id, tok.im_end_id, tok.pad_id) == (
        tok.token_id("<|im_start|>"),
        tok.token_id("<|im_end|>"),
        tok.token_id("<|endoftext|>"),
    )
    # No merge was spent on spelling a special token out of bytes, though the corpus is full of them.
    spelled = [
        t for t in tok.backend.get_vocab() if t not in chat.SPECIAL_TOKENS and ("im_" in t or "|>" in t)
    ]
    assert spelled == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        SOURCE,
        "    indented\n\t\ttabs\r\nCRLF   trailing   \n\n\n",
        "ünïcödé, 日本語, emoji 🙂👍🏽, combining e\u0301 vs é, zero-width\u200b, NUL \x00 and \x7f",
        "x = '<|im_start|>' + \"</tool_call>\"  # markup inside code",
        "  leading spaces and a final space ",
    ],
)
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_decode_inverts_encode_on_random_unicode(tok):
    rng = random.Random(0)
    for _ in range(200):
        chars = [
            chr(
                rng.choice(
                    [rng.randrange(32, 127), rng.randrange(0, 0xD800), rng.randrange(0xE000, 0x10FFFF)]
                )
            )
            for _ in range(rng.randrange(40))
        ]
        text = "".join(chars)
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode(np.asarray(tok.encode(text), np.int32)) == text


def test_save_load_round_trip(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = tk.Tokenizer.load(path)
    assert loaded.vocab_size == tok.vocab_size
    assert (loaded.im_start_id, loaded.im_end_id, loaded.pad_id) == (
        tok.im_start_id,
        tok.im_end_id,
        tok.pad_id,
    )
    text = chat.render_text(_conversation())
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text


def test_load_foreign_tokenizer_json(tmp_path):
    # A tokenizer built elsewhere, its special tokens added after training (ids at the end, as in Qwen3).
    backend = hf.Tokenizer(hf.models.BPE())
    backend.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = hf.decoders.ByteLevel()
    trainer = hf.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    backend.train_from_iterator([SOURCE] * 10, trainer=trainer)
    n_base = backend.get_vocab_size()
    backend.add_special_tokens(chat.SPECIAL_TOKENS)
    backend.save(str(tmp_path / "tokenizer.json"))
    loaded = tk.Tokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.im_start_id == n_base and loaded.im_end_id == n_base + 1 and loaded.pad_id == n_base + 6
    assert loaded.vocab_size == n_base + len(chat.SPECIAL_TOKENS)
    ids, mask = tk.render(_conversation(), loaded)
    assert ids.tolist() == loaded.encode(chat.render_text(_conversation()))
    # One lacking the chat tokens loads but says which token is missing when asked.
    bare = hf.Tokenizer(hf.models.BPE())
    bare.save(str(tmp_path / "bare.json"))
    with pytest.raises(KeyError, match="im_end"):
        _ = tk.Tokenizer.load(tmp_path / "bare.json").im_end_id


def _expected_generated(m: Message) -> str:
    """The assistant's own text of one turn, written out independently of chat.render_segments."""
    parts = [m.content.lstrip()] if m.content.strip() else []
    for c in m.tool_calls:
        parts.append(
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
        )
    return "\n".join(parts) + "<|im_end|>"


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return list(zip(edges[::2], edges[1::2]))


def test_render_ids_and_loss_mask(tok):
    messages = _conversation()
    ids, mask = tk.render(messages, tok)
    assert ids.dtype == np.int32 and mask.dtype == np.int32 and ids.shape == mask.shape
    assert set(np.unique(mask)) == {0, 1}
    # Per-segment encoding gives exactly the tokens of the whole text.
    assert ids.tolist() == tok.encode(chat.render_text(messages))
    # One masked run per assistant turn; each decodes to that turn's text + calls + <|im_end|>.
    runs = _runs(mask)
    assistant = [m for m in messages if m.role == "assistant"]
    assert len(runs) == len(assistant)
    for (a, b), m in zip(runs, assistant):
        assert tok.decode(ids[a:b]) == _expected_generated(m)
        assert ids[b - 1] == tok.im_end_id
        # Just before the run: the unmasked header <|im_start|>assistant\n; just after: the unmasked "\n".
        assert tok.decode(ids[:a]).endswith("<|im_start|>assistant\n")
        assert tok.decode(ids[b : b + 1]) == "\n"
    assert tok.decode(ids[mask == 1]) == "".join(_expected_generated(m) for m in assistant)
    # Nothing of the system, user or tool turns is masked in.
    assert "<tool_response>" not in tok.decode(ids[mask == 1])


def test_render_matches_whole_encode_on_random_conversations(tok):
    rng = random.Random(3)
    alphabet = [
        "a",
        "b",
        " ",
        "  ",
        "\n",
        "\n\n",
        "\t",
        "def",
        "(",
        ")",
        ":",
        "é",
        "🙂",
        "x1",
        "'",
        '"',
        "\\",
    ]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(10)))

    for _ in range(100):
        messages = [Message("system", text()), Message("user", text())]
        for _ in range(rng.randrange(1, 4)):
            calls = [ToolCall(text(), {text(): text()}) for _ in range(rng.randrange(3))]
            messages.append(Message("assistant", text(), calls))
            messages += [Message("tool", text()) for _ in calls]
        ids, mask = tk.render(messages, tok)
        assert ids.tolist() == tok.encode(chat.render_text(messages))
        assistant = [m for m in messages if m.role == "assistant"]
        assert tok.decode(ids[mask == 1]) == "".join(_expected_generated(m) for m in assistant)
        prompt = tk.render_prompt(messages, tok)
        assert prompt.tolist() == tok.encode(chat.render_text(messages, add_generation_prompt=True))


def test_render_prompt_extends_the_conversation(tok):
    messages = _conversation()[:2]
    prompt = tk.render_prompt(messages, tok)
    ids, mask = tk.render(messages, tok)
    assert prompt.dtype == np.int32
    assert prompt[: len(ids)].tolist() == ids.tolist() and not mask.any()
    assert tok.decode(prompt[len(ids) :]) == "<|im_start|>assistant\n"
    assert prompt[len(ids)] == tok.im_start_id


def test_a_number_is_the_same_ids_wherever_it_stands(tok):
    # Line 24 in a grep result and in a read_file call: the model copies one into the other.
    digits = tok.encode("24")
    assert len(digits) == 2
    for text in ("src/stats.py:24:def mean(xs):", '{"offset": 24, "limit": 5}', "    24|def mean", "x=124"):
        ids = tok.encode(text)
        assert any(ids[i : i + 2] == digits for i in range(len(ids) - 1)), text


def _edit_corpus(n: int = 60) -> list[str]:
    """Conversations in which a grep shows a line of code and a call copies it into a JSON string."""
    texts = []
    for i in range(n):
        line = f"        if best is None or v{i % 7} <= best:"
        call = ToolCall("search_replace", {"file_path": "pkg/a.py", "old_string": line, "new_string": "x"})
        conv = [Message("tool", f"pkg/a.py-{i}-{line}\npkg/a.py-{i + 1}-    return out\n")]
        texts.append(chat.render_text([*conv, Message("assistant", "Fix.", [call])]))
    return texts


@pytest.mark.parametrize("split", [False, True])
def test_split_closing_quotes_keeps_a_copied_line_end(split):
    corpus = _edit_corpus()
    t = tk.train_tokenizer(corpus, vocab_size=400, split_closing_quotes=split)
    line = "        if best is None or v3 <= best:"
    call = json.dumps({"old_string": line, "new_string": "x"})
    pieces = [t.decode([i]) for i in t.encode(call)]
    # Where the line stands in the call: its tokens up to the closing quote.
    ends = np.cumsum([len(piece) for piece in pieces])
    k = int(np.searchsorted(ends, len('{"old_string": "') + len(line)))
    ends_clean = "".join(pieces[: k + 1]) == '{"old_string": "' + line
    in_result = [t.decode([i]) for i in t.encode(f"pkg/a.py-3-{line}\n")]
    if split:
        # The line's last token is the grep result's, and the quote after it is a token of its own.
        assert ends_clean and pieces[k] == in_result[-2] == ":" and pieces[k + 1] == '"'
        assert t.decode(t.encode(call)) == call
        escaped = 'f(\\"a\\", \\"b\\")"}'
        assert t.decode(t.encode(escaped)) == escaped
    else:
        # The plain byte-level regex merges the line's colon with the quote after it.
        assert not ends_clean
