"""Builds verified bug-fix tasks from a real Python project.

1. BASELINE: the project's tests run once in the sandbox, in the task's environment, with the tracing plugin
   (pytest_trace.py): per-test outcomes and the project functions each test called.
2. PICK: the covered functions are shuffled by `random.Random(seed)`; each round gives every function one
   try: of the mutation kinds with candidates left in it, the one with the fewest tasks so far (ties in a
   seeded order), and one candidate of that kind drawn by the rng.
3. CHECK: the test files whose passing tests call the function run on the original (once per set of
   files, cached: the gold side) and twice on the mutated tree. The mutation is kept when
   - some tests that pass on the original fail (or error) on the mutated tree, the same ones both times
     (else: flaky), at most `max_failing` of them and not all (else: too broad);
   - nothing else changed: every other test that passed still passes, no test went missing or skipped, no
     file failed to collect and the run did not time out (else: error / timeout).
   FAIL_TO_PASS is the failing tests, PASS_TO_PASS the other passing tests of those files (both leave out
   ids a junit report cannot give back, e.g. a parameter holding '::'), and test_cmd runs exactly those
   files, so the grader reruns what was checked. Running the mutated tree twice here is the flakiness
   check; `python -m env.tasks validate` checks the written tasks again (empty and gold patch).
4. WRITE: repo/ is the project with the bug; `patch` is the diff back to the original (1-3 changed lines);
   the problem statement shows the failure (statement.py) and must not contain a line the patch adds.

Same project, options and seed: the same tasks, ids and patches (as long as the project's tests are not
themselves flaky).
"""

import dataclasses
import importlib.metadata
import json
import random
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from env.tasks import environments
from env.tasks.build import coverage, layout, mutations, statement
from env.tasks.build.runner import Run, Runner, test_cmd
from env.tasks.build.sources import BuildError, Project, copy_tree
from env.tasks.diffs import make_diff, parse_patch
from env.tasks.task import TASK_FILE

BUILDER_VERSION = 1
MAX_PATCH_LINES = 3
BASELINE_TIMEOUT_S = 900.0
DISCARDS = ("no_failing_test", "too_broad", "flaky", "error", "timeout", "statement_leak", "patch_too_large")


@dataclasses.dataclass(frozen=True)
class Options:
    count: int
    seed: int
    requirements: tuple[str, ...] = ()  # extra requirements of the task environment
    tests: tuple[str, ...] = ()  # test paths (default: detected)
    pythonpath: str | None = None  # default: 'src' for a src/ layout
    kinds: tuple[str, ...] = mutations.KINDS
    max_failing: int = 10
    max_attempts: int = 0  # 0: 25 per task asked for
    use_environment: bool = True  # False: run with this project's interpreter, write no environment


@dataclasses.dataclass
class Summary:
    tasks: list[str]
    attempts: int
    discarded: Counter
    baseline_tests: int
    baseline_passed: int
    functions: int
    seconds: float

    def to_json(self) -> dict:
        minutes = self.seconds / 60
        return {
            "tasks": len(self.tasks),
            "attempts": self.attempts,
            "discarded": {k: self.discarded.get(k, 0) for k in DISCARDS},
            "baseline_tests": self.baseline_tests,
            "baseline_passed": self.baseline_passed,
            "functions": self.functions,
            "seconds": round(self.seconds, 1),
            "tasks_per_minute": round(len(self.tasks) / minutes, 2) if minutes else 0.0,
        }


def environment(project: Project, extra: tuple[str, ...]) -> dict:
    """The task's environment: this interpreter's X.Y, pytest pinned to the version installed here (unless
    `extra` names one), the project's runtime requirements, then `extra`."""
    names = {_req_name(r) for r in extra}
    reqs = [] if "pytest" in names else [f"pytest=={importlib.metadata.version('pytest')}"]
    reqs += [r for r in project.dependencies if _req_name(r) not in names] + list(extra)
    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "requirements": list(dict.fromkeys(reqs)),
    }


def _req_name(text: str) -> str:
    try:
        return re.sub(r"[-_.]+", "-", Requirement(text).name).lower()
    except InvalidRequirement as e:
        raise BuildError(f"not a requirement: {text!r} ({e})") from e


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "project"


def _patch_size(patch: str) -> tuple[int, int]:
    """(lines removed, lines added) by `patch`."""
    body = [line for fp in parse_patch(patch) for _, hunk in fp.hunks for line in hunk]
    return sum(line[:1] == "-" for line in body), sum(line[:1] == "+" for line in body)


class _Builder:
    def __init__(self, project: Project, out: Path, options: Options, log):
        self.project, self.out, self.options, self.log = project, out, options, log
        self.layout = layout.detect(project.root, options.tests, options.pythonpath, name=project.name)
        self.sources = layout.source_files(project.root, self.layout)
        self.env = environment(project, options.requirements) if options.use_environment else {}
        self.gold: dict[tuple[str, ...], Run] = {}
        self.discarded: Counter = Counter()
        self.gold_timeout = 600.0

    def venv(self) -> Path | None:
        if not self.env:
            return None
        env = environments.Environment(
            python=self.env["python"], requirements=tuple(self.env["requirements"]), install=()
        )
        return environments.ensure(env, log=self.log)

    def gold_run(self, runner: Runner, files: tuple[str, ...]) -> Run:
        if files not in self.gold:
            self.gold[files] = runner.run(files, timeout=self.gold_timeout)
        return self.gold[files]

    def check(
        self, runner: Runner, rel: str, original: str, cand: mutations.Candidate, files: tuple[str, ...]
    ):
        """(failing tests, passing tests, failures) of a kept mutation, or the name of the discard."""
        gold = self.gold_run(runner, files)
        if gold.broken:
            return "error"
        good = {t for t in gold.passed if coverage.gradable(t)}
        limit = max(10.0, 5 * gold.seconds + 5)
        runs = []
        for _ in range(2):
            runner.write(rel, cand.source)
            try:
                run = runner.run(files, timeout=limit)
            finally:
                runner.write(rel, original)
            if run.timed_out:
                return "timeout"
            if run.broken or any(run.tests.get(t) not in ("passed", "failed", "error") for t in good):
                return "error"
            failing = sorted(t for t in good if run.tests[t] != "passed")
            if not failing:
                return "no_failing_test"
            if len(failing) > self.options.max_failing or len(failing) == len(good):
                return "too_broad"
            runs.append((failing, run))
            if len(runs) == 2 and runs[0][0] != runs[1][0]:
                return "flaky"
        failing, run = runs[0]
        return failing, sorted(good - set(failing)), run.failures


def build(project: Project, out: Path | str, options: Options, log=print) -> Summary:
    """Writes up to `options.count` tasks of `project` into `out`/<name>-<version>-<n>/; one progress line
    per task through `log`."""
    t0 = time.perf_counter()
    out = Path(out)
    mutations.check_kinds(options.kinds)
    b = _Builder(project, out, options, log)
    venv = b.venv()
    with Runner(project.root, b.layout, venv) as runner:
        baseline = runner.run(b.layout.tests, trace=True, timeout=BASELINE_TIMEOUT_S)
        if not baseline.passed:
            tail = "\n".join(baseline.output.strip().splitlines()[-15:])
            raise BuildError(f"{project.name}: no test passes on the unmodified project:\n{tail}")
        if baseline.hung:
            # A test left the process unable to exit (e.g. a thread still waiting); the gold run of each
            # set of test files finds which ones do that, and their functions are not used.
            log("note: the test run did not exit by itself after the tests ran")
        b.gold_timeout = max(30.0, 3 * baseline.seconds)
        covered = coverage.covered_functions(baseline, b.sources)
        broken = sorted({e["nodeid"] for e in baseline.collection_errors})
        log(
            f"baseline: {len(baseline.tests)} tests, {len(baseline.passed)} pass, {baseline.seconds:.1f}s; "
            f"{len(covered)} functions covered in {len({k.split('::')[0] for k in covered})} files; "
            f"layout {b.layout.kind}" + (f"; not collected: {', '.join(broken)}" if broken else "")
        )
        if not covered:
            raise BuildError(f"{project.name}: the passing tests call no function of the project's code")
        tasks = _search(b, runner, covered, baseline, t0)
    summary = Summary(
        tasks,
        sum(b.discarded.values()) + len(tasks),
        b.discarded,
        len(baseline.tests),
        len(baseline.passed),
        len(covered),
        time.perf_counter() - t0,
    )
    return summary


def _search(
    b: _Builder, runner: Runner, covered: dict[str, list[str]], baseline: Run, t0: float
) -> list[str]:
    options, project = b.options, b.project
    rng = random.Random(options.seed)
    keys = sorted(covered)
    rng.shuffle(keys)
    callables = coverage.callables(project.root, b.sources)
    texts: dict[str, str] = {}
    found: dict[tuple[str, str], list[mutations.Candidate]] = {}
    tried: set[tuple[str, str]] = set()
    exhausted: set[str] = set()
    tasks: list[str] = []
    kinds_built: Counter = Counter()
    attempts = 0
    max_attempts = options.max_attempts or 25 * options.count
    while len(tasks) < options.count and attempts < max_attempts and len(exhausted) < len(keys):
        for key in keys:
            if len(tasks) >= options.count or attempts >= max_attempts:
                break
            if key in exhausted:
                continue
            rel, _, qualname = key.partition("::")
            if rel not in texts:
                texts[rel] = (project.root / rel).read_text(encoding="utf-8")
            original = texts[rel]
            kinds = list(options.kinds)
            rng.shuffle(kinds)
            left = {}
            for kind in kinds:
                if (key, kind) not in found:
                    found[key, kind] = mutations.candidates(original, qualname, kind, callables)
                left[kind] = [c for c in found[key, kind] if (key, c.source) not in tried]
            open_kinds = [k for k in kinds if left[k]]
            if not open_kinds:
                exhausted.add(key)
                continue
            # The kind with the fewest tasks so far (ties: the seeded order), so that the kinds that fit
            # almost any function (negated conditions, dropped statements) do not crowd out the others.
            kind = min(open_kinds, key=lambda k: kinds_built[k])
            cand = rng.choice(left[kind])
            tried.add((key, cand.source))
            attempts += 1
            started = time.perf_counter()
            patch = make_diff(rel, cand.source, original)
            if max(_patch_size(patch)) > MAX_PATCH_LINES:
                b.discarded["patch_too_large"] += 1
                continue
            files = tuple(sorted({coverage.test_file(t) for t in covered[key]}))
            result = b.check(runner, rel, original, cand, files)
            if isinstance(result, str):
                b.discarded[result] += 1
                continue
            failing, passing, failures = result
            text = statement.write(rng, failing, failures, list(files), len(passing), patch, runner.box.root)
            if statement.leaks(text, patch):
                b.discarded["statement_leak"] += 1
                continue
            instance_id = f"{_slug(project.name)}-{_slug(project.version)}-{len(tasks)}"
            _write_task(b, instance_id, rel, qualname, cand, patch, text, files, failing, passing)
            tasks.append(instance_id)
            kinds_built[cand.kind] += 1
            b.log(
                f"[{len(tasks)}/{options.count}] {instance_id} kind={cand.kind} {key} "
                f"fail_to_pass={len(failing)} pass_to_pass={len(passing)} "
                f"{time.perf_counter() - started:.1f}s (total {time.perf_counter() - t0:.0f}s)"
            )
    return tasks


def _write_task(b: _Builder, instance_id, rel, qualname, cand, patch, text, files, failing, passing) -> None:
    gold = b.gold[files]
    path = b.out / instance_id
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    copy_tree(b.project.root, path / "repo")
    (path / "repo" / rel).write_text(cand.source, encoding="utf-8")
    data = {
        "instance_id": instance_id,
        "problem_statement": text,
        "test_cmd": test_cmd(b.layout, files),
        "FAIL_TO_PASS": failing,
        "PASS_TO_PASS": passing,
        "patch": patch,
        "test_patch": "",
        "timeout_s": float(max(60, round(10 * gold.seconds))),
        "environment": b.env,
        "metadata": {
            "source": b.project.source,
            "family": cand.kind,
            "mutation": cand.description,
            "file": rel,
            "function": qualname,
            "line": cand.line,
            "build_seed": b.options.seed,
            "layout": b.layout.kind,
            "builder_version": BUILDER_VERSION,
        },
    }
    if not b.env:
        del data["environment"]
    (path / TASK_FILE).write_text(json.dumps(data, indent=2) + "\n")
