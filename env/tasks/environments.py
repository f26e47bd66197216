"""Per-task Python environments: the interpreter and packages a task's tests run with.

A task may name its environment in task.json:

    "environment": {"python": "3.11", "requirements": ["pytest==8.3.3", "attrs>=23"], "install": ["..."]}

python: the interpreter version (an interpreter of that version must be on the host: `pythonX.Y` on PATH,
or the one running this code); requirements: pip requirement strings; install: shell commands run in the
new environment after pip (with its bin/ first on PATH), e.g. to build an extension. A task without the
field runs with the project's own interpreter (generated tasks do).

`python -m env.tasks prepare SUITE` builds each distinct environment once: a venv named by the hash of
its spec in the cache directory ($COMPOSER_ENV_CACHE, default ~/.cache/composer/envs). That is the only
step that uses the network; episodes and grading then run the venv's interpreter inside the sandbox, which
sees it read-only and has no network. Building runs pip and the install commands on the host, like
building a container image: prepare suites you trust.
"""

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

KEYS = ("python", "requirements", "install")
READY = "READY"  # written last: a venv without it is a failed or interrupted build
CACHE_VARIABLE = "COMPOSER_ENV_CACHE"


class EnvironmentMissing(ValueError):
    """A task's environment has not been built (or cannot be)."""


@dataclasses.dataclass(frozen=True)
class Environment:
    python: str
    requirements: tuple[str, ...] = ()
    install: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"python": self.python, "requirements": list(self.requirements), "install": list(self.install)}


def parse(spec: dict, where: str = "environment") -> Environment | None:
    """The Environment a task.json `environment` object describes; None for an empty one. Raises
    ValueError naming the first problem."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: must be an object, not {type(spec).__name__}")
    if not spec:
        return None
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")
    python = spec.get("python", f"{sys.version_info.major}.{sys.version_info.minor}")
    if not isinstance(python, str) or not python.replace(".", "").isdigit() or python.count(".") != 1:
        raise ValueError(f"{where}: 'python' must be a version like \"3.11\", not {python!r}")
    lists = {}
    for name in ("requirements", "install"):
        value = spec.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise ValueError(f"{where}: {name!r} must be a list of non-empty strings")
        lists[name] = tuple(value)
    return Environment(python, lists["requirements"], lists["install"])


def from_task(task) -> Environment | None:
    """The task's environment, or None when it runs with the project's interpreter."""
    return parse(getattr(task, "environment", None) or {}, f"{task.instance_id}: environment")


def key(env: Environment) -> str:
    """A short stable name of the environment: the hash of its spec."""
    text = json.dumps(env.to_json(), sort_keys=True, separators=(",", ":"))
    return f"py{env.python}-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or "~/.cache/composer/envs").expanduser()


def interpreter(version: str) -> str:
    """A host interpreter of `version` (the running one when it matches, else `pythonX.Y` on PATH)."""
    if version == f"{sys.version_info.major}.{sys.version_info.minor}":
        return getattr(sys, "_base_executable", None) or sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        raise EnvironmentMissing(
            f"no Python {version} on this machine (python{version} is not on PATH); install it "
            f"(e.g. `uv python install {version}` or pyenv) or change the suite's environment.python"
        )
    return found


def venv_dir(env: Environment, cache: Path | None = None) -> Path:
    return (cache or cache_root()) / key(env)


def is_built(env: Environment, cache: Path | None = None) -> bool:
    return (venv_dir(env, cache) / READY).is_file()


def ensure(env: Environment, cache: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The venv directory of `env`, built first if it is not there yet (once, under a file lock, so that
    parallel builders wait for each other). A failed build leaves no READY marker and is redone."""
    target = venv_dir(env, cache)
    if (target / READY).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / READY).is_file():
            return target
        shutil.rmtree(target, ignore_errors=True)
        t0 = time.time()
        log(f"environment {target.name}: building ({_describe(env)})")
        try:
            _build(env, target)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        log(f"environment {target.name}: ready in {time.time() - t0:.1f}s at {target}")
    return target


def _describe(env: Environment) -> str:
    parts = [f"python {env.python}", f"{len(env.requirements)} requirements"]
    if env.install:
        parts.append(f"{len(env.install)} install commands")
    return ", ".join(parts)


def _run(argv: list[str], what: str, **kwargs) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-20:]
        raise EnvironmentMissing(f"{what} failed (exit {done.returncode}):\n" + "\n".join(tail))


def _build(env: Environment, target: Path) -> None:
    # Venvs are not relocatable (scripts name their interpreter by absolute path): built in place.
    _run([interpreter(env.python), "-m", "venv", str(target)], f"creating the venv {target}")
    python = str(target / "bin" / "python")
    if env.requirements:
        _run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *env.requirements],
            "pip install " + " ".join(env.requirements),
        )
    variables = {**os.environ, "VIRTUAL_ENV": str(target), "PATH": f"{target}/bin:{os.environ['PATH']}"}
    for command in env.install:
        _run(["bash", "-c", command], f"install command {command!r}", cwd=target, env=variables)
    (target / "environment.json").write_text(json.dumps(env.to_json(), indent=1) + "\n")
    # Sandboxed commands run as unprivileged uids: everything readable, directories traversable.
    for dirpath, dirnames, filenames in os.walk(target):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, mode | (0o555 if os.path.isdir(path) or mode & 0o100 else 0o444))
    os.chmod(target, 0o755)
    (target / READY).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")


def python_env(task, cache: Path | None = None) -> Path | None:
    """The built venv the task's commands run with; None for a task without an environment. Raises
    EnvironmentMissing when the environment has not been built."""
    env = from_task(task)
    if env is None:
        return None
    target = venv_dir(env, cache)
    if not (target / READY).is_file():
        suite = task.path.parent if getattr(task, "path", None) else "SUITE"
        raise EnvironmentMissing(
            f"{task.instance_id}: its environment {target.name} is not built; run: "
            f"python -m env.tasks prepare {suite}"
        )
    return target


def unbuilt(tasks: Iterable, cache: Path | None = None) -> list[str]:
    """The venv names of the environments the tasks name that are not built yet."""
    envs = {env for env in map(from_task, tasks) if env is not None}
    return sorted(key(env) for env in envs if not is_built(env, cache))


def require_built(tasks: list, suite: Path | str, cache: Path | None = None) -> None:
    """Raises EnvironmentMissing, with the command that builds them, when a task's environment is not
    built: before a run starts, not as an error in every episode."""
    missing = unbuilt(tasks, cache)
    if missing:
        raise EnvironmentMissing(
            f"{suite}: {len(missing)} task environment(s) not built ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); run: python -m env.tasks prepare {suite}"
        )


def prepare(
    tasks: Iterable, cache: Path | None = None, log: Callable[[str], None] = print
) -> dict[str, list[str]]:
    """Builds every distinct environment the tasks name; returns {venv name: instance ids using it}."""
    by_env: dict[Environment, list[str]] = {}
    for task in tasks:
        env = from_task(task)
        if env is not None:
            by_env.setdefault(env, []).append(task.instance_id)
    out = {}
    for env, ids in by_env.items():
        out[ensure(env, cache, log).name] = ids
    return out
