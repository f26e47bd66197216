"""The code-search encoder: its gradients, pooling, NumPy twin, training pairs and seeded determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer.search_model import data, encoder, train
from env.tools import search_encoder as se
from experiments.search_model import get_config

CFG = se.EncoderConfig(
    vocab_size=40, hash_buckets=8, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_len=16, query_len=8,
    chunk_len=12,
)  # fmt: skip


def _ids(rng, b, t, lengths):
    ids = rng.integers(se.N_SPECIAL, CFG.n_embed, (b, t)).astype(np.int32)
    ids[:, 0] = se.CHUNK
    for i, n in enumerate(lengths):
        ids[i, n:] = se.PAD
    return ids


def test_gradients_reach_every_weight_and_skip_padding():
    params = encoder.init(jax.random.key(0), CFG)
    ids = _ids(np.random.default_rng(0), 4, 10, [10, 6, 3, 8])

    @jax.jit
    def loss(p):
        z = encoder.forward(p, ids, CFG)
        return -(z[0] @ z[1]) + (z[2] @ z[3]) ** 2

    grads = jax.grad(loss)(params)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        assert np.isfinite(g).all(), path
        if "pos_td" not in jax.tree_util.keystr(path):
            assert np.abs(g).max() > 0, path
    assert not np.asarray(grads["embed_vd"][se.PAD]).any()  # padding takes no part
    assert not np.asarray(grads["pos_td"][10:]).any()  # nor do positions past the longest row
    # central finite difference along the gradient's direction of one weight
    w = params["layers"][1]["w_in_df"]
    d = grads["layers"][1]["w_in_df"] / jnp.linalg.norm(grads["layers"][1]["w_in_df"])
    eps = 3e-3
    with_w = lambda x: {**params, "layers": [params["layers"][0], {**params["layers"][1], "w_in_df": x}]}
    numeric = (loss(with_w(w + eps * d)) - loss(with_w(w - eps * d))) / (2 * eps)
    np.testing.assert_allclose(numeric, jnp.vdot(grads["layers"][1]["w_in_df"], d), rtol=5e-2)


def test_mean_pooling_ignores_padding():
    x = jnp.arange(24, dtype=jnp.float32).reshape(2, 4, 3)
    mask = jnp.array([[True, True, False, False], [False, False, False, False]])
    pooled = encoder.mean_pool(x, mask)
    np.testing.assert_allclose(pooled[0], x[0, :2].mean(0))
    assert not pooled[1].any()  # an empty row pools to zeros, not NaN
    params = encoder.init(jax.random.key(1), CFG)
    ids = _ids(np.random.default_rng(1), 3, 8, [8, 5, 2])
    z = encoder.forward(params, ids, CFG)
    padded = np.pad(ids, ((0, 0), (0, 4)))  # more padding changes nothing
    np.testing.assert_allclose(encoder.forward(params, padded, CFG), z, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(z, axis=-1), 1.0, rtol=1e-5)


def test_numpy_twin_matches_jax():
    params = encoder.init(jax.random.key(2), CFG)
    ids = _ids(np.random.default_rng(2), 5, 12, [12, 9, 4, 1, 7])
    np_params = jax.tree.map(np.asarray, params)
    np.testing.assert_allclose(se.forward(np_params, ids, CFG), encoder.forward(params, ids, CFG), atol=1e-5)
    flat = se.flatten(np_params)
    back = se.unflatten(flat, CFG.n_layers)
    assert jax.tree.structure(back) == jax.tree.structure(np_params)


SOURCE = '''
def parse_config(path):
    """Read a configuration file into a dictionary of settings."""
    with open(path) as f:
        return dict(line.split("=") for line in f)


def test_parse_config():
    assert parse_config("x")
'''


def test_function_pairs_hide_what_they_ask_for():
    pairs = data.function_pairs("pkg/config.py", SOURCE, __import__("random").Random(0))
    kinds = {p.source: p for p in pairs}
    assert set(kinds) == {"docstring", "name"}  # tests are not trained on
    assert kinds["docstring"].query == "Read a configuration file into a dictionary of settings."
    assert "configuration file" not in kinds["docstring"].chunk
    assert kinds["name"].query == "parse config" and "def parse_config" not in kinds["name"].chunk
    assert kinds["name"].chunk.startswith("pkg/config.py\n")


def test_changed_lines_of_a_patch():
    patch = (
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -3,3 +3,3 @@\n a\n-b\n+c\n d\n"
        "@@ -20,2 +20,3 @@\n x\n+y\n z\n"
    )
    assert data.changed_lines(patch) == {"m.py": {4, 21}}


def _pairs(n, seed):
    rng = np.random.default_rng(seed)
    words = [
        "parse",
        "config",
        "file",
        "socket",
        "open",
        "read",
        "cache",
        "key",
        "value",
        "retry",
        "http",
        "url",
    ]
    out = []
    for i in range(n):
        w = list(rng.choice(words, 3))
        out.append(data.Pair(" ".join(w), f"m{i}.py\ndef {'_'.join(w)}_{i}(x):\n    return x", [], "name"))
    for i, p in enumerate(out):
        p.negatives = [out[(i + 1) % n].chunk]
    return out


def test_training_is_deterministic_given_the_seed():
    config = get_config("tiny")
    config.steps, config.batch = 3, 4
    config.model.update(d_model=16, n_heads=2, d_ff=32, max_len=16, query_len=8, chunk_len=12, hash_buckets=8)
    site = _pairs(24, 0)
    _, vocab_a, params_a, hist_a = train.fit(config, [site, [], site[:5]])
    _, vocab_b, params_b, hist_b = train.fit(config, [site, [], site[:5]])
    assert vocab_a == vocab_b and hist_a == hist_b
    jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
    assert hist_a[-1]["loss"] != hist_a[0]["loss"]  # it trained


@pytest.mark.parametrize("text", ["parseConfigFile(HTTPServer) 12345 7", ""])
def test_tokenizer_pieces_and_unknown_hashing(text):
    tok = se.Tokenizer(["pars", "config"], hash_buckets=4)
    ids = tok.encode(text, se.QUERY, 16)
    assert ids[0] == se.QUERY
    if text:
        assert se.pieces(text) == ["pars", "config", "fil", "http", "server", "<num>", "7"]
        assert ids[1:3] == [se.N_SPECIAL, se.N_SPECIAL + 1]
        assert all(se.N_SPECIAL + 2 <= i < se.N_SPECIAL + 2 + 4 for i in ids[3:])
    assert len(tok.encode("a_b " * 50, se.CHUNK, 5)) <= 5


def test_installed_packages_give_pairs_and_held_out_ones_none(tmp_path):
    for top in ("pkg", "toolz"):
        (tmp_path / top / "tests").mkdir(parents=True)
        (tmp_path / top / "core.py").write_text(SOURCE.split("def test_")[0])
        (tmp_path / top / "tests" / "test_core.py").write_text(
            "def test_parse_config():\n    x = 1\n    assert parse_config('a') == {}\n"
        )
    reports = data.test_report_pairs(10, 0, roots=[str(tmp_path)])
    assert len(reports) == 1
    (r,) = reports
    assert "pkg/tests/test_core.py::test_parse_config" in r.query and "assert parse_config('a')" in r.query
    assert r.chunk.startswith("pkg/core.py\ndef parse_config(path):")
    assert r.negatives == [
        "pkg/tests/test_core.py\n" + (tmp_path / "pkg/tests/test_core.py").read_text()[:-1]
    ]
    site = data.site_packages_pairs(100, 0, roots=[str(tmp_path)])
    assert site and all(p.chunk.startswith("pkg/") for p in site)


def test_gold_ranks_find_the_edited_function(tmp_path):
    from composer.search_model import evaluate
    from env.tasks.task import Task
    from env.tools.codebase_search import HashedNgramEncoder

    repo = tmp_path / "t" / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "core.py").write_text(SOURCE.split("def test_")[0] + "\ndef other():\n    return 1\n")
    patch = (
        "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
        '@@ -5,1 +5,1 @@\n-        return dict(line.split("=") for line in f)\n+        return {}\n'
    )
    task = Task(
        "t", "`test_parse_config` fails: parse config of a file", "", [], [], patch, "", 10.0, repo.parent
    )
    ranks = evaluate.gold_ranks([task], {"hashed": HashedNgramEncoder()}, {})
    assert set(ranks) == {"bm25", "hashed", "hybrid_hashed"} and ranks["bm25"] == [1]
    assert evaluate.summarize([1, 2, 20]) == {
        "recall@1": 0.333,
        "recall@5": 0.667,
        "recall@10": 0.667,
        "mrr": 0.517,
    }
    weight, mrr = evaluate.fit_dense_weight([task], HashedNgramEncoder(), weights=(1.0, 2.0))
    assert weight in (1.0, 2.0) and set(mrr) == {1.0, 2.0}
