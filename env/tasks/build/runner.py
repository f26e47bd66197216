"""Runs a project's tests in the sandbox, in the task's environment, and reads per-test outcomes back.

One Runner holds one workspace (a copy of the project) and one sandbox over it for a whole build: a
mutation is written into the workspace, its tests run, and the original file is put back. Every run loads
the plugin in pytest_trace.py from the sandbox's /tmp, which reports outcomes, failures and (for the
baseline) the project functions each test called. Bytecode is never written (PYTHONDONTWRITEBYTECODE), so a
mutated file of the same size and mtime second as the original cannot be shadowed by a stale .pyc.
"""

import dataclasses
import json
import shlex
import time
from pathlib import Path

import env.sandbox as sandbox
from env.sandbox import Limits
from env.tasks.build.layout import Layout

PLUGIN = "composer_build_trace"
PYTEST = "python -m pytest -q -p no:cacheprovider"
EXIT_S = 10  # how long a run may linger after its tests are done


@dataclasses.dataclass
class Run:
    """What one test run showed. tests: node id -> outcome (see pytest_trace.py); calls: node id -> the
    project functions ('file.py::Qual.name') it called, for traced runs only."""

    tests: dict[str, str]
    failures: dict[str, dict]
    collection_errors: list[dict]
    calls: dict[str, list[str]]
    seconds: float
    timed_out: bool
    hung: bool  # the tests ran but the process did not exit by itself (see pytest_trace.py)
    output: str

    @property
    def passed(self) -> set[str]:
        return {t for t, o in self.tests.items() if o == "passed"}

    @property
    def broken(self) -> bool:
        """No report at all (the run crashed or timed out), a process that does not exit, or a file that
        could not be collected."""
        return self.timed_out or self.hung or not self.tests or bool(self.collection_errors)


def test_cmd(layout: Layout, paths: list[str] | tuple[str, ...]) -> str:
    """The task's test command: plain pytest over `paths` (the grader adds its own report options)."""
    return layout.env_prefix + PYTEST + " " + " ".join(shlex.quote(p) for p in paths)


class Runner:
    """Test runs over a private copy of `repo`, with the interpreter of `venv` (None: this project's)."""

    def __init__(self, repo: Path, layout: Layout, venv: Path | None, *, cpu_s: int = 600):
        self.layout = layout
        self.workspace = sandbox.make_workspace(repo, size_mb=512)
        limits = Limits(timeout_s=600, cpu_s=cpu_s, workspace_mb=512, tmp_mb=256, memory_mb=4096)
        try:
            kwargs = {"python_env": venv} if venv is not None else {}
            self.box = sandbox.Sandbox(self.workspace, limits=limits, **kwargs)
        except BaseException:
            sandbox.remove_workspace(self.workspace)
            raise
        self.tmp = self.box.tmp
        self.box.host_path(f"{self.tmp}/{PLUGIN}.py").write_text(
            (Path(__file__).with_name("pytest_trace.py")).read_text()
        )

    def run(self, paths: list[str] | tuple[str, ...], *, trace: bool = False, timeout: float = 600) -> Run:
        report = f"{self.tmp}/report.json"
        host_report = self.box.host_path(report)
        host_report.unlink(missing_ok=True)
        hung = host_report.with_name(host_report.name + ".hung")
        hung.unlink(missing_ok=True)
        pythonpath = ":".join(p for p in (self.layout.pythonpath, self.tmp) if p)
        env = {
            "PYTHONPATH": pythonpath,
            "PYTHONDONTWRITEBYTECODE": "1",
            "COMPOSER_TRACE_OUT": report,
            "COMPOSER_TRACE": "1" if trace else "0",
            "COMPOSER_TRACE_EXIT_S": str(EXIT_S),
        }
        command = f"{PYTEST} -p {PLUGIN} " + " ".join(shlex.quote(p) for p in paths)
        t0 = time.perf_counter()
        result = self.box.run(command, timeout=timeout, env=env)
        seconds = time.perf_counter() - t0
        data = {}
        if host_report.is_file():
            try:
                data = json.loads(host_report.read_text())
            except json.JSONDecodeError:
                data = {}
        return Run(
            tests=data.get("tests", {}),
            failures=data.get("failures", {}),
            collection_errors=data.get("collection_errors", []),
            calls=data.get("calls", {}),
            seconds=seconds,
            timed_out=result.timed_out,
            hung=hung.exists(),
            output=result.output,
        )

    def write(self, rel: str, text: str) -> None:
        """Replaces a file of the workspace (the sandbox only reads it)."""
        (self.workspace / rel).write_text(text, encoding="utf-8")

    def close(self) -> None:
        self.box.close()
        sandbox.remove_workspace(self.workspace)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
