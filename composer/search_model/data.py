"""Training pairs for the code-search encoder, all made offline from what is on the machine.

Three sources (each pair: a query, the code chunk it should find, and hard negatives: chunks BM25 ranks
high for the query that are not the answer):

1. Python sources installed in site-packages: for each function and method, its docstring's first
   paragraph -> its code without the docstring, and its name (words split apart) -> its code without the
   signature. Packages in HELD_OUT_PACKAGES are skipped: benchmarks/search.py evaluates on them, so no code
   of theirs may be trained on. Hard negatives: BM25 over all these chunks.
2. Bug-fix tasks: the problem statement -> the chunk (function) that the gold patch edits, with hard
   negatives from the same repository (often its tests, which share the statement's names). Generated tasks
   (env/tasks/generator.py) are made on the spot; real-repository suites built by `python -m env.tasks
   build` are taken with `--suites` (their packages must not be held out).
3. The agent's own searches -> what it read or edited next, from trajectories: not used (no run on this
   machine has recorded codebase_search calls yet).

Chunk texts are formatted as codebase_search indexes them (`path` newline lines), cut as it cuts them.
"""

import ast
import dataclasses
import os
import random
import site
from pathlib import Path

import numpy as np

from env.tasks.diffs import parse_patch
from env.tasks.task import Task
from env.tools.codebase_search import Chunk, SearchIndex, _bm25s, code_tokens

# Benchmarked on (benchmarks/search.py): never trained on, neither their installed sources nor tasks.
HELD_OUT_PACKAGES = frozenset({"toolz", "tlz", "cachetools", "more_itertools"})
MAX_FILE_BYTES = 200_000
MAX_PAIRS_PER_FILE = 6
HARD_NEGATIVES = 4


@dataclasses.dataclass
class Pair:
    query: str
    chunk: str
    negatives: list[str]
    source: str  # 'docstring' | 'name' | 'task'


def _strip_lines(lines: list[str], drop: set[int]) -> list[str]:
    return [line for i, line in enumerate(lines) if i not in drop]


def function_pairs(rel: str, source: str, rng: random.Random) -> list[Pair]:
    """Docstring -> code and name -> code pairs of the functions and methods in one file."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out: list[Pair] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("test"):
            continue
        start, end = node.lineno, min(node.end_lineno, node.lineno + 59)
        if end - start < 2:
            continue
        body = lines[start - 1 : end]
        first = node.body[0]
        doc = ast.get_docstring(node)
        if doc:
            para = doc.strip().split("\n\n")[0].replace("\n", " ")
            drop = set(range(first.lineno - start, first.end_lineno - start + 1))
            code = _strip_lines(body, drop)
            if len(para.split()) >= 4 and len(code) >= 3:
                out.append(Pair(para[:400], rel + "\n" + "\n".join(code), [], "docstring"))
        words = node.name.strip("_").replace("_", " ")
        if len(words) >= 4 and not node.name.startswith("__"):
            sig = set(range(0, max(first.lineno - start, 1)))
            code = _strip_lines(body, sig)
            if len(code) >= 2:
                out.append(Pair(words, rel + "\n" + "\n".join(code), [], "name"))
    rng.shuffle(out)
    return out[:MAX_PAIRS_PER_FILE]


def site_packages_pairs(max_files: int, seed: int, roots: list[str] | None = None) -> list[Pair]:
    """function_pairs of up to max_files Python files drawn (seeded) from site-packages, held-out packages
    and test files excluded."""
    files = []
    for root in roots if roots is not None else site.getsitepackages():
        for top in sorted(os.listdir(root)):
            name = top.removesuffix(".py")
            if name in HELD_OUT_PACKAGES or top.startswith((".", "_")) or ".dist-info" in top:
                continue
            for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
                dirnames[:] = sorted(d for d in dirnames if d not in ("tests", "test", "__pycache__"))
                for f in sorted(filenames):
                    if f.endswith(".py") and not f.startswith("test"):
                        files.append(os.path.join(dirpath, f))
            if top.endswith(".py"):
                files.append(os.path.join(root, top))
    rng = random.Random(seed)
    rng.shuffle(files)
    pairs: list[Pair] = []
    for full in files[:max_files]:
        try:
            if os.path.getsize(full) > MAX_FILE_BYTES:
                continue
            text = Path(full).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        rel = os.path.relpath(full, os.path.dirname(os.path.dirname(full)))
        pairs += function_pairs(rel.replace(os.sep, "/"), text, rng)
    return pairs


def mine_negatives(pairs: list[Pair], pool: list[str], k: int = HARD_NEGATIVES) -> None:
    """Sets each pair's negatives to the top-k BM25 chunks of `pool` for its query, the pair's own chunk
    left out."""
    bm25 = _bm25s().BM25()
    bm25.index([code_tokens(t) for t in pool], show_progress=False)
    vocab = bm25.vocab_dict
    for p in pairs:
        terms = [t for t in code_tokens(p.query) if t in vocab]
        if not terms:
            continue
        scores = bm25.get_scores(terms)
        top = np.argpartition(-scores, min(k + 1, len(pool) - 1))[: k + 1]
        top = top[np.argsort(-scores[top])]
        p.negatives = [pool[i] for i in top if pool[i] != p.chunk and scores[i] > 0][:k]


def changed_lines(patch: str) -> dict[str, set[int]]:
    """path -> the old file's lines a patch removes or inserts before (1-based)."""
    out: dict[str, set[int]] = {}
    for fp in parse_patch(patch):
        if fp.old_path is None:
            continue
        lines = out.setdefault(fp.old_path, set())
        for start, body in fp.hunks:
            n = start
            for b in body:
                if b[:1] == "-":
                    lines.add(n)
                    n += 1
                elif b[:1] == "+" and n - 1 not in lines:  # an insertion, not the rest of a replacement
                    lines.add(n)
                elif b[:1] == " ":
                    n += 1
    return out


def repo_chunks(repo: Path) -> list[Chunk]:
    """codebase_search's chunks of a repository, in its order (what a search over it ranks)."""
    index = SearchIndex(_NoEncoder())
    index.refresh(os.path.realpath(repo), set())
    return index.chunks


class _NoEncoder:
    def encode(self, texts):
        return np.zeros((len(texts), 1), np.float32)


def gold_chunks(task: Task, chunks: list) -> list[int]:
    """Indices of the chunks (of the task's repository) that hold a line the gold patch changes."""
    changed = changed_lines(task.patch)
    return [
        i
        for i, c in enumerate(chunks)
        if c.path in changed and any(c.start <= n <= c.end for n in changed[c.path])
    ]


def task_pairs(tasks: list[Task]) -> list[Pair]:
    """Problem statement -> gold chunk, hard negatives from the same repository."""
    pairs = []
    for task in tasks:
        chunks = repo_chunks(task.repo)
        gold = gold_chunks(task, chunks)
        if not gold:
            continue
        texts = [c.text() for c in chunks]
        p = Pair(task.problem_statement, texts[gold[0]], [], "task")
        mine_negatives([p], [t for i, t in enumerate(texts) if i not in gold])
        pairs.append(p)
    return pairs
