"""codebase_search: AST chunking, the stand-in encoder, hybrid ranking, refresh after edits."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from env.chat import ToolCall
from env.tools import ToolContext, execute, search_encoder
from env.tools.codebase_search import (
    CHUNK_MAX_LINES,
    TOP_K,
    HashedNgramEncoder,
    chunk_file,
    code_tokens,
    encoder_for,
)

GEOMETRY = '''"""Shapes and their measures."""
import math

UNIT = 1.0


def circle_area(radius):
    """Area of a circle."""
    return math.pi * radius**2


class Rectangle:
    def __init__(self, width, height):
        self.width, self.height = width, height

    def perimeter(self):
        return 2 * (self.width + self.height)
'''

STATS = '''def compute_average(values):
    """The arithmetic mean of a list of numbers."""
    return sum(values) / len(values)


def parse_config_file(path):
    with open(path) as f:
        return dict(line.split("=", 1) for line in f)


def retry_http_request(url, attempts=3):
    for _ in range(attempts):
        pass
'''


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "geometry.py").write_text(GEOMETRY)
    (root / "lib" / "stats.py").write_text(STATS)
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("# Guide\n\nHow to configure the retry policy.\n")
    return root


def search(ctx, query, dirs=()):
    return execute(ctx, ToolCall("codebase_search", {"query": query, "target_directories": list(dirs)}))


def headers(text):
    return [
        line for line in text.splitlines() if not line.startswith(" ") and ":" in line and "|" not in line
    ]


def test_python_chunks_follow_the_syntax_tree():
    spans = [(c.start, c.end) for c in chunk_file("lib/geometry.py", GEOMETRY)]
    assert spans == [(1, 4), (7, 9), (12, 17)]  # module remainder, function, class
    long_class = "class Big:\n" + "".join(f"    def m{i}(self):\n        return {i}\n\n" for i in range(25))
    chunks = chunk_file("big.py", long_class)
    assert chunks[0].start == 1 and chunks[0].lines == ("class Big:",)  # the class's own line
    assert [(c.start, c.end) for c in chunks[1:3]] == [(2, 3), (5, 6)]  # then one chunk per method
    assert all(c.end - c.start < CHUNK_MAX_LINES for c in chunks)
    text_chunks = chunk_file("notes.txt", "".join(f"line {i}\n" for i in range(100)))
    assert [(c.start, c.end) for c in text_chunks] == [(1, 40), (41, 80), (81, 100)]
    assert chunk_file("bad.py", "def broken(:\n  pass\n")[0].lines == ("def broken(:", "  pass")


def test_code_tokens_split_identifiers():
    tokens = code_tokens("parseConfigFile(HTTPServer)")
    assert tokens == ["parseconfigfil", "pars", "config", "fil", "httpserver", "http", "server"]
    assert code_tokens("the values of compute_average") == ["valu", "compute_averag", "comput", "averag"]


def test_stand_in_encoder_is_normalised_and_spelling_aware():
    enc = HashedNgramEncoder()
    v = enc.encode(["def compute_average(values)", "average of the values", "open a socket", ""])
    assert v.shape == (4, 2048) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v[:3], axis=1), 1.0, rtol=1e-5)
    assert not v[3].any()
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_finds_the_matching_function(ws):
    ctx = ToolContext(ws)
    r = search(ctx, "Where is the average of a list of numbers computed?")
    assert not r.is_error
    assert r.text.startswith(
        "lib/stats.py:1-3\n"
        '     1|def compute_average(values):\n     2|    """The arithmetic mean of a list of numbers."""\n'
        "     3|    return sum(values) / len(values)\n\nlib/"
    )
    assert len(headers(r.text)) == TOP_K
    assert headers(search(ctx, "area of a circle").text)[0] == "lib/geometry.py:7-9"
    assert headers(search(ctx, "rectangle perimeter width height").text)[0] == "lib/geometry.py:12-17"


def test_target_directories_limit_the_search(ws):
    ctx = ToolContext(ws)
    r = search(ctx, "retry policy", ["docs"])
    assert headers(r.text) == ["docs/guide.md:1-3"]
    assert all(
        h.startswith("lib/geometry.py")
        for h in headers(search(ctx, "average", ["/workspace/lib/geometry.py"]).text)
    )
    assert search(ctx, "x", ["missing"]).is_error


def test_index_follows_edits_by_tools_and_by_commands(ws):
    ctx = ToolContext(ws)
    assert headers(search(ctx, "levenshtein edit distance").text)[0] != "lib/text.py:1-2"
    execute(
        ctx,
        ToolCall(
            "write",
            {"file_path": "lib/text.py", "contents": "def levenshtein_distance(a, b):\n    return 0\n"},
        ),
    )
    assert headers(search(ctx, "levenshtein edit distance").text)[0] == "lib/text.py:1-2"
    # a change made behind the tools' back (as a terminal command would) is seen through the file's stat
    (ws / "lib" / "stats.py").write_text("def median_of_samples(samples):\n    return sorted(samples)[0]\n")
    os.utime(ws / "lib" / "stats.py", ns=(1, 1))
    assert headers(search(ctx, "median of samples").text)[0] == "lib/stats.py:1-2"
    assert "compute_average" not in search(ctx, "compute average").text
    execute(ctx, ToolCall("delete_file", {"target_file": "lib/text.py"}))
    assert "lib/text.py" not in search(ctx, "levenshtein edit distance").text


def test_a_trained_encoder_plugs_in(ws):
    class OneHot:
        """Scores only chunks mentioning 'Rectangle' (index 0), to show the encoder's score is used."""

        calls = 0

        def encode(self, texts):
            OneHot.calls += 1
            return np.array([[1.0, 0.0] if "Rectangle" in t or "boxes" in t else [0.0, 1.0] for t in texts])

    ctx = ToolContext(ws)
    ctx.encoder = OneHot()
    assert headers(search(ctx, "boxes").text)[0] == "lib/geometry.py:12-17"
    assert OneHot.calls == 2  # the chunks once, then the query


def test_bm25s_is_imported_without_jax():
    """bm25s imports jax when it can (and runs a jax op): a tool process must not start an accelerator."""
    code = (
        "import sys; import env.tools.codebase_search as c; c._bm25s(); "
        "assert 'bm25s' in sys.modules and 'jax' not in sys.modules; "
        "import bm25s.selection; assert not bm25s.selection.JAX_IS_AVAILABLE"
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def tiny_model(path, seed=0):
    """A random-weight model directory in the format composer.search_model writes (NumPy only: the tools'
    tests need no JAX)."""
    cfg = search_encoder.EncoderConfig(
        vocab_size=6, hash_buckets=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16, query_len=8,
        chunk_len=12,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    d, f = cfg.d_model, cfg.d_ff
    params = {
        "embed_vd": rng.normal(size=(cfg.n_embed, d)),
        "pos_td": 0.02 * rng.normal(size=(cfg.max_len, d)),
        "layers": [
            {
                "attn_norm_d": np.ones(d),
                "w_qkv_dk": rng.normal(size=(d, 3 * d)) / 4,
                "w_o_kd": rng.normal(size=(d, d)) / 4,
                "mlp_norm_d": np.ones(d),
                "w_in_df": rng.normal(size=(d, f)) / 4,
                "b_in_f": np.zeros(f),
                "w_out_fd": rng.normal(size=(f, d)) / 6,
            }
        ],
        "final_norm_d": np.ones(d),
        "w_proj_dd": rng.normal(size=(d, d)) / 4,
    }
    search_encoder.save(path, cfg, ["averag", "comput", "valu", "circl", "area", "rectangl"], params, {})
    return str(path)


class Counting(search_encoder.LearnedEncoder):
    """Records the chunk texts it is asked to encode."""

    def encode(self, texts):
        self.seen = getattr(self, "seen", []) + list(texts)
        return super().encode(texts)


def test_the_search_model_is_used_when_configured_and_the_hashed_encoder_otherwise(ws, tmp_path):
    model = tiny_model(tmp_path / "model")
    ctx = ToolContext(ws, search_model=model)
    r = search(ctx, "Where is the average of a list of numbers computed?")
    assert not r.is_error and len(headers(r.text)) == TOP_K
    assert isinstance(ctx.search_index.encoder, search_encoder.LearnedEncoder)
    assert ctx.search_index.vectors.shape == (len(ctx.search_index.chunks), 16)
    assert encoder_for(ToolContext(ws, search_model=model)) is ctx.search_index.encoder  # one per process
    fallback = ToolContext(ws)
    search(fallback, "average")
    assert isinstance(fallback.search_index.encoder, HashedNgramEncoder)
    # the command line's --search-model
    root = Path(__file__).resolve().parents[3]
    call = '{"name": "codebase_search", "arguments": {"query": "circle area", "target_directories": []}}'
    argv = ["-m", "env.tools", "call", "--workspace", str(ws), "--search-model", model, "--json", call]
    done = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("lib/geometry.py:7-9"), done.stderr


def test_numpy_batches_match_one_by_one(tmp_path):
    enc = search_encoder.LearnedEncoder.from_dir(tiny_model(tmp_path / "m"))
    texts = [GEOMETRY, STATS, "def f(): pass", "circle " * 40, ""]
    together = enc.encode(texts)
    alone = np.concatenate(
        [search_encoder.LearnedEncoder.from_dir(tmp_path / "m").encode([t]) for t in texts]
    )
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, rtol=1e-5)


def test_learned_vectors_are_cached_by_content_and_follow_edits(ws, tmp_path):
    enc = Counting.from_dir(tiny_model(tmp_path / "model"))
    ctx = ToolContext(ws)
    ctx.encoder = enc
    search(ctx, "average")
    n_chunks = len(ctx.search_index.chunks)
    assert len(enc.seen) == n_chunks
    search(ctx, "area")  # nothing changed: nothing encoded
    assert len(enc.seen) == n_chunks
    # an edit through a tool: only the new chunk is encoded, and its vector is the new text's
    execute(ctx, ToolCall("search_replace", {"file_path": "lib/geometry.py", "old_string": "radius**2",
                                             "new_string": "radius * radius"}))  # fmt: skip
    search(ctx, "area")
    new = [t for t in enc.seen[n_chunks:]]
    assert len(new) == 1 and "radius * radius" in new[0]
    i = next(i for i, c in enumerate(ctx.search_index.chunks) if "radius * radius" in c.text())
    np.testing.assert_allclose(ctx.search_index.vectors[i], enc.encode([new[0]])[0])
    # an edit behind the tools' back (a terminal command): seen through the file's stat
    (ws / "lib" / "stats.py").write_text("def median_of_samples(samples):\n    return sorted(samples)[0]\n")
    os.utime(ws / "lib" / "stats.py", ns=(1, 1))
    before = len(enc.seen)
    assert headers(search(ctx, "median of samples").text)[0] == "lib/stats.py:1-2"
    assert len(enc.seen) == before + 1  # the one new chunk; the index dropped the old file's
    assert len(ctx.search_index._vector_cache) == len(ctx.search_index.chunks)
    # a second episode on the same snapshot reuses the encoder's cache: nothing is encoded again
    other = ToolContext(ws)
    other.encoder = enc
    seen = len(enc.seen)
    search(other, "median")
    assert all(t in enc.seen[:seen] for t in enc.seen[seen:]) and enc._cache
