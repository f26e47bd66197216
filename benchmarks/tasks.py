"""Tasks built per minute from real projects, and validation seconds per task, beside generated tasks.

    python benchmarks/tasks.py [--packages toolz==1.0.0,cachetools==5.5.0] [--count 10] [--seed 0]
                               [--workers 1] [--out DIR]

Per package: `python -m env.tasks build --pypi PACKAGE --count N --seed S`, timed as the builder times it
(its last line: baseline test run, mutation checks and writing; the sdist download and the environment
build happen first in an untimed one-task build, so the number is the steady state of a warm cache). Then
`python -m env.tasks validate` on what was built (empty patch, gold patch twice: three graded test runs per
task, in the sandbox, with the task's environment). The named baseline is the procedural generator on the
same count and seed (`python -m env.tasks generate`), validated the same way.

The last line is one JSON object: {"real": {PACKAGE: {"tasks", "tasks_per_minute", "discarded",
"validate_s_per_task", "valid"}}, "real_tasks_per_minute", "real_validate_s_per_task", "generated":
{"tasks", "tasks_per_minute", "validate_s_per_task", "valid"}, "ratio_tasks_per_minute",
"ratio_validate_s_per_task"} (ratios: real over generated).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> dict:
    """Runs `python -m env.tasks ARGS` and returns its last line, as JSON where it is (exit status 1 of
    validate is a result, not an error)."""
    done = subprocess.run(
        [sys.executable, "-m", "env.tasks", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode not in (0, 1) or not done.stdout.strip():
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"env.tasks {args[0]} failed with exit status {done.returncode}")
    last = done.stdout.strip().splitlines()[-1]
    return json.loads(last) if last.startswith("{") else {"line": last}


def _validate(suite: Path, workers: int) -> dict:
    out = _run("validate", str(suite), "--workers", str(workers))
    return {"valid": out["valid"], "validate_s_per_task": out["seconds_per_task"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--packages", default="toolz==1.0.0,cachetools==5.5.0")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="tasks validated at once")
    parser.add_argument("--out", default="", help="where suites go (default: a temporary directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="composer-bench-tasks-") as scratch:
        out = Path(args.out or scratch)
        real, built, minutes, validate_s = {}, 0, 0.0, 0.0
        for package in args.packages.split(","):
            name = package.split("==")[0]
            _run("build", "--pypi", package, "--out", str(out / "warm" / name), "--count", "1", "--seed", "0")
            suite = out / "real" / name
            build = _run(
                "build", "--pypi", package, "--out", str(suite), "--count", str(args.count),
                "--seed", str(args.seed),
            )  # fmt: skip
            real[package] = {
                "tasks": build["tasks"],
                "tasks_per_minute": build["tasks_per_minute"],
                "discarded": build["discarded"],
                **_validate(suite, args.workers),
            }
            print(f"{package}: {json.dumps(real[package])}", flush=True)
            built += build["tasks"]
            minutes += build["seconds"] / 60
            validate_s += real[package]["validate_s_per_task"] * build["tasks"]
        t0 = time.perf_counter()
        _run(
            "generate", "--out", str(out / "generated"), "--count", str(args.count), "--seed", str(args.seed)
        )
        gen_minutes = (time.perf_counter() - t0) / 60
        generated = {
            "tasks": args.count,
            "tasks_per_minute": round(args.count / gen_minutes, 2),
            **_validate(out / "generated", args.workers),
        }
        print(f"generated: {json.dumps(generated)}", flush=True)
    real_rate = built / minutes if minutes else 0.0
    real_validate = validate_s / max(built, 1)
    result = {
        "real": real,
        "real_tasks_per_minute": round(real_rate, 2),
        "real_validate_s_per_task": round(real_validate, 2),
        "generated": generated,
        "ratio_tasks_per_minute": round(real_rate / generated["tasks_per_minute"], 3),
        "ratio_validate_s_per_task": round(real_validate / max(generated["validate_s_per_task"], 1e-9), 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
