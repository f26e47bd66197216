"""Training pairs for the code-search encoder, all made offline from what is on the machine.

Three sources (each pair: a query, the code chunk it should find, and hard negatives: chunks BM25 ranks
high for the query that are not the answer):

1. Python sources installed in site-packages: for each function and method, its docstring's first
   paragraph -> its code without the docstring, and its name (words split apart) -> its code without the
   signature. And from the tests installed with packages: a test `test_foo` whose package defines one
   function `foo` gives a failure report written as the task builder writes one (its opening, the test's
   lines that call foo, an error, its closing; env/tasks/build/statement.py) -> foo's code, with the test
   itself as the hard negative (BM25's usual mistake on such reports). Packages in HELD_OUT_PACKAGES are
   skipped: benchmarks/search.py evaluates on them, so no code of theirs may be trained on. Hard negatives of
   the other pairs: BM25 over all these chunks.
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
import zlib
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
MAX_REPORTS_PER_PACKAGE = 60


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
                        files.append((root, os.path.join(dirpath, f)))
            if top.endswith(".py"):
                files.append((root, os.path.join(root, top)))
    rng = random.Random(seed)
    rng.shuffle(files)
    pairs: list[Pair] = []
    for root, full in files[:max_files]:
        try:
            if os.path.getsize(full) > MAX_FILE_BYTES:
                continue
            text = Path(full).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        rel = os.path.relpath(full, root)
        pairs += function_pairs(rel.replace(os.sep, "/"), text, rng)
    return pairs


_ERRORS = (
    "AssertionError",
    "AssertionError: assert False",
    "TypeError: unsupported operand type(s)",
    "ValueError: invalid value",
    "IndexError: list index out of range",
    "KeyError: 'x'",
    "AttributeError: 'NoneType' object has no attribute",
)


def _package_files(root: str, top: str) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return files


def _is_test_file(path: str) -> bool:
    parts = path.replace(os.sep, "/").split("/")
    return parts[-1].startswith("test") or "tests" in parts or "test" in parts


def _read(path: str) -> str | None:
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def test_report_pairs(max_pairs: int, seed: int, roots: list[str] | None = None) -> list[Pair]:
    """Failure report of a test -> the function it tests (module docstring), from installed test suites."""
    from env.tasks.build import statement

    rng = random.Random(seed)
    pairs: list[Pair] = []
    for root in roots if roots is not None else site.getsitepackages():
        tops = sorted(t for t in os.listdir(root) if os.path.isdir(os.path.join(root, t)))
        for top in tops:
            if top in HELD_OUT_PACKAGES or top.startswith((".", "_")) or "." in top:
                continue
            files = _package_files(root, top)
            tests = [f for f in files if _is_test_file(os.path.relpath(f, root))][:200]
            wanted: dict[str, list[tuple[str, str, list[str]]]] = {}
            for f in tests:
                text = _read(f)
                try:
                    tree = ast.parse(text) if text else None
                except (SyntaxError, ValueError):
                    continue
                if tree is None:
                    continue
                lines = text.splitlines()
                for node in tree.body:
                    if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                        continue
                    name = node.name[5:]
                    body = lines[node.lineno - 1 : node.end_lineno]
                    calls = [ln.strip() for ln in body[1:] if name + "(" in ln]
                    if calls and len(name) > 2:
                        rel = os.path.relpath(f, root).replace(os.sep, "/")
                        wanted.setdefault(name, []).append((rel, rel + "\n" + "\n".join(body[:60]), calls))
            if not wanted:
                continue
            defs: dict[str, list[str]] = {}
            for f in files:
                if _is_test_file(os.path.relpath(f, root)):
                    continue
                text = _read(f)
                if not text or not any(f"def {n}(" in text for n in wanted):
                    continue
                rel = os.path.relpath(f, root).replace(os.sep, "/")
                lines = text.splitlines()
                try:
                    tree = ast.parse(text)
                except (SyntaxError, ValueError):
                    continue
                for node in ast.walk(tree):
                    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in wanted:
                        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                        chunk = lines[start - 1 : min(node.end_lineno, start + 59)]
                        defs.setdefault(node.name, []).append(rel + "\n" + "\n".join(chunk))
            per_package = 0
            for name, found in sorted(defs.items(), key=lambda kv: zlib.crc32(kv[0].encode()) ^ seed):
                if len(found) != 1 or per_package >= MAX_REPORTS_PER_PACKAGE:  # one def of that name only
                    continue
                per_package += 1
                for rel, test_chunk, calls in wanted[name][:2]:
                    node_id = f"{rel}::test_{name}"
                    shown = "\n".join(calls[:3]) + "\n" + rng.choice(_ERRORS)
                    report = "\n\n".join(
                        [rng.choice(statement._OPENINGS).format(first=node_id), f"```\n{shown}\n```",
                         rng.choice(statement._CLOSINGS)]
                    )  # fmt: skip
                    pairs.append(Pair(report, found[0], [test_chunk], "test_report"))
    rng.shuffle(pairs)
    return pairs[:max_pairs]


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
