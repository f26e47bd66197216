"""The learned code-search encoder at inference: its tokenizer and a NumPy forward pass (no JAX in tools).

A model directory (written by `python -m composer.search_model train --out DIR`) holds:

    config.json   the shapes (EncoderConfig's fields); `dense_weight`, the weight of the cosine ranking in
                  codebase_search's fusion, fitted on validation suites (1 when absent)
    vocab.json    the tokenizer's pieces, most frequent first
    params.npz    the weights, flattened with '/' between levels of the params pytree

Tokens. `pieces(text)`: identifiers split at `_` and case changes, lower-cased, lightly stemmed, English stop
words dropped (the same pieces BM25 indexes, without the compound identifier whole); numbers of up to four
digits kept, longer ones as `<num>`. Ids: 0 pads, 1 and 2 mark a query and a code chunk (the first token of
every row, so one encoder serves both sides asymmetrically), then the vocabulary, then `hash_buckets` ids
that an unknown piece is hashed into (crc32), so no piece collapses into one unknown token.

Model (composer/search_model/encoder.py trains the same function in JAX): token plus learned position
embeddings, `n_layers` pre-norm bidirectional transformer layers (multi-head attention over the row's real
tokens, a ReLU MLP: cheaper than GELU's tanh in NumPy), a final RMSNorm, the mean over real tokens, a linear
projection, L2 normalisation.

`LearnedEncoder.encode` sorts texts by length and runs them in batches of BATCH rows padded to a length
bucket (BUCKETS), so the shapes are few and the padding small; vectors are cached by the blake2b hash of
the text, shared by every index of the process that uses the same model (`load` returns one encoder per
directory), so a repository snapshot is encoded once however many episodes search it.
"""

import dataclasses
import functools
import hashlib
import json
import math
import re
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from env.tools.codebase_search import _CASE_PARTS, _STOPWORDS, _stem

PAD, QUERY, CHUNK = 0, 1, 2
N_SPECIAL = 3
BUCKETS = (16, 32, 64, 128, 256)
BATCH = 64
CACHE_MAX = 1 << 18  # cached vectors per encoder (about 260 MB at d=256)

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 40000  # learned pieces (the vocabulary may hold fewer)
    hash_buckets: int = 4096
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    max_len: int = 256  # position embeddings
    query_len: int = 64  # tokens kept of a query, marker included
    chunk_len: int = 128  # tokens kept of a chunk
    rms_eps: float = 1e-6

    @property
    def n_embed(self) -> int:
        return N_SPECIAL + self.vocab_size + self.hash_buckets


@functools.lru_cache(maxsize=1 << 16)
def _ident_pieces(ident: str) -> tuple[str, ...]:
    if ident[0].isdigit():
        return (ident,) if len(ident) <= 4 else ("<num>",)
    parts = (p.lower() for piece in ident.split("_") for p in _CASE_PARTS.findall(piece))
    return tuple(_stem(t) for t in parts if len(t) > 1 and t not in _STOPWORDS)


def pieces(text: str) -> list[str]:
    """The tokenizer's pieces of `text` (module docstring)."""
    return [p for ident in _TOKEN.findall(text) for p in _ident_pieces(ident)]


class Tokenizer:
    """Pieces -> ids with hashed ids for unknown pieces."""

    def __init__(self, vocab: Sequence[str], hash_buckets: int):
        self.vocab = list(vocab)
        self.hash_buckets = hash_buckets
        self.ids = {p: N_SPECIAL + i for i, p in enumerate(self.vocab)}
        self._unknown_base = N_SPECIAL + len(self.vocab)

    def piece_id(self, piece: str) -> int:
        i = self.ids.get(piece)
        if i is None:
            i = self._unknown_base + zlib.crc32(piece.encode()) % self.hash_buckets
        return i

    def encode(self, text: str, marker: int, max_len: int) -> list[int]:
        """[marker] + the ids of the first max_len - 1 pieces."""
        out = [marker]
        for ident in _TOKEN.finditer(text):
            for p in _ident_pieces(ident.group()):
                out.append(self.piece_id(p))
                if len(out) == max_len:
                    return out
        return out


def bucket(n: int) -> int:
    """The smallest length bucket holding n tokens."""
    return next((b for b in BUCKETS if b >= n), BUCKETS[-1])


def pad_rows(rows: list[list[int]], length: int) -> np.ndarray:
    """[b, length] int32, rows cut or padded with PAD."""
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = r[:length]
        out[i, : len(r)] = r
    return out


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps) * w


def forward(params: dict, ids_bt: np.ndarray, cfg: EncoderConfig) -> np.ndarray:
    """NumPy forward: [b, t] ids (PAD-padded, marker first) -> [b, d] L2-normalised float32 vectors."""
    b, t = ids_bt.shape
    mask_bt = ids_bt != PAD
    x_btd = params["embed_vd"][ids_bt] + params["pos_td"][:t]
    n, h = cfg.n_heads, cfg.d_model // cfg.n_heads
    bias_bs = np.where(mask_bt, 0.0, -1e9).astype(np.float32)
    for layer in params["layers"]:
        y_btd = _rms_norm(x_btd, layer["attn_norm_d"], cfg.rms_eps)
        qkv = (y_btd.reshape(b * t, -1) @ layer["w_qkv_dk"]).reshape(b, t, 3, n, h)
        # [3, b*n, t, h], contiguous: per-(row, head) 2-D matmuls are much faster in NumPy than batched
        # matmuls over strided views
        q, k, v = np.ascontiguousarray(qkv.transpose(2, 0, 3, 1, 4)).reshape(3, b * n, t, h)
        a_mth = np.empty_like(q)
        scale = np.float32(1.0 / math.sqrt(h))
        for i in range(b * n):
            s_ts = (q[i] * scale) @ k[i].T + bias_bs[i // n]
            s_ts = np.exp(s_ts - s_ts.max(-1, keepdims=True))
            a_mth[i] = (s_ts / s_ts.sum(-1, keepdims=True)) @ v[i]
        a_btd = a_mth.reshape(b, n, t, h).transpose(0, 2, 1, 3).reshape(b * t, n * h)
        x_btd = x_btd + (a_btd @ layer["w_o_kd"]).reshape(b, t, -1)
        y_btd = _rms_norm(x_btd, layer["mlp_norm_d"], cfg.rms_eps)
        hid = np.maximum(y_btd.reshape(b * t, -1) @ layer["w_in_df"] + layer["b_in_f"], 0.0)
        x_btd = x_btd + (hid @ layer["w_out_fd"]).reshape(b, t, -1)
    x_btd = _rms_norm(x_btd, params["final_norm_d"], cfg.rms_eps)
    m_bt1 = mask_bt[..., None].astype(np.float32)
    pooled_bd = (x_btd * m_bt1).sum(1) / np.maximum(m_bt1.sum(1), 1.0)
    z_bd = pooled_bd @ params["w_proj_dd"]
    return (z_bd / np.maximum(np.linalg.norm(z_bd, axis=-1, keepdims=True), 1e-6)).astype(np.float32)


def flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """{'a/b': leaf} for a pytree of dicts and lists."""
    out = {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict | list):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = np.asarray(v)
    return out


def unflatten(flat: dict[str, np.ndarray], n_layers: int) -> dict:
    """The inverse of `flatten` for the encoder's params."""
    params: dict = {"layers": [{} for _ in range(n_layers)]}
    for key, v in flat.items():
        parts = key.split("/")
        if parts[0] == "layers":
            params["layers"][int(parts[1])][parts[2]] = v
        else:
            params[parts[0]] = v
    return params


def save(
    out: Path | str,
    cfg: EncoderConfig,
    vocab: Sequence[str],
    params: dict,
    meta: dict,
    dense_weight: float = 1.0,
) -> None:
    """Writes a model directory (module docstring); `meta` goes into config.json under 'training'."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    raw = {**dataclasses.asdict(cfg), "dense_weight": dense_weight, "training": meta}
    (out / "config.json").write_text(json.dumps(raw, indent=1))
    (out / "vocab.json").write_text(json.dumps(list(vocab)))
    np.savez(out / "params.npz", **{k: np.asarray(v, np.float32) for k, v in flatten(params).items()})


class LearnedEncoder:
    """The trained encoder as an `Encoder` for codebase_search (texts are code chunks)."""

    def __init__(
        self,
        cfg: EncoderConfig,
        vocab: Sequence[str],
        params: dict,
        name: str = "",
        dense_weight: float = 1.0,
    ):
        self.cfg, self.params, self.name = cfg, params, name
        self.dense_weight = dense_weight
        self.tokenizer = Tokenizer(vocab, cfg.hash_buckets)
        self._cache: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()  # episodes of a worker search from several threads

    @classmethod
    def from_dir(cls, path: Path | str) -> "LearnedEncoder":
        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        fields = {f.name for f in dataclasses.fields(EncoderConfig)}
        cfg = EncoderConfig(**{k: v for k, v in raw.items() if k in fields})
        vocab = json.loads((path / "vocab.json").read_text())
        with np.load(path / "params.npz") as f:
            params = unflatten({k: f[k] for k in f.files}, cfg.n_layers)
        return cls(cfg, vocab, params, name=str(path), dense_weight=float(raw.get("dense_weight", 1.0)))

    def _run(self, rows: list[list[int]]) -> np.ndarray:
        """Vectors of token rows, batched by length bucket (module docstring)."""
        out = np.zeros((len(rows), self.cfg.d_model), np.float32)
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        for s in range(0, len(order), BATCH):
            idx = order[s : s + BATCH]
            length = bucket(max(len(rows[i]) for i in idx))
            out[idx] = forward(self.params, pad_rows([rows[i] for i in idx], length), self.cfg)
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """[b] queries -> [b, d]."""
        return self._run([self.tokenizer.encode(t, QUERY, self.cfg.query_len) for t in texts])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[b] code chunks -> [b, d], cached by content hash."""
        keys = [hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts]
        if not texts:
            return np.zeros((0, self.cfg.d_model), np.float32)
        with self._lock:
            missing = {k: t for k, t in zip(keys, texts) if k not in self._cache}
            if missing:
                rows = [self.tokenizer.encode(t, CHUNK, self.cfg.chunk_len) for t in missing.values()]
                if len(self._cache) + len(missing) > CACHE_MAX:
                    self._cache.clear()
                self._cache.update(zip(missing, self._run(rows)))
            return np.stack([self._cache[k] for k in keys])


MODEL_FILES = ("config.json", "vocab.json", "params.npz")  # a model directory (module docstring)


def missing_files(path: str | Path) -> list[str]:
    """The files of a model directory that `path` lacks (all of them when it is no directory)."""
    return [f for f in MODEL_FILES if not (Path(path) / f).is_file()]


@functools.lru_cache(maxsize=4)
def load(path: str) -> LearnedEncoder:
    """The encoder of a model directory, one per directory and process (its vector cache is shared)."""
    return LearnedEncoder.from_dir(path)
