"""A checkpoint's tokenizer (tokenizer.json, chat template) made fit for composer's chat format.

    tokenizer = load_tokenizer(directory, vocab_size=cfg.vocab_size)

composer renders conversations itself (env.chat: ChatML turns, `<tool_call>` JSON blocks, tool results
in `<tool_response>` blocks, the layout of Qwen3's template) and needs each of chat.SPECIAL_TOKENS to be one
id of the checkpoint's tokenizer:

- A tokenizer that has them (Qwen3) is used as is: `<|im_start|>` etc. keep the checkpoint's ids, so the
  model sees exactly what it was trained on.
- A tokenizer that lacks some (OLMoE's and Mixtral's have no `<|im_start|>` nor `<tool_call>`) gets them as
  added special tokens, at the ids after its last one, provided the model's embedding has rows for them
  (config.json's vocab_size > the tokenizer's size: OLMoE has 50304 rows for 50280 tokens). Those rows were
  never trained, so such a model needs SFT on the format before RL. With no room (Mixtral: 32000 rows, 32000
  tokens) it is an error: composer does not resize a checkpoint's embedding.
- A SentencePiece-style tokenizer (Mistral / Mixtral, Llama 2) puts '▁' before the first word of every
  encode call. composer encodes a conversation segment by segment, which would insert a space at every
  segment; the prefix is switched off (pre-tokenizer / normaliser) and the decoder's matching strip of one
  leading space removed, so that segments concatenate and `decode(encode(s)) == s`.

The result is checked on a conversation with tool calls (segment-wise ids equal the whole text's ids, and
decode gives the text back); a tokenizer that fails is an error, never a silent mis-tokenisation.

Conversations are rendered with the checkpoint's own chat template when it has one (`chat_template`
'checkpoint', env.chat_format.TemplateFormat: its system text, its tool schemas, its turn layout, as
`transformers` renders it), else, or with 'native', in composer's own format.
"""

import json
from pathlib import Path

import tokenizers as hf
from absl import logging

from env import chat
from env.chat_format import NATIVE, ChatFormat, TemplateFormat
from env.tokenizer import Tokenizer, render

_PROBE = [
    chat.Message("system", "You fix bugs."),
    chat.Message("user", "add(2, 3) returns -1 in calc.py"),
    chat.Message(
        "assistant",
        "Reading it.",
        [
            chat.ToolCall("read_file", {"target_file": "calc.py"}),
            chat.ToolCall("grep", {"pattern": "  add("}),
        ],
    ),
    chat.Message("tool", "def add(a, b):\n    return a - b\n"),
    chat.Message("tool", "calc.py:1:def add(a, b):"),
    chat.Message("assistant", "", [chat.ToolCall("write", {"file_path": "x.py", "contents": " é\t€ 1+1 "})]),
    chat.Message("tool", " done"),
    chat.Message("assistant", "Fixed."),
]


def chat_template(directory: str | Path) -> str | None:
    """The checkpoint's chat template: chat_template.jinja, else tokenizer_config.json's "chat_template"."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text()
    config = directory / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template
    return None


CHAT_TEMPLATES = ("checkpoint", "native")


def special_tokens(directory: str | Path) -> dict[str, str]:
    """tokenizer_config.json's named special tokens (bos_token, eos_token...): a template may use them."""
    config = Path(directory) / "tokenizer_config.json"
    if not config.is_file():
        return {}
    out = {}
    for key, value in json.loads(config.read_text()).items():
        if key.endswith("_token") and isinstance(value, dict):
            value = value.get("content")
        if key.endswith("_token") and isinstance(value, str):
            out[key] = value
    return out


def check_chat_template(choice: str) -> None:
    """Raises ValueError, naming model.chat_template, unless `choice` is one of CHAT_TEMPLATES."""
    if choice not in CHAT_TEMPLATES:
        raise ValueError(f"model.chat_template must be one of {CHAT_TEMPLATES}, not {choice!r}")


def chat_format(directory: str | Path, choice: str = "checkpoint") -> ChatFormat:
    """The chat format of the checkpoint at `directory`: its own template ('checkpoint', when it has one)
    or composer's ('native'). Raises ValueError for a template composer cannot read (env.chat_format)."""
    check_chat_template(choice)
    template = chat_template(directory) if choice == "checkpoint" else None
    if template is None:
        return NATIVE
    try:
        return TemplateFormat.load(template, special_tokens(directory))
    except ValueError as e:
        raise ValueError(f"{directory}: {e}") from e


def _without_prefix_space(spec: dict) -> tuple[dict, bool]:
    """The tokenizer.json spec with SentencePiece's per-call '▁' prefix switched off; (spec, changed)."""
    changed = False

    def visit(node: dict | None, kind: str) -> dict | None:
        nonlocal changed
        if node is None:
            return None
        if node.get("type") == "Sequence":
            key = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders"}[kind]
            parts = [visit(n, kind) for n in node[key]]
            node[key] = [n for n in parts if n is not None]
            return node
        if node.get("type") == "Metaspace" and node.get("prepend_scheme", "always") != "never":
            node["prepend_scheme"] = "never"
            node.pop("add_prefix_space", None)
            changed = True
            return node
        prepend = kind == "normalizer" and node.get("type") == "Prepend"
        strip_first = kind == "decoder" and node.get("type") == "Strip" and node.get("start", 0) > 0
        if prepend or strip_first:  # the normaliser's '▁' prefix and the decoder's removal of it
            changed = True
            return None
        return node

    for kind in ("normalizer", "pre_tokenizer", "decoder"):
        spec[kind] = visit(spec.get(kind), kind)
    return spec, changed


def _add_chat_tokens(tokenizer: Tokenizer, vocab_size: int) -> list[str]:
    """Adds the chat special tokens the tokenizer lacks (see the module docstring); returns them."""
    missing = [t for t in chat.SPECIAL_TOKENS if tokenizer.backend.token_to_id(t) is None]
    if not missing:
        return []
    room = vocab_size - tokenizer.vocab_size
    if room < len(missing):
        raise ValueError(
            f"the tokenizer lacks the chat tokens {missing} and the model has no embedding rows to add them "
            f"(vocab_size {vocab_size}, tokenizer {tokenizer.vocab_size}); use a checkpoint whose tokenizer "
            "has them (e.g. Qwen3) or one with spare rows"
        )
    tokenizer.backend.add_special_tokens([hf.AddedToken(t, special=True, normalized=False) for t in missing])
    ids = [tokenizer.token_id(t) for t in missing]
    if max(ids) >= vocab_size:
        raise ValueError(f"the added chat tokens got ids {ids}, beyond the model's vocab_size {vocab_size}")
    logging.warning(
        "tokenizer: added the chat tokens %s as ids %s (untrained embedding rows: fine-tune before RL)",
        missing,
        ids,
    )
    return missing


def check_chat_round_trip(tokenizer: Tokenizer) -> None:
    """Raises ValueError unless a conversation with tool calls renders (segment by segment, in the
    tokenizer's chat format) to the ids of its whole text, decodes back to that text, and its assistant turn
    parses back to the same calls."""
    text = "".join(t for t, _ in tokenizer.chat_format.render_segments(_PROBE))
    ids, _ = render(_PROBE, tokenizer)
    if list(ids) != tokenizer.encode(text):
        raise ValueError("the tokenizer encodes a conversation differently segment by segment than whole")
    if tokenizer.decode(ids) != text:
        raise ValueError("the tokenizer does not decode a conversation back to its text")
    for token in chat.SPECIAL_TOKENS:
        if tokenizer.encode(token) != [tokenizer.token_id(token)]:
            raise ValueError(f"the tokenizer does not encode {token!r} as its single id")
    body = tokenizer.chat_format.assistant_text(_PROBE[2])
    parsed = tokenizer.chat_format.parse_assistant(tokenizer.decode(tokenizer.encode(body)))
    if parsed.calls != _PROBE[2].tool_calls:
        raise ValueError(f"tool calls do not survive encode / decode / parse: {parsed.calls}")


def load_tokenizer(directory: str | Path, vocab_size: int, chat_template: str = "checkpoint") -> Tokenizer:
    """The checkpoint's tokenizer.json, with the chat special tokens, ready for env.tokenizer.render.

    vocab_size: the model's (config.json's) number of embedding rows. chat_template: 'checkpoint' renders
    conversations with the checkpoint's template when it has one, 'native' with composer's own format.
    Raises ValueError when the tokenizer cannot serve the chat format (see the module docstring).
    """
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: no tokenizer.json (only fast tokenizers are read)")
    spec, changed = _without_prefix_space(json.loads(path.read_text()))
    if changed:
        logging.info("tokenizer: switched off the per-call '▁' prefix of a SentencePiece-style tokenizer")
    tokenizer = Tokenizer(hf.Tokenizer.from_str(json.dumps(spec)))
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the model only {vocab_size} rows")
    _add_chat_tokens(tokenizer, vocab_size)
    tokenizer.chat_format = chat_format(directory, chat_template)
    check_chat_round_trip(tokenizer)
    logging.info(
        "tokenizer: conversations in %s",
        "composer's own chat format" if tokenizer.chat_format is NATIVE else "the checkpoint's chat template",
    )
    return tokenizer
