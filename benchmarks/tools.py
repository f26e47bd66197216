"""Latency of each IDE tool on a generated repository, and the sandbox's cost on a trivial command.

    python benchmarks/tools.py [--calls 50] [--source auto|tasks|synthetic] [--seed 0] [--difficulty 5]

The repository: with `--source auto` (default) the repositories of `--tasks` generated tasks (env.tasks, at
`--difficulty`) side by side in one directory, about a dozen Python files each; without env.tasks, a
synthetic repository built here (a few dozen Python modules of functions and classes, plus tests).
Each tool is called `--calls` times through
`env.tools.execute` (argument validation included, as a model's call) on a ToolContext over a private
workspace copy; p50 and p95 are reported in milliseconds. codebase_search's first call (building the index)
is reported separately from warm calls; read_lints is called a third as often (each call runs ruff over the
whole repository).

The row `(rg alone, grep's search)` is the same search as the grep row by a bare `subprocess.run` of ripgrep:
the part of grep's time that is ripgrep's.

Sandbox overhead: `run_terminal_cmd` running `true` through the real sandbox (env.sandbox, whatever isolation
the machine offers; the table says which) against a bare `subprocess.run(["true"])`; the overhead is the
difference of the p50s.

Targets: read_file, grep, list_dir p50 < 10 ms; sandboxed command overhead p50 < 30 ms. The last line is one
JSON object.
"""

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env.chat import ToolCall  # noqa: E402
from env.tools import ToolContext, execute  # noqa: E402
from env.tools.binaries import find_binary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS_MS = {"read_file": 10.0, "grep": 10.0, "list_dir": 10.0}
OVERHEAD_TARGET_MS = 30.0

_NOUNS = ["order", "invoice", "account", "ledger", "stock", "price", "rate", "user", "session", "report"]
_VERBS = ["compute", "validate", "parse", "format", "merge", "split", "apply", "load", "update", "check"]


def synthetic_repo(root: Path, seed: int, packages: int = 4, modules: int = 9) -> None:
    """packages x modules Python modules (~110 lines each: functions calling each other, a class), tests."""
    rng = random.Random(seed)
    for p in range(packages):
        pkg = root / f"pkg{p}"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f'"""Package {p}."""\n')
        for m in range(modules):
            lines = [
                f'"""Module {m} of package {p}."""',
                "",
                "import math",
                "",
                f"LIMIT_{m} = {rng.randint(5, 500)}",
            ]
            names = []
            for f in range(8):
                name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{p}_{m}_{f}"
                callee = names[-1] if names else None
                body = [f"def {name}(values, factor={rng.randint(1, 9)}):", f'    """{name} over values."""']
                body += [
                    "    total = 0",
                    "    for v in values:",
                    f"        if v > LIMIT_{m}:",
                    "            continue",
                ]
                body += ["        total += v * factor"]
                body += [
                    f"    return {callee}([total]) if {callee!r} and total else total"
                    if callee
                    else "    return total"
                ]
                lines += ["", ""] + body
                names.append(name)
            cls = f"{rng.choice(_NOUNS).title()}Store{p}{m}"
            lines += ["", "", f"class {cls}:", "    def __init__(self):", "        self.items = []", ""]
            lines += [
                "    def add(self, item):",
                "        self.items.append(item)",
                "        return len(self.items)",
            ]
            lines += ["", "    def total(self):", f"        return {names[0]}(self.items)", ""]
            (pkg / f"mod{m}.py").write_text("\n".join(lines) + "\n")
    tests = root / "tests"
    tests.mkdir()
    for p in range(packages):
        (tests / f"test_pkg{p}.py").write_text(
            f"from pkg{p}.mod0 import *  # noqa: F403\n\n\ndef test_import():\n    assert True\n"
        )
    (root / "README.md").write_text("# Synthetic repository\n\nFor the tool benchmark.\n")


def tasks_repo(out: Path, seed: int, difficulty: int, count: int) -> Path | None:
    """`count` generated tasks' repositories side by side in one directory (one generated repo has about a
    dozen files; the benchmark wants a few dozen), or None when the task generator is not available."""
    try:
        from env.tasks import generate_task, split_seed
    except ImportError as e:
        print(f"env.tasks is not available ({e}); using the synthetic repository")
        return None
    root = out / "repo"
    for i in range(count):
        task = generate_task(split_seed("train", seed + i), difficulty, out / "tasks")
        shutil.copytree(out / "tasks" / task.instance_id / "repo", root / task.instance_id)
    return root


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} cores, {system}, Python {platform.python_version()}"


def measure(ws: Path, box, calls: int, seed: int) -> tuple[dict[str, list[float]], str, float | None]:
    """Latency samples (ms) of each tool on workspace `ws`; the sandbox's isolation and its overhead."""
    ctx = ToolContext(ws, box)
    py_files = sorted(str(p.relative_to(ws)) for p in ws.rglob("*.py"))
    rng = random.Random(seed)
    word = rng.choice(sorted({w for p in py_files for w in (ws / p).read_text().split() if w.isidentifier()}))
    n = calls

    def run(name, arguments):
        r = execute(ctx, ToolCall(name, arguments))
        if r.is_error:
            raise RuntimeError(f"{name} {arguments}: {r.text}")
        return r

    scratch_file = "bench_scratch.txt"
    (ws / scratch_file).write_text("alpha\nbeta\n")
    todos = [{"id": str(i), "content": f"step {i}", "status": "pending"} for i in range(4)]
    samples: dict[str, list[float]] = {}
    samples["read_file"] = timed(lambda i: run("read_file", {"target_file": py_files[i % len(py_files)]}), n)
    long_files = [p for p in py_files if len((ws / p).read_text().splitlines()) >= 40] or py_files
    samples["read_file (offset/limit)"] = timed(
        lambda i: run(
            "read_file", {"target_file": long_files[i % len(long_files)], "offset": 10, "limit": 30}
        ),
        n,
    )
    samples["grep"] = timed(lambda i: run("grep", {"pattern": word}), n)
    rg_argv = [find_binary("rg"), "--no-config", "--sort=path", "--null", "-n", "-e", word]
    samples["(rg alone, grep's search)"] = timed(
        lambda i: subprocess.run(rg_argv, cwd=ws, capture_output=True, stdin=subprocess.DEVNULL), n
    )
    samples["grep (-C 2, *.py)"] = timed(
        lambda i: run("grep", {"pattern": r"def \w+", "-C": 2, "glob": "*.py"}), n
    )
    samples["grep (files_with_matches)"] = timed(
        lambda i: run("grep", {"pattern": "return", "output_mode": "files_with_matches"}), n
    )
    samples["glob_file_search"] = timed(lambda i: run("glob_file_search", {"glob_pattern": "*.py"}), n)
    samples["list_dir"] = timed(lambda i: run("list_dir", {"target_directory": "."}), n)
    query = {"query": "where is the total of the values computed", "target_directories": []}
    samples["codebase_search (first: index)"] = timed(lambda i: run("codebase_search", query), 1)
    samples["codebase_search"] = timed(lambda i: run("codebase_search", query), n)
    samples["read_lints"] = timed(lambda i: run("read_lints", {}), max(3, n // 3))
    samples["search_replace"] = timed(
        lambda i: run(
            "search_replace",
            {
                "file_path": scratch_file,
                "old_string": ["alpha", "gamma"][i % 2],
                "new_string": ["gamma", "alpha"][i % 2],
            },
        ),
        n,
    )
    samples["write"] = timed(
        lambda i: run("write", {"file_path": scratch_file, "contents": f"v{i}\n" * 50}), n
    )

    def delete(i):
        (ws / f"gone{i}.txt").write_text("x\n")
        t = time.perf_counter()
        run("delete_file", {"target_file": f"gone{i}.txt"})
        return time.perf_counter() - t

    samples["delete_file"] = [delete(i) * 1000 for i in range(n)]
    samples["todo_write"] = timed(lambda i: run("todo_write", {"merge": i > 0, "todos": todos[:2]}), n)

    isolation, overhead = "none (env.sandbox not available)", None
    bare = timed(lambda i: subprocess.run(["true"], check=True), n)
    samples['subprocess.run(["true"])'] = bare
    if box is not None:
        isolation = box.shell("true").isolation
        samples["sandbox.shell(true)"] = timed(lambda i: box.shell("true"), n)
        samples["run_terminal_cmd(true)"] = timed(
            lambda i: run("run_terminal_cmd", {"command": "true", "is_background": False}), n
        )
        overhead = percentile(samples["run_terminal_cmd(true)"], 50) - percentile(bare, 50)

    return samples, isolation, overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--source", choices=["auto", "tasks", "synthetic"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--difficulty", type=int, default=5, help="of the generated tasks (1..5)")
    parser.add_argument("--tasks", type=int, default=3, help="generated task repos put side by side")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-tools-"))
    repo, source = None, "synthetic"
    if args.source in ("auto", "tasks"):
        repo = tasks_repo(scratch, args.seed, args.difficulty, args.tasks)
        if repo is None and args.source == "tasks":
            sys.exit("the task generator (env.tasks) is not available")
        source = "env.tasks" if repo is not None else "synthetic"
    if repo is None:
        repo = scratch / "synthetic"
        synthetic_repo(repo, args.seed)

    try:
        import env.sandbox as sandbox_lib
    except ImportError:
        sandbox_lib = None
    if sandbox_lib is not None:
        ws = sandbox_lib.make_workspace(repo)
        box = sandbox_lib.Sandbox(ws)
    else:
        ws = scratch / "ws"
        shutil.copytree(repo, ws)
        box = None
    py_files = sorted(ws.rglob("*.py"))
    n_lines = sum(len(p.read_text().splitlines()) for p in py_files)
    try:
        samples, isolation, overhead = measure(ws, box, args.calls, args.seed)
    finally:
        if box is not None:
            box.close()
            sandbox_lib.remove_workspace(ws)
        shutil.rmtree(scratch, ignore_errors=True)

    rows = {k: {"p50_ms": round(percentile(v, 50), 3), "p95_ms": round(percentile(v, 95), 3), "n": len(v)}
            for k, v in samples.items()}  # fmt: skip
    print(f"machine: {machine()}")
    print(f"sandbox isolation: {isolation}")
    print(f"repo: {source}, {len(py_files)} Python files, {n_lines} lines; rg {find_binary('rg')}")
    print(f"{'tool':34s} {'p50 ms':>9s} {'p95 ms':>9s} {'calls':>6s}")
    for k, row in rows.items():
        print(f"{k:34s} {row['p50_ms']:9.2f} {row['p95_ms']:9.2f} {row['n']:6d}")
    met = {k: rows[k]["p50_ms"] < t for k, t in TARGETS_MS.items()}
    if overhead is not None:
        met["sandbox_overhead"] = overhead < OVERHEAD_TARGET_MS
        print(f"run_terminal_cmd(true) overhead over bare subprocess.run: p50 {overhead:.2f} ms")
    print("targets met:", ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in met.items()))

    summary = {
        "machine": machine(),
        "isolation": isolation,
        "repo": {"source": source, "python_files": len(py_files), "lines": n_lines},
        "tools": rows,
        "terminal_overhead_p50_ms": None if overhead is None else round(overhead, 3),
        "targets_met": met,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
