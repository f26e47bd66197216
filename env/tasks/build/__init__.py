"""The task builder for real Python projects: `python -m env.tasks build --pypi NAME==VERSION | --repo PATH`.

sources.py (sdist download and cache, local checkouts, metadata), layout.py (where tests and code live),
runner.py (test runs in the sandbox and the task's environment), pytest_trace.py (the pytest plugin those
runs load: outcomes, failures, functions each test calls), coverage.py (covered functions), mutations.py
(bug kinds as minimal source edits), statement.py (the problem statement), builder.py (the search: baseline,
pick, check, write).
"""

from env.tasks.build.builder import Options, Summary, build
from env.tasks.build.mutations import KINDS, candidates
from env.tasks.build.sources import BuildError, Project, from_pypi, from_repo

__all__ = [
    "KINDS",
    "BuildError",
    "Options",
    "Project",
    "Summary",
    "build",
    "candidates",
    "from_pypi",
    "from_repo",
]
