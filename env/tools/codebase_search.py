"""codebase_search: hybrid retrieval over code chunks, lexical (BM25) fused with an embedding score.

Chunks. A Python file is cut along its syntax tree (`ast`): each top-level function and class is a chunk
(decorators included); a class longer than CHUNK_MAX_LINES gives one chunk per method instead, and the
module-level lines that no chunk covers (imports, constants, a class's own lines) form chunks of their own,
split at WINDOW_LINES. A chunk longer than CHUNK_MAX_LINES is split into windows. Other text files (and Python
that does not parse) are cut into windows of WINDOW_LINES lines. Hidden entries, `__pycache__`, symbolic
links, binary files and files over 512 KiB are left out. Each chunk is indexed with its path.

Scores. BM25 (`bm25s`, Okapi BM25) over code-aware tokens: identifiers split at `_` and case changes and
kept whole too (`parseConfig` -> parseconfig, parse, config), lower-cased, with a light suffix stemmer and
English stop words removed. The embedding score is the cosine between the query's and the chunk's vectors
from an `Encoder`. The two rankings are fused by reciprocal rank fusion (Cormack et al. 2009):
`score(c) = 1 / (60 + rank_bm25(c)) + 1 / (60 + rank_cos(c))`, a chunk without any query term having no
BM25 rank. The top TOP_K chunks come back best first as `{path}:{start}-{end}` then the chunk's lines
numbered read_file style, separated by blank lines.

The encoder. With a search model configured (`ctx.search_model`, a directory written by
`python -m composer.search_model train`; `env.search_model` in a run config, `--search-model` on the command
line) it is that trained transformer (env/tools/search_encoder.py, NumPy, no JAX in the tool process); any
other `Encoder` can be set as `ctx.encoder`. Without either, `HashedNgramEncoder`, a training-free FALLBACK:
hashed identifier sub-tokens and character n-grams, no semantics beyond spelling.

The index lives on the ToolContext. Each search re-stats the workspace's files (about a millisecond for a few
dozen files) and re-chunks only files whose size or modification time changed or that a tool edited, so
edits made through the terminal are seen too; chunk vectors are cached by the hash of the chunk's text, so
only new or changed chunks are encoded (in batches), and the learned encoder's own cache is shared by every
index in the process (one encoding per repository snapshot, however many episodes search it).
"""

import ast
import dataclasses
import functools
import hashlib
import os
import re
import stat
import sys
import threading
import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from env.tools.context import ToolContext, ToolError, ToolResult
from env.tools.files import number_lines, split_lines
from env.tools.paths import resolve_path

TOP_K = 5
RRF_K = 60
CHUNK_MAX_LINES = 60
WINDOW_LINES = 40
MAX_FILE_BYTES = 512 << 10
SKIP_DIRS = frozenset({"__pycache__", "node_modules"})

_STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "been", "by", "can", "do", "does", "for", "from", "has",
     "have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "our", "so",
     "than", "that", "the", "their", "them", "then", "there", "these", "this", "those", "to", "was", "we",
     "were", "what", "when", "where", "which", "who", "why", "will", "with", "you", "your")
)  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_CASE_PARTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def _stem(token: str) -> str:
    """A light suffix stemmer: computes, computed, computing, compute -> comput."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(token) > len(suffix) + 2 and token.endswith(suffix) and not token.endswith("ss"):
            token = token[: -len(suffix)]
            break
    if len(token) > 3 and token.endswith("e"):
        token = token[:-1]
    return token


@functools.lru_cache(maxsize=1 << 16)
def _identifier_tokens(ident: str) -> tuple[str, ...]:
    parts = [p.lower() for piece in ident.split("_") for p in _CASE_PARTS.findall(piece)]
    if len(parts) > 1:
        parts.insert(0, ident.lower().strip("_"))
    return tuple(_stem(t) for t in parts if len(t) > 1 and t not in _STOPWORDS)


def code_tokens(text: str) -> list[str]:
    """Lower-cased, stemmed identifier sub-tokens of `text` (and each compound identifier whole)."""
    return [t for ident in _IDENT.findall(text) for t in _identifier_tokens(ident)]


class Encoder(Protocol):
    """Maps texts to vectors whose dot products are similarities."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[b] texts -> [b, d] float32, rows L2-normalised (zero rows allowed for empty texts)."""
        ...


class HashedNgramEncoder:
    """Training-free stand-in for a learned code encoder (not a semantic model).

    A text's vector: counts of its code tokens (see `code_tokens`) hashed into `dim` buckets (crc32), plus
    half-weighted counts of the character n-grams of each token, with `<` `>` marking its ends, hashed
    multiplicatively (Knuth) into the same buckets; then log(1 + count) and L2 normalisation, so that the
    dot product is a cosine. It rewards shared spelling (`average` ~ `averages` ~ `avg_value` in part).
    """

    def __init__(self, dim: int = 2048, n: int = 3):
        if dim & (dim - 1):
            raise ValueError("dim must be a power of two")
        self.dim, self.n = dim, n
        self._shift = np.uint32(32 - dim.bit_length() + 1)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            tokens = code_tokens(text)
            if not tokens:
                continue
            ids = np.fromiter((zlib.crc32(t.encode()) for t in tokens), np.uint32, len(tokens))
            counts = np.bincount(ids & np.uint32(self.dim - 1), minlength=self.dim).astype(np.float32)
            b = np.frombuffer(("<" + "> <".join(tokens) + ">").encode(), np.uint8).astype(np.uint32)
            m = len(b) - self.n + 1
            if m > 0:
                code = np.zeros(m, np.uint32)
                keep = np.ones(m, bool)
                for k in range(self.n):
                    code = code * np.uint32(257) + b[k : k + m]
                    keep &= b[k : k + m] != ord(" ")
                buckets = (code[keep] * np.uint32(0x9E3779B1)) >> self._shift
                counts += 0.5 * np.bincount(buckets, minlength=self.dim)
            vec = np.log1p(counts)
            out[i] = vec / max(float(np.linalg.norm(vec)), 1e-12)
        return out


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Lines start..end (1-based, inclusive) of workspace-relative `path`."""

    path: str
    start: int
    end: int
    lines: tuple[str, ...]

    def text(self) -> str:
        return self.path + "\n" + "\n".join(self.lines)


def _windows(start: int, end: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(end, s + size - 1)) for s in range(start, end + 1, size)]


def python_spans(source: str) -> list[tuple[int, int]] | None:
    """(start, end) line spans of the AST chunks of a Python source; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    spans: list[tuple[int, int]] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in tree.body:
        if not isinstance(node, defs):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if isinstance(node, ast.ClassDef) and node.end_lineno - start + 1 > CHUNK_MAX_LINES:
            members = [m for m in node.body if isinstance(m, defs)]
            for m in members:
                m_start = min([m.lineno] + [d.lineno for d in m.decorator_list])
                spans += _windows(m_start, m.end_lineno, CHUNK_MAX_LINES)
        else:
            spans += _windows(start, node.end_lineno, CHUNK_MAX_LINES)
    return spans


def _remainder(lines: list[str], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans of the non-blank runs of lines that no span covers, split at WINDOW_LINES."""
    covered = np.zeros(len(lines) + 2, bool)
    for s, e in spans:
        covered[s : e + 1] = True
    out, run = [], []
    for n in range(1, len(lines) + 2):
        if n <= len(lines) and not covered[n]:
            run.append(n)
            continue
        content = [k for k in run if lines[k - 1].strip()]
        if content:
            out += _windows(content[0], content[-1], WINDOW_LINES)
        run = []
    return out


def chunk_file(rel: str, text: str) -> list[Chunk]:
    """The chunks of one file (see the module docstring)."""
    lines = split_lines(text)
    spans = python_spans(text) if rel.endswith((".py", ".pyi")) else None
    if spans is None:
        spans = []
    spans = sorted(spans + _remainder(lines, spans))
    return [Chunk(rel, s, e, tuple(lines[s - 1 : e])) for s, e in spans]


_IMPORT_LOCK = threading.Lock()


def _bm25s():
    """Imports bm25s without letting it import jax (which it does, when installed, to choose a top-k
    backend, running a jax op at import: that would start an accelerator backend in every process that
    runs tools). A process that has already imported jax keeps it."""
    with _IMPORT_LOCK:
        if "bm25s" in sys.modules:
            return sys.modules["bm25s"]
        hide = "jax" not in sys.modules
        if hide:
            sys.modules["jax"] = None  # makes `import jax` raise ImportError
        try:
            import bm25s
        finally:
            if hide and sys.modules.get("jax", 0) is None:
                del sys.modules["jax"]
        return bm25s


class SearchIndex:
    """Chunks of a workspace with their BM25 index and vectors, refreshed incrementally."""

    def __init__(self, encoder: Encoder):
        self.encoder = encoder
        self.files: dict[str, tuple[tuple[int, int], list[Chunk]]] = {}
        self.chunks: list[Chunk] = []
        self.vectors = np.zeros((0, 1), np.float32)
        self.bm25 = None
        self._vector_cache: dict[bytes, np.ndarray] = {}  # blake2b of a chunk's text -> its vector

    def _chunks_of(self, full: str, rel: str, size: int) -> list[Chunk]:
        if size > MAX_FILE_BYTES:
            return []
        try:
            with open(full, "rb") as f:
                data = f.read()
        except OSError:
            return []
        if b"\x00" in data[:8192]:
            return []
        return chunk_file(rel, data.decode("utf-8", errors="replace"))

    def refresh(self, root: str, dirty: set[str]) -> None:
        """Re-reads files that changed since the last refresh (or are in `dirty`); rebuilds if any did."""
        seen: dict[str, tuple[tuple[int, int], list[Chunk]]] = {}
        changed = False
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS)
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                sig = (st.st_mtime_ns, st.st_size)
                old = self.files.get(rel)
                if old is not None and old[0] == sig and rel not in dirty:
                    seen[rel] = old
                else:
                    seen[rel] = (sig, self._chunks_of(full, rel, st.st_size))
                    changed = True
        if not changed and seen.keys() == self.files.keys():
            return
        self.files = seen
        self.chunks = [c for rel in sorted(seen) for c in seen[rel][1]]
        texts = [c.text() for c in self.chunks]
        keys = [hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts]
        missing = {k: t for k, t in zip(keys, texts) if k not in self._vector_cache}
        if missing:
            vectors = self.encoder.encode(list(missing.values()))
            self._vector_cache.update(zip(missing, vectors, strict=True))
        self._vector_cache = {k: self._vector_cache[k] for k in keys}  # drop vectors of gone chunks
        self.vectors = (
            np.stack([self._vector_cache[k] for k in keys]) if texts else np.zeros((0, 1), np.float32)
        )
        self.bm25 = None
        if texts:
            self.bm25 = _bm25s().BM25()
            self.bm25.index([code_tokens(t) for t in texts], show_progress=False)

    def search(self, query: str, prefixes: list[str] | None, k: int) -> list[Chunk]:
        """The k best chunks under `prefixes` (workspace-relative dirs or files; None: all), best first."""
        candidates = [
            i
            for i, c in enumerate(self.chunks)
            if prefixes is None or any(c.path == p or c.path.startswith(p + "/") for p in prefixes)
        ]
        weight = getattr(self.encoder, "dense_weight", 1.0)  # a trained model's, fitted with it
        return [self.chunks[i] for i in self.rank(query, candidates, dense_weight=weight)[:k]]

    def rank(
        self,
        query: str,
        candidates: list[int],
        lexical: bool = True,
        dense: bool = True,
        dense_weight: float = 1.0,
    ) -> list[int]:
        """`candidates` (chunk indices) best first: by RRF of the BM25 and cosine rankings (the cosine's term
        times dense_weight), or by one alone (a chunk without any query term has no BM25 rank)."""
        if not candidates:
            return []
        fused = dict.fromkeys(candidates, 0.0)
        if lexical:
            terms = [t for t in code_tokens(query) if t in self.bm25.vocab_dict]
            scores = self.bm25.get_scores(terms) if terms else np.zeros(len(self.chunks))
            for rank, i in enumerate(
                sorted((i for i in candidates if scores[i] > 0), key=lambda i: -scores[i])
            ):
                fused[i] += 1.0 / (RRF_K + rank + 1)
        if dense:
            encode_query = getattr(self.encoder, "encode_queries", self.encoder.encode)
            cosine = self.vectors @ encode_query([query])[0]
            for rank, i in enumerate(sorted(candidates, key=lambda i: -cosine[i])):
                fused[i] += dense_weight / (RRF_K + rank + 1)
        return sorted(candidates, key=lambda i: -fused[i])


def format_chunks(chunks: list[Chunk]) -> str:
    """`{path}:{start}-{end}` then the numbered lines, per chunk, separated by blank lines."""
    return "\n\n".join(f"{c.path}:{c.start}-{c.end}\n{number_lines(list(c.lines), c.start)}" for c in chunks)


def encoder_for(ctx: ToolContext) -> Encoder:
    """ctx.encoder if set, else the trained model of ctx.search_model, else the hashed fallback."""
    if ctx.encoder is not None:
        return ctx.encoder
    if ctx.search_model:
        from env.tools import search_encoder  # imports this module's tokenizer pieces

        return search_encoder.load(os.path.realpath(ctx.search_model))
    return HashedNgramEncoder()


def codebase_search(ctx: ToolContext, args: dict) -> ToolResult:
    prefixes: list[str] | None = None
    if args["target_directories"]:
        prefixes = []
        for raw in args["target_directories"]:
            wp = resolve_path(ctx, raw)
            if not wp.real.exists():
                raise ToolError(f"Error: path not found: {wp.rel}")
            prefixes.append(wp.real_rel)
        if "." in prefixes:
            prefixes = None
    with ctx.search_lock:
        if ctx.search_index is None:
            ctx.search_index = SearchIndex(encoder_for(ctx))
        ctx.search_index.refresh(ctx.real_workspace, ctx.take_dirty())
        hits = ctx.search_index.search(args["query"], prefixes, TOP_K)
    if not hits:
        return ToolResult("No results found.", found_nothing=True)
    return ToolResult(format_chunks(hits))
