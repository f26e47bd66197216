"""Where a project keeps its tests and its importable code.

Three layouts, as real projects ship them:

    root     tests beside the package: tests/ (or test/, testing/) or test_*.py at the top
    package  tests inside the package: pkg/tests/, pkg/test_x.py (pkg may sit under src/ too)
    src      the package under src/: the test command runs with PYTHONPATH=src, since the project is not
             installed into the task's environment and the project's own config files are left as shipped

Test files are pytest's defaults (test_*.py, *_test.py). A project that keeps its tests elsewhere names
them with --tests.
"""

import dataclasses
import fnmatch
import os
from pathlib import Path

from env.tasks.build.sources import SKIP_DIRS, BuildError

TEST_DIR_NAMES = ("tests", "test", "testing")
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py")
# Top-level folders that hold no package code (their .py files are never mutated or collected).
NOT_CODE = frozenset({"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools", "ci"})
MAX_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class Layout:
    kind: str  # 'root' | 'package' | 'src'
    tests: tuple[str, ...]  # repository-relative test directories and files to collect
    pythonpath: str | None  # 'src' for a src/ layout, else None

    @property
    def env_prefix(self) -> str:
        """What goes before `python -m pytest` in a test command."""
        return f"PYTHONPATH={self.pythonpath} " if self.pythonpath else ""


def is_test_file(rel: str) -> bool:
    """Whether the repository-relative path is a test module, conftest or inside a test directory."""
    parts = rel.split("/")
    name = parts[-1]
    if name == "conftest.py" or any(fnmatch.fnmatch(name, p) for p in TEST_FILE_PATTERNS):
        return True
    return any(p in TEST_DIR_NAMES for p in parts[:-1])


def _has_tests(folder: Path) -> bool:
    for _, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        if any(fnmatch.fnmatch(f, p) for f in filenames for p in TEST_FILE_PATTERNS):
            return True
    return False


def _packages(folder: Path) -> list[Path]:
    """Import packages directly in `folder` (directories with an __init__.py)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_dir() and p.name not in SKIP_DIRS and (p / "__init__.py").is_file()
    )


def _tests_in_package(pkg: Path, root: Path, depth: int = 0) -> list[str]:
    """Test directories and test modules inside the package `pkg` (and its subpackages)."""
    found = []
    for entry in sorted(pkg.iterdir()):
        rel = entry.relative_to(root).as_posix()
        test_dir = entry.is_dir() and entry.name in TEST_DIR_NAMES and _has_tests(entry)
        if test_dir or entry.is_file() and any(fnmatch.fnmatch(entry.name, p) for p in TEST_FILE_PATTERNS):
            found.append(rel)
        elif entry.is_dir() and (entry / "__init__.py").is_file() and depth < MAX_DEPTH:
            found.extend(_tests_in_package(entry, root, depth + 1))
    return found


def detect(
    root: Path, tests: tuple[str, ...] = (), pythonpath: str | None = None, name: str | None = None
) -> Layout:
    """The layout of the project at `root`; `tests` and `pythonpath` override what is detected.

    Raises BuildError when no tests are found (an sdist that ships none, or tests under a name pytest does
    not collect by default).
    """
    root = Path(root)
    src = root / "src"
    if pythonpath is None and src.is_dir() and (_packages(src) or any(src.glob("*.py"))):
        pythonpath = "src"
    if pythonpath is not None and not (root / pythonpath).is_dir():
        raise BuildError(f"--pythonpath {pythonpath}: no such directory in the project")
    if tests:
        for t in tests:
            if not (root / t).exists():
                raise BuildError(f"--tests {t}: no such file or directory in the project")
        inside = any(_inside_package(root, t) for t in tests)
        kind = "src" if pythonpath == "src" else "package" if inside else "root"
        return Layout(kind, tuple(tests), pythonpath)
    found = [name for name in TEST_DIR_NAMES if (root / name).is_dir() and _has_tests(root / name)] + sorted(
        p.name
        for p in root.iterdir()
        if p.is_file() and any(fnmatch.fnmatch(p.name, t) for t in TEST_FILE_PATTERNS)
    )
    inside = []
    for base in [root] + ([root / pythonpath] if pythonpath else []):
        for pkg in _packages(base):
            if pkg.name not in NOT_CODE and pkg.name not in TEST_DIR_NAMES:
                inside.extend(_tests_in_package(pkg, root))
    if not found and not inside:
        raise BuildError(
            f"{name or root.name}: the project ships no tests pytest would collect (no tests/ or test/ "
            "directory, no test_*.py or *_test.py at the top or inside a package); name them with --tests, "
            "or build from a checkout with --repo"
        )
    kind = "src" if pythonpath == "src" else "package" if inside and not found else "root"
    return Layout(kind, tuple(found + inside), pythonpath)


def _inside_package(root: Path, rel: str) -> bool:
    parts = Path(rel).parts
    base = root
    if parts and parts[0] == "src":
        base, parts = root / "src", parts[1:]
    return len(parts) > 1 and (base / parts[0] / "__init__.py").is_file()


def source_files(root: Path, layout: Layout) -> list[str]:
    """Repository-relative .py files that hold the project's code: not tests, conftest, setup.py, docs or
    examples. Only these are mutated."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        top = rel_dir.split("/")[0] if rel_dir != "." else ""
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and not (rel_dir == "." and d in NOT_CODE)
        )
        if top in NOT_CODE:
            continue
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if name.endswith(".py") and name != "setup.py" and not is_test_file(rel):
                out.append(rel)
    return out
