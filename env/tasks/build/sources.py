"""Where a project comes from: a PyPI source distribution or a local checkout, copied into a clean tree.

A PyPI sdist is fetched with `pip download --no-deps --no-binary :all: NAME==VERSION` into a cache directory
($COMPOSER_SDIST_CACHE, default ~/.cache/composer/sdists) and reused from there, so a second build of the same
release touches neither the network nor pip. Both kinds of source are copied without version-control data,
caches and compiled files, which are not part of the project a task ships.
"""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

# Never copied: version control, caches, virtual environments, compiled files, build output.
SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox",
     ".venv", "venv", ".eggs", "build", "dist", "node_modules", ".hypothesis"}
)  # fmt: skip
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")


class BuildError(ValueError):
    """The project cannot be built into tasks; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Project:
    """A project tree ready for the builder: `root` holds its files; `dependencies` are its runtime
    requirements (from its metadata, markers evaluated for this interpreter)."""

    name: str
    version: str
    root: Path
    source: str  # "pypi:NAME==VERSION" or "repo:PATH"
    dependencies: tuple[str, ...]


def sdist_cache() -> Path:
    return Path(os.environ.get("COMPOSER_SDIST_CACHE", Path.home() / ".cache" / "composer" / "sdists"))


def parse_spec(spec: str) -> tuple[str, str]:
    """('name', 'version') of 'NAME==VERSION' (a release must be pinned, or the same seed could give other
    tasks tomorrow)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9._+!-]*)\s*", spec)
    if not match:
        raise BuildError(f"--pypi wants NAME==VERSION (a pinned release), got {spec!r}")
    return match.group(1), match.group(2)


def download_sdist(name: str, version: str, cache: Path | None = None, log=print) -> Path:
    """The sdist archive of NAME==VERSION, from the cache or downloaded into it."""
    folder = (cache or sdist_cache()) / f"{_normal(name)}-{version}"
    found = _archives(folder)
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    log(f"downloading the sdist of {name}=={version}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    run = subprocess.run(
        [*cmd, "-q", "-d", str(folder), f"{name}=={version}"], capture_output=True, text=True, timeout=600
    )
    found = _archives(folder)
    if run.returncode != 0 or not found:
        tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-5:])
        raise BuildError(f"no sdist of {name}=={version} could be downloaded:\n{tail}")
    return found[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _archives(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".zip", ".tar.bz2")))


def extract(archive: Path, dest: Path) -> Path:
    """Unpacks `archive` into `dest` (a new directory) and returns the project root inside it."""
    unpacked = dest.with_name(dest.name + ".unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    unpacked.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                target = (unpacked / info.filename).resolve()
                if not str(target).startswith(str(unpacked.resolve()) + os.sep):
                    raise BuildError(f"{archive.name}: member {info.filename!r} leaves the archive")
            z.extractall(unpacked)
    else:
        with tarfile.open(archive) as t:
            t.extractall(unpacked, filter="data")
    entries = list(unpacked.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else unpacked
    copy_tree(top, dest)
    shutil.rmtree(unpacked)
    return dest


def copy_tree(src: Path, dest: Path) -> None:
    """Copies the project at `src` to `dest` without SKIP_DIRS, *.egg-info and compiled files; symbolic
    links are dropped (a task's repository holds regular files only)."""

    def ignore(folder: str, names: list[str]) -> list[str]:
        out = []
        for name in names:
            path = os.path.join(folder, name)
            skipped_dir = os.path.isdir(path) and (name in SKIP_DIRS or name.endswith(".egg-info"))
            if os.path.islink(path) or name.endswith(SKIP_SUFFIXES) or skipped_dir:
                out.append(name)
        return out

    shutil.copytree(src, dest, ignore=ignore)


def from_pypi(spec: str, dest: Path, cache: Path | None = None, log=print) -> Project:
    name, version = parse_spec(spec)
    extract(download_sdist(name, version, cache, log), dest)
    meta_name, _, deps = metadata(dest)
    return Project(meta_name or name, version, dest, f"pypi:{name}=={version}", deps)


def from_repo(path: Path | str, dest: Path) -> Project:
    path = Path(path).resolve()
    if not path.is_dir():
        raise BuildError(f"--repo {path}: not a directory")
    copy_tree(path, dest)
    name, version, deps = metadata(dest)
    return Project(name or path.name, _git_version(path) or version or "local", dest, f"repo:{path}", deps)


def _git_version(path: Path) -> str | None:
    try:
        run = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short=8", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return None
    return run.stdout.strip() if run.returncode == 0 and run.stdout.strip() else None


def metadata(root: Path) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(name, version, runtime requirements) from PKG-INFO, else pyproject.toml's [project], else
    setup.cfg's [options] install_requires. Requirements whose markers are false here are left out."""
    name = version = None
    reqs: list[str] = []
    pkg_info = root / "PKG-INFO"
    pyproject = root / "pyproject.toml"
    if pkg_info.is_file():
        msg = Parser().parsestr(pkg_info.read_text(errors="replace"))
        name, version = msg.get("Name"), msg.get("Version")
        reqs = msg.get_all("Requires-Dist") or []
    if not reqs and pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        name = name or project.get("name")
        version = version or (project.get("version") if isinstance(project.get("version"), str) else None)
        reqs = list(project.get("dependencies", []))
    if not reqs and (root / "setup.cfg").is_file():
        reqs = _setup_cfg_requires((root / "setup.cfg").read_text(errors="replace"))
    return name, version, tuple(r for r in (_applies(r) for r in reqs) if r)


def _setup_cfg_requires(text: str) -> list[str]:
    import configparser

    parser = configparser.ConfigParser()
    try:
        parser.read_string(text)
        value = parser.get("options", "install_requires", fallback="")
    except configparser.Error:
        return []
    return [line.strip() for line in value.splitlines() if line.strip()]


def _applies(text: str) -> str | None:
    """The requirement without its marker when the marker holds here (no extras), else None."""
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.marker is not None:
        try:
            if not req.marker.evaluate({"extra": ""}):
                return None
        except (InvalidMarker, UndefinedEnvironmentName):
            return None
        req.marker = None
    return str(req)
