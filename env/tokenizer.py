"""Byte-level BPE tokenizer (Hugging Face `tokenizers`) and the rendering of conversations to ids + loss mask.

Byte-level means every string round-trips exactly through encode/decode: no normalisation, no unknown token,
whitespace and indentation kept. The chat special tokens (`chat.SPECIAL_TOKENS`) are single ids, and their
strings inside a text encode to those ids. Any `tokenizer.json` that has them (a Qwen3 one, say) loads.
"""

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import tokenizers as hf

from env import chat
from env.chat_format import NATIVE, ChatFormat

_SPECIAL_SPLIT = re.compile("|".join(re.escape(t) for t in chat.SPECIAL_TOKENS))


class Tokenizer:
    """A thin wrapper over a `tokenizers.Tokenizer` that never adds BOS/EOS and decodes special tokens.

    `chat_format` (env.chat_format): how conversations render to text for this vocabulary: composer's own
    format, or a checkpoint's chat template (composer.checkpoints.load_tokenizer sets it).
    """

    def __init__(self, backend: hf.Tokenizer, chat_format: ChatFormat = NATIVE):
        self.backend = backend
        self.chat_format = chat_format

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Loads any `tokenizer.json`."""
        return cls(hf.Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        """Writes `tokenizer.json` (the Hugging Face format, loadable by `transformers` too)."""
        self.backend.save(str(path))

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; special-token strings in it become their single ids."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text (one call into the library, which runs them in parallel)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens included; `decode(encode(s)) == s` for a byte-level BPE."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_id(self, token: str) -> int:
        """The id of one token string; raises KeyError when the vocabulary lacks it."""
        i = self.backend.token_to_id(token)
        if i is None:
            raise KeyError(f"the tokenizer has no token {token!r}")
        return i

    @property
    def vocab_size(self) -> int:
        """Number of ids, added (special) tokens included: the model's vocab must be at least this."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def im_start_id(self) -> int:
        return self.token_id(chat.IM_START)

    @property
    def im_end_id(self) -> int:
        return self.token_id(chat.IM_END)

    @property
    def pad_id(self) -> int:
        return self.token_id(chat.PAD)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    split_closing_quotes: bool = False,
    whole_words: tuple[str, ...] = (),
) -> Tokenizer:
    """Trains a byte-level BPE of `vocab_size` ids (256 bytes + the chat special tokens + merges).

    The special tokens take ids 0..len(SPECIAL_TOKENS)-1. Texts are cut at special-token strings before
    training so that no merge is spent on spelling them out.

    With `split_closing_quotes` a double quote right after a non-space character (but a backslash) is a
    token of its own. A tool call's string argument that ends a line of code then ends in the same tokens
    as the line does in the tool result it was copied from: `best:` then `"`, where the plain regex merges
    the line's last punctuation with the quote and what follows (`:",`, `)"}}`), a token no copy of the
    line contains.
    """
    n_min = 256 + len(chat.SPECIAL_TOKENS)
    if vocab_size < n_min:
        raise ValueError(f"vocab_size {vocab_size} is below {n_min} (256 bytes + special tokens)")
    backend = hf.Tokenizer(hf.models.BPE())
    # add_prefix_space=False and no normaliser: the ids decode back to the exact input bytes. Digits are
    # split off one by one first (as Qwen's and LLaMA's tokenizers do), so a number is the same ids
    # wherever it stands: line 24 of a grep result (`:24:`) and `"offset": 24` in a call share '2' '4',
    # where the byte-level regex alone gives '24' and ' 24', and the model could not copy one to the other.
    splits = [hf.pre_tokenizers.Split(hf.Regex(r"\p{N}"), behavior="isolated")]
    if split_closing_quotes:
        splits.append(hf.pre_tokenizers.Split(hf.Regex(r'(?<=[^\s"\\])"'), behavior="isolated"))
    backend.pre_tokenizer = hf.pre_tokenizers.Sequence(
        [*splits, hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    backend.decoder = hf.decoders.ByteLevel()
    special = [hf.AddedToken(t, special=True, normalized=False) for t in chat.SPECIAL_TOKENS]
    trainer = hf.trainers.BpeTrainer(
        vocab_size=vocab_size - len(whole_words),
        special_tokens=special,
        initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def pieces() -> Iterable[str]:
        for text in texts:
            yield from (p for p in _SPECIAL_SPLIT.split(text) if p)

    backend.train_from_iterator(pieces(), trainer=trainer)
    if whole_words:
        backend.add_tokens([hf.AddedToken(w, special=False, normalized=False) for w in whole_words])
    return Tokenizer(backend)


def render(messages: list[chat.Message], tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """A conversation as token ids and a loss mask, in the tokenizer's chat format (its stream view: see
    env.chat_format).

    Returns (ids [t] int32, loss_mask [t] int32) where loss_mask is 1 exactly on the tokens of each assistant
    turn's text, calls and closing `<|im_end|>`, 0 elsewhere. The segments of the format's `render_segments`
    are encoded one by one; every segment boundary sits next to a special token or right after a newline,
    so with composer's own format `ids == encode(render_text(messages))`.
    """
    return _render(tokenizer.chat_format.render_segments(messages), tokenizer)


def render_prompt(messages: list[chat.Message], tokenizer: Tokenizer) -> np.ndarray:
    """Ids [t] int32 of the conversation then the generation prompt (`<|im_start|>assistant\\n`), in the
    tokenizer's chat format: the prompt to generate from."""
    return np.asarray(tokenizer.encode(tokenizer.chat_format.prompt_text(messages)), np.int32)


def _render(segments: list[tuple[str, bool]], tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    encoded = tokenizer.encode_batch([text for text, _ in segments])
    ids = np.fromiter((i for seg in encoded for i in seg), dtype=np.int32)
    mask = np.concatenate(
        [np.full(len(seg), int(generated), np.int32) for seg, (_, generated) in zip(encoded, segments)]
        or [np.zeros(0, np.int32)]
    )
    return ids, mask
