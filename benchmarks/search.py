"""codebase_search's retrieval quality and speed on held-out real repositories.

    python benchmarks/search.py --search-model DIR [--suites runs/suites/toolz,...] [--chunks 5000]
        [--queries 100]

Quality. For each task of the suites (SWE-bench format, built by `python -m env.tasks build`), the query is
its problem statement and the answer the function the gold patch edits: the chunk of codebase_search's
index (env/tools/codebase_search.py) holding a changed line. The whole repository is ranked (tests,
docs and all, as the tool sees it) by BM25 alone, the hashed stand-in alone, the learned model alone, the
hybrid the tool runs with the learned model (RRF of BM25 and the model, the model's term weighted by the
`dense_weight` training fitted on validation suites) and the tool's fallback hybrid (RRF of BM25 and the
hashed stand-in). Reported: recall@1/5/10 (the answer in the top k) and MRR (composer/search_model/
evaluate.py).

The default suites are built here on first use, 20 tasks each of the packages composer.search_model never
trains on (data.HELD_OUT_PACKAGES), with

    python -m env.tasks build --pypi toolz==1.0.0 --out runs/suites/toolz --count 20 --seed 0 --no-environment
    (cachetools==5.5.0 and more-itertools==10.5.0 likewise)

(pip fetches the sdists; nothing else is downloaded).

Speed, with the learned model: a workspace of about `--chunks` chunks (the suites' repositories copied
side by side under numbered directories, so no two chunks share a text); the index build is the first
codebase_search call with an empty vector cache (reported per 1,000 chunks and whole), the query latency
that of `--queries` warm calls through env.tools.execute (re-stat of the files, query encoding, cosine,
BM25, fusion, formatting), p50 and p99.

Targets (issue 43): hybrid recall@5 at least 10 points above BM25 alone; p50 < 30 ms at 5,000 chunks;
build < 60 s. The last line is one JSON object.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from composer.search_model import data, evaluate  # noqa: E402
from env.chat import ToolCall  # noqa: E402
from env.tasks.task import load_suite  # noqa: E402
from env.tools import ToolContext, execute  # noqa: E402
from env.tools import search_encoder as se  # noqa: E402
from env.tools.codebase_search import HashedNgramEncoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SUITES = {
    "toolz": "toolz==1.0.0",
    "cachetools": "cachetools==5.5.0",
    "more-itertools": "more-itertools==10.5.0",
}


def ensure_suites(arg: str) -> list[Path]:
    if arg:
        return [Path(s) for s in arg.split(",")]
    out = []
    for name, spec in DEFAULT_SUITES.items():
        path = ROOT / "runs" / "suites" / name
        if not path.is_dir():
            cmd = [sys.executable, "-m", "env.tasks", "build", "--pypi", spec, "--out", str(path)]
            subprocess.run(cmd + ["--count", "20", "--seed", "0", "--no-environment"], cwd=ROOT, check=True)
        out.append(path)
    return out


def big_workspace(suites: list[Path], target: int, dest: Path) -> int:
    """Copies the suites' first repositories under dest/copyN/ until about `target` chunks; their count."""
    repos = [load_suite(s)[0].repo for s in suites]
    sizes = [len(data.repo_chunks(r)) for r in repos]
    n, i = 0, 0
    while n < target:
        j = i % len(repos)
        shutil.copytree(repos[j], dest / f"copy{i}" / repos[j].parent.name)
        n += sizes[j]
        i += 1
    return n


def speed(model_dir: str, suites: list[Path], target: int, queries: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        big_workspace(suites, target, ws)
        ctx = ToolContext(ws)
        ctx.encoder = se.LearnedEncoder.from_dir(model_dir)  # a fresh vector cache: a cold build
        call = lambda q: execute(ctx, ToolCall("codebase_search", {"query": q, "target_directories": []}))
        t0 = time.perf_counter()
        call(queries[0])
        build_s = time.perf_counter() - t0
        n_chunks = len(ctx.search_index.chunks)
        times = []
        for q in queries:
            t0 = time.perf_counter()
            call(q)
            times.append(1000 * (time.perf_counter() - t0))
    return {
        "chunks": n_chunks,
        "build_s": round(build_s, 2),
        "build_s_per_1000_chunks": round(1000 * build_s / n_chunks, 2),
        "query_ms_p50": round(float(np.percentile(times, 50)), 2),
        "query_ms_p99": round(float(np.percentile(times, 99)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--search-model", required=True, help="a model directory (composer.search_model)")
    parser.add_argument("--suites", default="", help="comma-separated suites (default: built, see above)")
    parser.add_argument("--chunks", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    suites = ensure_suites(args.suites)
    tasks = [t for s in suites for t in load_suite(s)]
    trained_on = json.loads((Path(args.search_model) / "config.json").read_text())["training"]
    held_out = set(trained_on["held_out_packages"])
    learned = se.LearnedEncoder.from_dir(args.search_model)
    encoders = {"hashed": HashedNgramEncoder(), "learned": learned}
    t0 = time.perf_counter()
    ranks = evaluate.gold_ranks(tasks, encoders, {"hybrid": learned.dense_weight})
    result = {m: evaluate.summarize(r) for m, r in ranks.items()}
    quality_s = time.perf_counter() - t0
    print(
        f"{'method':<14} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'MRR':>6}"
        f"   ({len(tasks)} tasks, {quality_s:.0f} s)"
    )
    for m, r in result.items():
        print(f"{m:<14} {r['recall@1']:>6.3f} {r['recall@5']:>6.3f} {r['recall@10']:>6.3f} {r['mrr']:>6.3f}")
    queries = [t.problem_statement for t in tasks]
    queries = (queries * (args.queries // len(queries) + 1))[: args.queries]
    sp = speed(args.search_model, suites, args.chunks, queries)
    print(
        f"index build: {sp['build_s']} s for {sp['chunks']} chunks "
        f"({sp['build_s_per_1000_chunks']} s per 1,000); "
        f"query p50 {sp['query_ms_p50']} ms, p99 {sp['query_ms_p99']} ms (warm)"
    )
    gain = result["hybrid"]["recall@5"] - result["bm25"]["recall@5"]
    summary = {
        "suites": [s.name for s in suites],
        "tasks": len(tasks),
        "held_out_packages": sorted(held_out),
        "dense_weight": learned.dense_weight,
        **{m: r for m, r in result.items()},
        "hybrid_minus_bm25_recall@5": round(gain, 3),
        **sp,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
