"""The procedural task generator: small Python repositories with one injected bug and a pytest suite.

One task from (seed, difficulty):

1. DRAFT: pick a domain (domains.py) and, growing with difficulty, unrelated one-module side domains as
   distractors; draw every name, constant and test value from a `random.Random` seeded by (seed,
   difficulty, attempt); lay the call layers out as modules (difficulty 1: helpers in one module beside the
   entry point; from 2: leaves, helpers and entry point each in their own module); render the package and
   compute every test's expected value by running the correct code (probe.py).
2. BUG: the family is fixed by the seed (`FAMILIES[seed % 8]`, so consecutive seeds cover every family).
   Candidates of that family (families.py) in functions at the wanted call depth below the tested entry
   points (difficulty 1: the entry point itself; 2: one call below, in another module; 3 and up: two calls
   below) are tried until one makes at least one test fail while others still pass. Failures that show a
   wrong value are preferred over ones that raise.
3. REPORT: the problem statement is a user's bug report built from one failing test: the snippet they ran
   (only public entry points), what it returned or raised, and the correct value. It never names the file or
   function to fix; a draft whose report would is dropped.
4. VERIFY: the written repository is run in a fresh interpreter (probe.run_tests): the buggy tree must fail
   exactly FAIL_TO_PASS and pass PASS_TO_PASS; the tree with the gold patch applied must pass all. A draft
   that fails any step is dropped and the next attempt (a new sub-seed) is drawn.

Everything is a function of (seed, difficulty): the same call writes byte-identical files.
"""

import ast
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import multiprocessing
import random
import re
import shutil
import string
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from env.tasks import callgraph, probe, report
from env.tasks import domains as dom
from env.tasks.diffs import PatchError, apply_patch, make_tree_diff
from env.tasks.families import FAMILIES, check_families, mutations
from env.tasks.report import is_literal, literal
from env.tasks.task import Task, save_task

GENERATOR_VERSION = 1
# Disjoint seed ranges of the two splits: split_seed(split, i) is the i-th seed of a split.
TRAIN_SEEDS = range(0, 1_000_000)
HELDOUT_SEEDS = range(1_000_000, 2_000_000)
SPLITS = {"train": TRAIN_SEEDS, "heldout": HELDOUT_SEEDS}
# Plugin autoload off: only pytest's built-in plugins run (whatever else the machine has installed), which
# also makes a run 4-5x faster here. The junit report is written inside the repository, where grading reads
# it.
JUNIT_PATH = ".junit.xml"
TEST_CMD = (
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q --tb=short -p no:cacheprovider "
    f"--junitxml={JUNIT_PATH} tests"
)
TIMEOUT_S = 60.0
MAX_ATTEMPTS = 40
# difficulty -> (call depth of the bug below the tested entry point, number of side-domain modules)
_LAYOUT = {1: (0, 1), 2: (1, 1), 3: (2, 2), 4: (2, 3), 5: (2, 4)}


class _Reject(Exception):
    """This draft cannot make a good task; draw the next attempt."""


def split_seed(split: str, i: int) -> int:
    """The `i`-th seed of `split` ('train' or 'heldout')."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {sorted(SPLITS)}")
    seeds = SPLITS[split]
    if not 0 <= i < len(seeds):
        raise ValueError(f"seed index {i} is outside split {split!r} ({len(seeds)} seeds)")
    return seeds[i]


def family_of(seed: int) -> str:
    """The bug family of the task with this seed."""
    return FAMILIES[seed % len(FAMILIES)]


def split_of(seed: int) -> str:
    for name, seeds in SPLITS.items():
        if seed in seeds:
            return name
    raise ValueError(f"seed {seed} belongs to no split")


# ---------------------------------------------------------------------------------------------- drafting


@dataclasses.dataclass
class _Test:
    file: str  # repository-relative test file
    name: str  # test function name
    about: str
    setup: list[str]
    expr: str
    raises: str | None
    expected: object = None

    @property
    def node_id(self) -> str:
        return f"{self.file}::{self.name}"


@dataclasses.dataclass
class _Draft:
    rng: random.Random
    difficulty: int
    domain: dom.Domain
    package: str
    names: dict[str, str]  # role -> name
    module_of: dict[str, str]  # role -> module (without the package)
    sources: dict[str, str]  # dotted module name -> text
    tests: list[_Test]
    headers: dict[str, str]  # test file -> its import lines
    exports: list[str]  # names the package exports


def _draw_names(rng: random.Random, parts: list[dom.Domain]) -> dict[str, str]:
    names: dict[str, str] = {}
    used: set[str] = set()
    for d in parts:
        for role, options in d.names.items():
            free = [o for o in options if o not in used]
            if not free:
                raise _Reject(f"no free name for {role}")
            names[role] = rng.choice(free)
            used.add(names[role])
        for const, options in d.consts.items():
            names[const] = str(rng.choice(options))
    return names


def _refs(src: str, names: dict[str, str]) -> list[str]:
    return [r for r in dict.fromkeys(re.findall(r"\$\{(\w+)\}", src)) if r in names and not r.isupper()]


def _draft(rng: random.Random, difficulty: int) -> _Draft:
    depth, n_side = _LAYOUT[min(difficulty, 5)]
    domain = rng.choice(dom.DOMAINS)
    sides = rng.sample(dom.SIDE_DOMAINS, n_side)
    names = _draw_names(rng, [domain, *sides])
    package = rng.choice(domain.packages)

    # Module layout: layer -> module name.
    layer_module = {2: rng.choice(domain.modules[2])}
    if difficulty == 1:
        layer_module[0] = layer_module[1] = rng.choice(domain.modules[1])
    else:
        layer_module[0] = rng.choice(domain.modules[0])
        layer_module[1] = rng.choice(domain.modules[1])
    side_module = {}
    taken = set(layer_module.values())
    for side in sides:
        free = [m for m in side.modules[2] if m not in taken]
        side_module[side.key] = rng.choice(free)
        taken.add(side_module[side.key])

    # Difficulty 1 keeps only the functions the entry points need; higher ones keep unused ones (distractors).
    fns = list(domain.functions)
    if difficulty == 1:
        needed = {f.role for f in fns if f.layer == 2}
        frontier = list(needed)
        by_role = {f.role: f for f in fns}
        while frontier:
            for ref in _refs(by_role[frontier.pop()].src, names):
                if ref in by_role and ref not in needed:
                    needed.add(ref)
                    frontier.append(ref)
        fns = [f for f in fns if f.role in needed]

    module_of: dict[str, str] = {}
    placed: dict[str, list[dom.Fn]] = collections.defaultdict(list)  # module -> its functions and classes
    docs: dict[str, str] = {}
    for f in fns:
        module = layer_module[f.layer]
        module_of[f.role] = module
        placed[module].append(f)
        docs.setdefault(module, domain.module_docs[f.layer])
    if difficulty == 1:
        docs[layer_module[1]] = (
            domain.module_docs[0].rstrip(".")
            + "; "
            + domain.module_docs[1][0].lower()
            + (domain.module_docs[1][1:])
        )
    for side in sides:
        module = side_module[side.key]
        docs[module] = side.module_docs[2]
        for f in side.functions:
            module_of[f.role] = module
            placed[module].append(f)
    # Methods belong to their class's module (roles used only inside a class template).
    for f in [*fns, *(f for s in sides for f in s.functions)]:
        if f.src.lstrip().startswith("class "):
            for role in re.findall(r"def \$\{(\w+)\}", f.src):
                module_of[role] = module_of[f.role]

    mapping = dict(names)
    sources: dict[str, str] = {}
    for module, members in placed.items():
        if difficulty >= 2 and len(members) > 2:
            members = members[:]
            rng.shuffle(members)
        sources[f"{package}.{module}"] = _render_module(docs[module], members, mapping, module_of, module)
    exports = [names[f.role] for f in fns if f.layer == 2]
    export_lines = [f"from .{layer_module[2]} import {', '.join(sorted(exports))}"]
    for side in sides:
        side_names = sorted(names[f.role] for f in side.functions)
        exports += side_names
        export_lines.append(f"from .{side_module[side.key]} import {', '.join(side_names)}")
    init = f'"""{domain.doc}"""\n\n' + "\n".join(sorted(export_lines)) + "\n\n__all__ = ["
    init += ", ".join(f'"{n}"' for n in sorted(exports)) + "]\n"
    sources[package] = init

    tests = []
    for d, module in [(domain, layer_module[2]), *((s, side_module[s.key]) for s in sides)]:
        scenarios = list(d.scenarios)
        drop = rng.randint(0, max(0, len(scenarios) - 4)) if d is domain else rng.randint(0, 1)
        for _ in range(min(drop, 2)):
            scenarios.pop(rng.randrange(len(scenarios)))
        for sc in scenarios:
            tests.append(_scenario(rng, sc, mapping, f"tests/test_{module}.py"))
    headers = {}
    for file in dict.fromkeys(t.file for t in tests):
        code = "\n".join(line for t in tests if t.file == file for line in [*t.setup, t.expr])
        used = [n for n in sorted(exports) if re.search(rf"\b{re.escape(n)}\b", code)]
        lines = ["import pytest", ""] if any(t.raises for t in tests if t.file == file) else []
        headers[file] = "\n".join([*lines, f"from {package} import {', '.join(used)}"]) + "\n"
    return _Draft(
        rng, difficulty, domain, package, names, module_of, sources, tests, headers, sorted(exports)
    )


def _render_module(doc: str, members: list[dom.Fn], mapping: dict, module_of: dict, module: str) -> str:
    imports: dict[str, set[str]] = collections.defaultdict(set)
    for f in members:
        for role in _refs(f.src, mapping):
            other = module_of.get(role)
            if other is not None and other != module and not _is_method(role, members):
                imports[other].add(mapping[role])
    head = [f'"""{doc}"""']
    if imports:
        head.append("\n".join(f"from .{m} import {', '.join(sorted(n))}" for m, n in sorted(imports.items())))
    body = [string.Template(f.src.strip("\n")).substitute(mapping) for f in members]
    return "\n\n".join(head) + "\n\n\n" + "\n\n\n".join(body) + "\n"


def _is_method(role: str, members: list[dom.Fn]) -> bool:
    return any(f"def ${{{role}}}" in f.src for f in members)


def _scenario(rng: random.Random, sc: dom.Scenario, mapping: dict, file: str) -> _Test:
    drawn: dict[str, object] = {}
    for key, gen in sc.values.items():
        drawn[key] = gen.fn(drawn) if isinstance(gen, dom.Derived) else gen(rng)
    full = {**mapping, **{k: literal(v) for k, v in drawn.items()}}
    sub = lambda s: string.Template(s).substitute(full)
    return _Test(
        file=file,
        name="test_" + string.Template(sc.name).substitute(mapping),
        about=sc.about,
        setup=[sub(line) for line in sc.setup],
        expr=sub(sc.expr),
        raises=sc.raises,
    )


def _outcomes(draft: _Draft, sources: dict[str, str]) -> list[probe.Outcome]:
    return probe.evaluate(
        sources,
        header="",
        setups=[[*draft.headers[t.file].splitlines(), *t.setup] for t in draft.tests],
        exprs=[t.expr for t in draft.tests],
        raises=[t.raises is not None for t in draft.tests],
    )


def _passes(test: _Test, outcome: probe.Outcome) -> bool:
    if test.raises is not None:
        return outcome.error_type == test.raises
    if outcome.error is not None:
        return False
    if test.expected is None or isinstance(test.expected, bool):
        return outcome.value is test.expected
    try:
        return bool(outcome.value == test.expected)
    except Exception:
        return False


def _fix_expectations(draft: _Draft) -> None:
    """Runs the correct code; keeps the scenarios that behave (value is a literal, raises what it should)."""
    kept = []
    for test, outcome in zip(draft.tests, _outcomes(draft, draft.sources)):
        if test.raises is not None:
            if outcome.error_type == test.raises:
                kept.append(test)
        elif outcome.error is None and is_literal(outcome.value):
            test.expected = outcome.value
            kept.append(test)
    names = [t.node_id for t in kept]
    if len(kept) < 4 or len(set(names)) != len(names):
        raise _Reject("too few usable tests")
    draft.tests = kept


# ------------------------------------------------------------------------------------------------- the bug


@dataclasses.dataclass
class _Bug:
    qualname: str
    module: str  # dotted
    buggy_source: str
    line: int
    description: str
    failing: list[int]  # indices into draft.tests
    outcomes: list[probe.Outcome]
    chain: list[str]
    shown: int  # the failing test the report describes
    where: dict[str, str]  # qualname -> dotted module


def _find_bug(draft: _Draft, family: str) -> _Bug:
    graph, where, top, methods = callgraph.call_graph(draft.sources)
    depth = _LAYOUT[min(draft.difficulty, 5)][0]
    called = [callgraph.calls(ast.parse("\n".join([*t.setup, t.expr])), top, methods) for t in draft.tests]
    dists = [callgraph.distances(graph, c) for c in called]
    candidates = sorted(q for q in graph if any(d.get(q) == depth for d in dists))
    draft.rng.shuffle(candidates)
    callables = frozenset(top) | frozenset(methods)
    fallback = None
    tries = 0
    for qual in candidates:
        module = where[qual]
        muts = mutations(draft.sources[module], qual, family, callables)
        draft.rng.shuffle(muts)
        for m in muts[:10]:
            tries += 1
            if tries > 60:
                break
            sources = {**draft.sources, module: m.source}
            outcomes = _outcomes(draft, sources)
            failing = [i for i, (t, o) in enumerate(zip(draft.tests, outcomes)) if not _passes(t, o)]
            if not failing or len(failing) == len(draft.tests):
                continue
            if min(dists[i].get(qual, 99) for i in failing) != depth:
                continue
            test_modules = {where[q] for i in failing for q in called[i]}
            if depth > 0 and module in test_modules:
                continue
            value_fails = [i for i in failing if draft.tests[i].raises is None and outcomes[i].error is None]
            reached = [i for i in failing if dists[i].get(qual) == depth]
            shown = next((i for i in reached if i in value_fails), reached[0])
            bug = _Bug(
                qual,
                module,
                m.source,
                m.line,
                m.description,
                failing,
                outcomes,
                callgraph.chain(graph, called[shown], qual),
                shown,
                where,
            )
            if value_fails:
                return bug
            fallback = fallback or bug
    if fallback is None:
        raise _Reject(f"no {family} bug at depth {depth}")
    return fallback


# ------------------------------------------------------------------------------------------------ writing


def _repo_files(draft: _Draft, sources: dict[str, str]) -> dict[str, str]:
    files = {}
    for module, text in sources.items():
        rel = module.replace(".", "/") + ("/__init__.py" if "." not in module else ".py")
        files[rel] = text
    for file, header in draft.headers.items():
        funcs = []
        for t in draft.tests:
            if t.file != file:
                continue
            lines = [f"def {t.name}():", *(f"    {line}" for line in t.setup)]
            if t.raises is not None:
                lines += [f"    with pytest.raises({t.raises}):", f"        {t.expr}"]
            elif t.expected is None or isinstance(t.expected, bool):
                lines += [f"    result = {t.expr}", f"    assert result is {t.expected!r}"]
            else:
                lines += [f"    result = {t.expr}", f"    assert result == {literal(t.expected)}"]
            funcs.append("\n".join(lines))
        files[file] = header + "\n\n" + "\n\n\n".join(funcs) + "\n"
    return files


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel in sorted(files):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel])


def generate_task(seed: int, difficulty: int, out_dir: Path | str, split: str = "train") -> Task:
    """Generates, writes (to `out_dir / instance_id`) and verifies one task. Deterministic by (seed,
    difficulty); `seed` must lie in `split`'s seed range."""
    if split_of(seed) != split:
        raise ValueError(f"seed {seed} is not in split {split!r} (use split_seed)")
    if not 1 <= difficulty <= 5:
        raise ValueError(f"difficulty must be 1..5, not {difficulty}")
    family = family_of(seed)
    reasons = collections.Counter()
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(f"composer-task/{GENERATOR_VERSION}/{seed}/{difficulty}/{attempt}")
        try:
            draft = _draft(rng, difficulty)
            _fix_expectations(draft)
            bug = _find_bug(draft, family)
            statement = report.statement(draft, bug)
            if report.leaks(draft, bug, statement):
                raise _Reject("report names the fix location")
        except _Reject as e:
            reasons[str(e)] += 1
            continue
        task = _write(draft, bug, statement, family, seed, difficulty, split, attempt, Path(out_dir))
        problem = verify(task)
        if problem is None:
            return task
        reasons[problem] += 1
        shutil.rmtree(task.path)
    raise RuntimeError(f"no valid task for seed {seed} difficulty {difficulty} ({family}): {dict(reasons)}")


def _write(draft, bug, statement, family, seed, difficulty, split, attempt, out_dir: Path) -> Task:
    correct = _repo_files(draft, draft.sources)
    buggy = _repo_files(draft, {**draft.sources, bug.module: bug.buggy_source})
    patch = make_tree_diff(buggy, correct)
    instance_id = f"{draft.package}__d{difficulty}-{seed}"
    path = out_dir / instance_id
    if path.exists():
        shutil.rmtree(path)
    _write_tree(path / "repo", buggy)
    fail = [draft.tests[i].node_id for i in bug.failing]
    passing = [t.node_id for i, t in enumerate(draft.tests) if i not in bug.failing]
    rel = bug.module.replace(".", "/") + ".py"
    metadata = {
        "generator_version": GENERATOR_VERSION,
        "family": family,
        "difficulty": difficulty,
        "seed": seed,
        "split": split,
        "attempt": attempt,
        "domain": draft.domain.key,
        "package": draft.package,
        "bug": {
            "file": rel,
            "function": bug.qualname,
            "line": bug.line,
            "description": bug.description,
            "depth": len(bug.chain) - 1,
            # The call path from the entry point the report shows down to the buggy function, with files.
            "chain": [{"function": q, "file": bug.where[q].replace(".", "/") + ".py"} for q in bug.chain],
        },
        "shown_test": draft.tests[bug.shown].node_id,
        "files": sorted(buggy),
    }
    task = Task(
        instance_id=instance_id,
        problem_statement=statement,
        test_cmd=TEST_CMD,
        FAIL_TO_PASS=fail,
        PASS_TO_PASS=passing,
        patch=patch,
        test_patch="",
        timeout_s=TIMEOUT_S,
        path=path,
        metadata=metadata,
    )
    save_task(task)
    return task


def verify(task: Task) -> str | None:
    """None if the buggy repository fails exactly FAIL_TO_PASS (and passes PASS_TO_PASS) and the gold patch
    makes every test pass; else what is wrong. Runs the tests in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="composer-verify-") as tmp:
        gold = Path(tmp) / "gold"
        shutil.copytree(task.repo, gold)
        try:
            apply_patch(gold, task.patch)
        except PatchError as e:
            return f"gold patch does not apply: {e}"
        try:
            buggy_run, gold_run = probe.run_tests([task.repo, gold])
        except Exception as e:  # a hang, a crash of the runner
            return f"runner: {type(e).__name__}"
    expected = set(task.tests)
    if set(buggy_run) != expected or set(gold_run) != expected:
        return "collected tests differ from the task's"
    failing = {t for t, s in buggy_run.items() if s != "passed"}
    if failing != set(task.FAIL_TO_PASS):
        return "buggy repository fails other tests than FAIL_TO_PASS"
    if any(s != "passed" for s in gold_run.values()):
        return "gold patch leaves failing tests"
    return None


def suite_seeds(count: int, seed: int, split: str = "train", families: Sequence[str] = ()) -> list[int]:
    """The seeds of generate_suite's `count` tasks: split_seed(split, seed + i), i = 0, 1, ..., those of
    `families` only when given."""
    families = check_families(families)
    seeds = []
    i = 0
    while len(seeds) < count:
        task_seed = split_seed(split, seed + i)
        i += 1
        if not families or family_of(task_seed) in families:
            seeds.append(task_seed)
    return seeds


def _generate_timed(task_seed: int, *, difficulty: int, out: Path, split: str) -> tuple[Task, float]:
    t0 = time.perf_counter()
    task = generate_task(task_seed, difficulty, out, split)
    return task, time.perf_counter() - t0


def generate_suite(
    out: Path | str,
    count: int,
    seed: int,
    difficulty: int,
    split: str = "train",
    progress=None,
    families: Sequence[str] = (),
    workers: int = 1,
) -> list[Task]:
    """`count` tasks with the seeds of suite_seeds (all families, or only `families`), generated by
    `workers` processes (each task is independent and a function of its seed, so the files are the same for
    any number). `progress(i, task, seconds)` is called after each one, in seed order, when given."""
    families = check_families(families)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = suite_seeds(count, seed, split, families)
    one = functools.partial(_generate_timed, difficulty=difficulty, out=out, split=split)
    tasks = []
    with contextlib.ExitStack() as stack:
        if workers > 1 and len(seeds) > 1:
            # Spawned, not forked: the caller may hold JAX's threads, which a fork would copy mid-state.
            ctx = multiprocessing.get_context("spawn")
            pool = stack.enter_context(
                concurrent.futures.ProcessPoolExecutor(min(workers, len(seeds)), mp_context=ctx)
            )
            results = pool.map(one, seeds)
        else:
            results = map(one, seeds)
        for task, seconds in results:
            tasks.append(task)
            if progress is not None:
                progress(len(tasks) - 1, task, seconds)
    record = {"split": split, "seed": seed, "difficulty": difficulty, "tasks": [t.instance_id for t in tasks]}
    if families:
        record["families"] = sorted(families)
    (out / "suite.json").write_text(json.dumps(record) + "\n")
    return tasks
