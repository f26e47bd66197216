"""codebase_search: AST chunking, the stand-in encoder, hybrid ranking, refresh after edits."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from env.chat import ToolCall
from env.tools import ToolContext, execute
from env.tools.codebase_search import CHUNK_MAX_LINES, TOP_K, HashedNgramEncoder, chunk_file, code_tokens

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
