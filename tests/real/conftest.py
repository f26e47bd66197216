"""A small suite of real tasks, built once per test session by the task builder from two PyPI releases with
different layouts: toolz (tests inside the package, `toolz/tests/`) and cachetools (a `src/` layout).

What the build downloads is cached between sessions, so only a machine's first run uses the network: the
sdists in $COMPOSER_SDIST_CACHE (default ~/.cache/composer/sdists), the task environment (a venv with the
pinned pytest) in $COMPOSER_ENV_CACHE (default ~/.cache/composer/envs), the wheels pip fetched for it in
pip's own cache. The tasks themselves are built every session (that is what is tested), in a directory all
of the session's pytest-xdist workers share: the first worker builds under a file lock and writes a DONE
marker, the others wait for the lock and reuse the suite. Building costs about 10 s here once the caches
are warm.
"""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from filelock import FileLock

from env.sandbox.slots import is_root
from env.tasks import environments
from env.tasks.build import builder, sources
from env.tasks.diffs import apply_patch
from env.tasks.task import Task, load_suite

PACKAGES = {"toolz": "toolz==1.0.0", "cachetools": "cachetools==5.5.0"}
TASKS_PER_PACKAGE = 3
SEED = 1  # a seed whose search discards no mutation for a timeout, so the build stays fast
DONE = "DONE"


def _shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this test session that every xdist worker sees (each worker's basetemp is a folder of
    the session's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _options_key() -> str:
    options = {
        "packages": sorted(PACKAGES.values()),
        "count": TASKS_PER_PACKAGE,
        "seed": SEED,
        "builder": builder.BUILDER_VERSION,
    }
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:12]


def _build(suite: Path) -> dict:
    """Builds every package's tasks into `suite`; returns {package: builder summary}."""
    shutil.rmtree(suite, ignore_errors=True)
    summaries = {}
    for name, spec in PACKAGES.items():
        work = suite.parent / f"project-{name}"
        shutil.rmtree(work, ignore_errors=True)
        project = sources.from_pypi(spec, work, log=lambda _: None)
        options = builder.Options(count=TASKS_PER_PACKAGE, seed=SEED)
        summaries[name] = builder.build(project, suite, options, log=lambda _: None).to_json()
        shutil.rmtree(work)
    return summaries


@pytest.fixture(scope="session")
def real_suite(tmp_path_factory) -> Path:
    """The suite directory: TASKS_PER_PACKAGE tasks of each of PACKAGES, their environment built."""
    if not is_root():
        pytest.skip("the builder and the grader run tests in the sandbox, whose slot uids need root")
    for spec in PACKAGES.values():
        try:
            sources.download_sdist(*sources.parse_spec(spec), log=lambda _: None)
        except sources.BuildError as e:
            pytest.skip(f"PyPI not reachable and {spec} not cached: {e}")
    root = _shared_dir(tmp_path_factory) / f"real-suite-{_options_key()}"
    root.mkdir(parents=True, exist_ok=True)
    suite, done = root / "suite", root / DONE
    with FileLock(str(root / "build.lock")):
        if not done.is_file():
            t0 = time.perf_counter()
            summaries = _build(suite)
            environments.prepare(load_suite(suite), log=lambda _: None)
            record = {"seconds": round(time.perf_counter() - t0, 1), "summaries": summaries}
            done.write_text(json.dumps(record) + "\n")
    return suite


@pytest.fixture(scope="session")
def real_tasks(real_suite) -> dict[str, list[Task]]:
    """{package: its tasks, by instance id}."""
    tasks = sorted(load_suite(real_suite), key=lambda t: t.instance_id)
    return {name: [t for t in tasks if t.instance_id.startswith(f"{name}-")] for name in PACKAGES}


@pytest.fixture
def workspace_of(tmp_path):
    """workspace_of(task, fixed=...): a copy of the task's repository, with the gold patch if `fixed`."""
    count = 0

    def make(task: Task, *, fixed: bool) -> Path:
        nonlocal count
        count += 1
        ws = Path(shutil.copytree(task.repo, tmp_path / f"ws{count}"))
        if fixed:
            apply_patch(ws, task.patch)
        return ws

    return make
