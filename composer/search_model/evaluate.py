"""Retrieval quality on bug-fix tasks: where the function the gold patch edits ranks for the problem
statement, over the task's whole repository as codebase_search indexes it (benchmarks/search.py, and the
fusion weight `train` fits on validation suites)."""

import os

import numpy as np

from composer.search_model import data
from env.tools.codebase_search import Encoder, SearchIndex

KS = (1, 5, 10)

# method -> (encoder, BM25 on, cosine on)
METHODS = {
    "bm25": ("hashed", True, False),
    "hashed": ("hashed", False, True),
    "learned": ("learned", False, True),
    "hybrid": ("learned", True, True),
    "hybrid_hashed": ("hashed", True, True),
}


def gold_ranks(tasks: list, encoders: dict[str, Encoder], dense_weights: dict[str, float]) -> dict[str, list]:
    """method -> the 1-based rank of each task's first gold chunk (tasks without one are skipped). Methods
    are METHODS whose encoder is given; `dense_weights` sets the cosine's RRF weight per hybrid method."""
    methods = {m: v for m, v in METHODS.items() if v[0] in encoders}
    ranks: dict[str, list] = {m: [] for m in methods}
    for task in tasks:
        indexes = {}
        for name, enc in encoders.items():
            indexes[name] = SearchIndex(enc)
            indexes[name].refresh(os.path.realpath(task.repo), set())
        chunks = next(iter(indexes.values())).chunks
        gold = set(data.gold_chunks(task, chunks))
        if not gold:
            continue
        every = list(range(len(chunks)))
        for m, (enc, lexical, dense) in methods.items():
            order = indexes[enc].rank(
                task.problem_statement, every, lexical, dense, dense_weights.get(m, 1.0)
            )
            ranks[m].append(next(r for r, i in enumerate(order, 1) if i in gold))
    return ranks


def summarize(ranks: list) -> dict:
    """recall@k and MRR of a list of ranks."""
    r = np.array(ranks)
    out = {f"recall@{k}": round(float((r <= k).mean()), 3) for k in KS}
    out["mrr"] = round(float((1.0 / r).mean()), 3)
    return out


def fit_dense_weight(tasks: list, encoder: Encoder, weights=(0.5, 1.0, 2.0, 4.0)) -> tuple[float, dict]:
    """The hybrid's cosine weight with the best MRR on `tasks` (ties: the first), and each weight's MRR."""
    scores = {}
    for w in weights:
        ranks = gold_ranks(tasks, {"learned": encoder}, {"hybrid": w})["hybrid"]
        scores[w] = summarize(ranks)["mrr"]
    best = max(weights, key=lambda w: scores[w])
    return best, scores
