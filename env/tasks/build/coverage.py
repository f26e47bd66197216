"""Which of the project's functions its passing tests exercise, from the baseline's traced run."""

import ast
import warnings
from pathlib import Path

from env.tasks.build.runner import Run


def test_file(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def gradable(node_id: str) -> bool:
    """Whether the grader can find the test in a junit report by its id: a file, then names (the
    parameter part may hold anything but '::')."""
    path, _, rest = node_id.partition("::")
    names, _, params = rest.partition("[")
    return path.endswith(".py") and bool(names) and "::" not in params


def covered_functions(baseline: Run, sources: list[str]) -> dict[str, list[str]]:
    """'file.py::Qual.name' -> the passing tests that called it (in node-id order), for functions of the
    files `sources` that are top-level functions or methods of top-level classes (the ones a mutation can
    address)."""
    wanted = set(sources)
    out: dict[str, list[str]] = {}
    for test in sorted(baseline.passed):
        if not gradable(test):
            continue
        for key in baseline.calls.get(test, []):
            file, _, qualname = key.partition("::")
            if file in wanted and qualname.count(".") <= 1:
                out.setdefault(key, []).append(test)
    return out


def callables(root: Path, sources: list[str]) -> frozenset[str]:
    """Names of every function and method the project defines (swapped_arguments swaps only arguments of
    calls to these)."""
    names = set()
    for rel in sources:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SyntaxWarnings of the project's code are not ours
                tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        names.update(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    return frozenset(names)
