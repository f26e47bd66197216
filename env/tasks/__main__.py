"""Command line for task suites (stable: other tools script it).

    python -m env.tasks generate --out DIR --count N --seed S [--difficulty D] [--split train|heldout]
                                 [--families F1,F2] [--workers W]
        writes DIR/<instance_id>/ for the seeds split_seed(split, S + i), i < N (with --families: the first
        N of those seeds whose bug family is listed), one progress line each, then a summary line.
    python -m env.tasks grade --task DIR/ID --workspace WS
        grades WS (a copy of the task's repo, edited) and prints one JSON object:
        {"instance_id", "reward", "tests": {node id: outcome}, "components": {...}, "output"}.
    python -m env.tasks prepare SUITE [--cache DIR]
        builds each distinct environment the suite's tasks name (a venv per environment, once, in the cache
        directory: $COMPOSER_ENV_CACHE or ~/.cache/composer/envs); the only step that uses the network.
        One line per environment, then one JSON line {"tasks", "environments", "seconds"}.
    python -m env.tasks validate SUITE [--workers W] [--isolation LEVEL]
        checks every task (the empty patch scores 0, the gold patch 1 twice, the gold patch edits no test
        file, the statement shows none of its added lines): a line per task, a table, then one JSON line
        {"tasks", "valid", "invalid", "seconds", "seconds_per_task"}; exit status 1 if a task fails.
    python -m env.tasks solve --task DIR/ID [--chat]
        runs the scripted expert and prints the conversation (readable, or with --chat as the model sees
        it), then one JSON line {"instance_id", "reward", "n_turns", "family"}.
    python -m env.tasks build (--pypi NAME==VERSION | --repo PATH) --out DIR --count N --seed S
                              [--requirements R1,R2] [--tests P1,P2] [--pythonpath DIR] [--kinds K1,K2]
                              [--max-failing M] [--no-environment]
        builds up to N tasks from a real project (a PyPI sdist or a local checkout) by mutating functions
        its tests cover (env/tasks/build/): one progress line per task, a summary line with the discards,
        then one JSON line {"tasks", "attempts", "discarded": {...}, ..., "seconds", "tasks_per_minute"}.

Exit status: 0 on success (for grade and solve: whatever the reward; validate: 1 if a task fails), 2 on bad
arguments or tasks.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from env.tasks.families import parse_families
from env.tasks.generator import SPLITS, generate_suite
from env.tasks.task import TaskError, load_suite, load_task


def _generate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()

    def progress(i: int, task, seconds: float) -> None:
        meta = task.metadata
        print(
            f"[{i + 1}/{args.count}] {task.instance_id} family={meta['family']} "
            f"fail_to_pass={len(task.FAIL_TO_PASS)} pass_to_pass={len(task.PASS_TO_PASS)} {seconds:.2f}s",
            flush=True,
        )

    families = parse_families(args.families)
    tasks = generate_suite(
        Path(args.out),
        args.count,
        args.seed,
        args.difficulty,
        args.split,
        progress,
        families=families,
        workers=args.workers,
    )
    elapsed = time.perf_counter() - t0
    per = elapsed / max(len(tasks), 1)
    print(f"generated {len(tasks)} tasks in {args.out} in {elapsed:.1f}s ({per:.2f}s per task)", flush=True)
    return 0


def _grade(args: argparse.Namespace) -> int:
    from env.reward import grade

    task = load_task(args.task)
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise TaskError(f"workspace {workspace} is not a directory")
    result = grade(task, workspace, isolation=args.isolation)
    out = {
        "instance_id": task.instance_id,
        "reward": result.reward,
        "tests": result.tests,
        "components": result.components,
        "output": result.output,
    }
    print(json.dumps(out))
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from env.tasks import environments

    t0 = time.perf_counter()
    tasks = load_suite(args.suite)
    cache = Path(args.cache) if args.cache else None
    built = environments.prepare(tasks, cache, log=lambda line: print(line, flush=True))
    for name, ids in built.items():
        print(f"{name}: {len(ids)} tasks", flush=True)
    summary = {"tasks": len(tasks), "environments": len(built), "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(summary))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from env.tasks.validate import run

    return run(Path(args.suite), args.workers, args.isolation)


def _solve(args: argparse.Namespace) -> int:
    from env.chat import render_text
    from env.expert import solve

    task = load_task(args.task)
    trajectory = solve(task, isolation=args.isolation)
    if args.chat:
        print(render_text(trajectory.messages))
    else:
        for m in trajectory.messages:
            print(f"### {m.role}")
            if m.content:
                print(m.content)
            for call in m.tool_calls:
                print(f"-> {call.name} {json.dumps(call.arguments, ensure_ascii=False)}")
            print()
    summary = {
        "instance_id": task.instance_id,
        "reward": trajectory.reward,
        "n_turns": trajectory.n_turns,
        "family": trajectory.family,
    }
    print(json.dumps(summary))
    return 0


def _build(args: argparse.Namespace) -> int:
    import tempfile

    from env.tasks.build import builder, mutations, sources

    if bool(args.pypi) == bool(args.repo):
        raise ValueError("give exactly one of --pypi NAME==VERSION and --repo PATH")
    split = lambda text: tuple(x.strip() for x in text.split(",") if x.strip())
    options = builder.Options(
        count=args.count,
        seed=args.seed,
        requirements=split(args.requirements),
        tests=split(args.tests),
        pythonpath=args.pythonpath,
        kinds=mutations.check_kinds(split(args.kinds)) or mutations.KINDS,
        max_failing=args.max_failing,
        use_environment=not args.no_environment,
    )
    with tempfile.TemporaryDirectory(prefix="composer-build-") as work:
        dest = Path(work) / "project"
        if args.pypi:
            project = sources.from_pypi(args.pypi, dest)
        else:
            project = sources.from_repo(args.repo, dest)
        print(
            f"building {args.count} tasks from {project.source} ({project.name} {project.version})",
            flush=True,
        )
        summary = builder.build(project, Path(args.out), options, log=lambda line: print(line, flush=True))
    data = summary.to_json()
    discards = ", ".join(f"{k}={v}" for k, v in data["discarded"].items() if v) or "none"
    print(
        f"built {data['tasks']} of {args.count} tasks in {args.out} from {data['attempts']} mutations in "
        f"{data['seconds']:.0f}s ({data['tasks_per_minute']} tasks per minute); discarded: {discards}",
        flush=True,
    )
    print(json.dumps(data), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.tasks", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("generate", help="generate a suite of verified tasks")
    p.add_argument("--out", required=True, help="directory to write the tasks into")
    p.add_argument("--count", type=int, required=True, help="number of tasks")
    p.add_argument("--seed", type=int, required=True, help="index of the first seed within the split")
    p.add_argument("--difficulty", type=int, default=1, choices=range(1, 6), help="1 (default) .. 5")
    p.add_argument("--split", default="train", choices=sorted(SPLITS), help="seed range (default train)")
    p.add_argument("--families", default="", help="comma-separated bug families (default: all)")
    p.add_argument("--workers", type=int, default=1, help="processes generating tasks (default 1)")
    p.set_defaults(run=_generate)
    p = commands.add_parser("grade", help="grade a workspace against a task; prints one JSON object")
    p.add_argument("--task", required=True, help="the task directory (holding task.json and repo/)")
    p.add_argument("--workspace", required=True, help="the workspace to grade")
    p.add_argument(
        "--isolation", default="auto", help="sandbox isolation: auto (default), bwrap, unshare, none"
    )
    p.set_defaults(run=_grade)
    p = commands.add_parser("prepare", help="build the environments a suite's tasks name")
    p.add_argument("suite", help="the suite directory (task directories inside)")
    p.add_argument("--cache", default="", help="environment cache directory (default: see above)")
    p.set_defaults(run=_prepare)
    p = commands.add_parser("validate", help="check that every task of a suite grades as it should")
    p.add_argument("suite", help="the suite directory")
    p.add_argument("--workers", type=int, default=1, help="tasks validated at once (default 1)")
    p.add_argument(
        "--isolation", default="auto", help="sandbox isolation: auto (default), bwrap, unshare, none"
    )
    p.set_defaults(run=_validate)
    p = commands.add_parser("solve", help="run the scripted expert on a task and print the conversation")
    p.add_argument("--task", required=True, help="the task directory")
    p.add_argument("--chat", action="store_true", help="print the conversation as the model sees it")
    p.add_argument(
        "--isolation", default="auto", help="sandbox isolation: auto (default), bwrap, unshare, none"
    )
    p.set_defaults(run=_solve)
    p = commands.add_parser("build", help="build verified tasks from a real Python project")
    p.add_argument("--pypi", default="", help="NAME==VERSION: build from this release's sdist")
    p.add_argument("--repo", default="", help="build from this local checkout")
    p.add_argument("--out", required=True, help="directory to write the tasks into")
    p.add_argument("--count", type=int, required=True, help="number of tasks wanted")
    p.add_argument("--seed", type=int, required=True, help="seed of the choice of functions and mutations")
    p.add_argument("--requirements", default="", help="comma-separated extra requirements of the tests")
    p.add_argument("--tests", default="", help="comma-separated test paths (default: detected)")
    p.add_argument("--pythonpath", default=None, help="import root of the code (default: src/ if present)")
    p.add_argument("--kinds", default="", help="comma-separated mutation kinds (default: all)")
    p.add_argument("--max-failing", type=int, default=10, help="most failing tests a bug may cause (10)")
    p.add_argument(
        "--no-environment",
        action="store_true",
        help="run the tests with this interpreter and its packages; the tasks name no environment",
    )
    p.set_defaults(run=_build)
    args = parser.parse_args(argv)
    if getattr(args, "count", 1) < 0:
        parser.error("--count must not be negative")
    try:
        return args.run(args)
    except (TaskError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
