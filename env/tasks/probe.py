"""Running generated code while a task is made: in process from memory, and in a subprocess from disk.

`Probe` imports a package from source texts held in memory (no files) and evaluates test scenarios against
it; the generator uses it to compute expected values and to try candidate bugs quickly. `run_tests` is the
independent check of the written task: a fresh interpreter imports the test files from disk and calls every
test function, with a per-test alarm. Both run only code the generator wrote from its own templates (trusted,
free of loops that can hang); model-written code is only ever run in the sandbox.
"""

import contextlib
import dataclasses
import importlib.abc
import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path

_LOCK = threading.Lock()  # sys.modules and sys.meta_path are process-wide


class _MemoryFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, sources: dict[str, str]):
        self.sources = sources  # module name ('pkg' or 'pkg.mod') -> text

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.sources:
            return None
        is_pkg = "." not in fullname
        return importlib.util.spec_from_loader(fullname, self, is_package=is_pkg)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        filename = f"<{name.replace('.', '/')}{'/__init__' if '.' not in name else ''}.py>"
        exec(compile(self.sources[name], filename, "exec"), module.__dict__)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one test scenario did: returned `value`, or raised `error` ('Type: message')."""

    value: object = None
    error: str | None = None
    error_type: str | None = None


@contextlib.contextmanager
def loaded(sources: dict[str, str]):
    """Imports the package in `sources` (module name -> text) for the duration of the block."""
    names = set(sources)
    with _LOCK:
        saved = {
            n: sys.modules.pop(n)
            for n in list(sys.modules)
            if n.split(".")[0] in {s.split(".")[0] for s in names}
        }
        finder = _MemoryFinder(sources)
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            for n in [n for n in sys.modules if n in names]:
                del sys.modules[n]
            sys.modules.update(saved)


def evaluate(
    sources: dict[str, str], header: str, setups: list[list[str]], exprs: list[str], raises: list[bool]
):
    """Runs each scenario (its setup lines, then its expression or, if `raises`, its statement) in a fresh
    namespace after `header` (the test file's imports). Returns one Outcome per scenario."""
    out = []
    with loaded(sources):
        for setup, expr, stmt in zip(setups, exprs, raises):
            ns: dict = {}
            try:
                exec(header, ns)
                for line in setup:
                    exec(line, ns)
                if stmt:
                    exec(expr, ns)
                    out.append(Outcome(value=None))
                else:
                    out.append(Outcome(value=eval(expr, ns)))
            except Exception as e:  # the scenario's own failure is data, not an error here
                out.append(Outcome(error=f"{type(e).__name__}: {e}", error_type=type(e).__name__))
    return out


# ------------------------------------------------------------------------------------ subprocess verifier

_RUNNER = r"""
import importlib.util, json, signal, sys
from pathlib import Path

def _alarm(*_):
    raise TimeoutError("test took too long")

signal.signal(signal.SIGALRM, _alarm)
results = []
for root in map(Path, sys.argv[2:]):
    sys.path.insert(0, str(root))
    before = set(sys.modules)
    out = {}
    for path in sorted((root / "tests").glob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        spec = importlib.util.spec_from_file_location("_gen_test_" + path.stem, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            out[rel] = "error"
            continue
        for name, fn in list(vars(module).items()):
            if name.startswith("test_") and callable(fn):
                signal.setitimer(signal.ITIMER_REAL, float(sys.argv[1]))
                try:
                    fn()
                    status = "passed"
                except Exception as e:
                    status = "failed"
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                out[rel + "::" + name] = status
    for name in set(sys.modules) - before:
        del sys.modules[name]
    sys.path.remove(str(root))
    results.append(out)
print(json.dumps(results))
"""


def run_tests(roots: list[Path], per_test_s: float = 2.0, timeout_s: float = 30.0) -> list[dict[str, str]]:
    """Per-test outcomes ('passed' / 'failed'; a test file that fails to import: 'error') of each
    repository in `roots`, from one fresh interpreter (-I: no user site, no environment paths; -B: no
    bytecode files left in the trees)."""
    # Absolute: the runner starts in the first root, where a relative path names nothing.
    roots = [Path(r).resolve() for r in roots]
    proc = subprocess.run(
        [sys.executable, "-I", "-B", "-c", _RUNNER, str(per_test_s), *map(str, roots)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(roots[0]),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"test runner failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)
