"""A task's venv inside the sandbox (`python_env`): its interpreter first on PATH, read-only, at every level,
also when the venv lies under a directory the slot uids cannot enter."""

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from env.sandbox import Limits, Sandbox, make_workspace, pythons, remove_workspace
from env.sandbox import isolation as iso
from env.sandbox.slots import is_root

LIMITS = Limits(timeout_s=20.0)
BASE = getattr(sys, "_base_executable", None) or sys.executable  # what env.tasks.environments builds with


SYSTEM_PYTHON = "/usr/bin/python3"


def _venv(path: Path, base: str = BASE) -> Path:
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True, timeout=60)
    return path


@pytest.fixture(scope="module")
def venvs():
    """{"open": a venv every uid can reach, "closed": one under a mode-700 directory, "system": one of the
    system's Python (reachable by every uid), where there is one}."""
    top = Path(tempfile.mkdtemp(prefix="composer-venvs-"))  # mode 0700
    os.chmod(top, 0o755)
    (top / "closed").mkdir(mode=0o700)
    os.chmod(top / "closed", 0o700)
    made = {"open": _venv(top / "open"), "closed": _venv(top / "closed" / "venv")}
    if os.path.exists(SYSTEM_PYTHON):
        made["system"] = _venv(top / "system", SYSTEM_PYTHON)
    yield made
    if is_root():
        pythons.remove_host_bind(str(made["closed"]))
    subprocess.run(["rm", "-rf", str(top)], check=True)


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "README").write_text("x\n")
    ws = make_workspace(tmp_path / "repo")
    yield ws
    remove_workspace(ws)


def _skip_unavailable(level: str) -> None:
    if level != "none" and iso.probe(level) is not None:
        pytest.skip(f"{level} does not work here: {iso.probe(level)}")


@pytest.mark.parametrize("where", ["open", "closed", "system"])
@pytest.mark.parametrize("level", ["bwrap", "unshare", "none"])
def test_commands_run_the_venv_read_only(venvs, workspace, level, where):
    _skip_unavailable(level)
    if where not in venvs:
        pytest.skip(f"no {SYSTEM_PYTHON} here")
    venv = venvs[where]
    base_blocked = any(pythons.needs_route(b) for b in pythons.venv_base_prefixes(venv))
    if level == "none" and base_blocked:
        # No namespace can bind the base interpreter at its own path: the error says what to change.
        with pytest.raises(ValueError, match=r"base interpreter .*chmod o\+x"):
            Sandbox(workspace, limits=LIMITS, isolation=level, python_env=venv)
        return
    with Sandbox(workspace, limits=LIMITS, isolation=level, python_env=venv) as sb:
        script = "which python; python -c 'import sys; print(sys.prefix)'; echo $VIRTUAL_ENV"
        which, prefix, virtual_env = sb.run(script).output.split()
        if level == "none":  # seen where the slot uid reaches it: itself, or its route (the same directory)
            assert os.path.samefile(prefix, venv) and virtual_env == prefix
        else:
            assert prefix == virtual_env == str(venv)
        assert which == f"{prefix}/bin/python"
        # The venv's own packages, not the project's: a --without-pip venv has no pytest.
        assert sb.run("python -c 'import pytest'").exit_code != 0
        assert sb.run("python -m pytest --version").exit_code != 0
        write = sb.run('touch "$VIRTUAL_ENV/planted" && echo written')
        assert write.exit_code != 0 and "written" not in write.output
        assert not (venv / "planted").exists()
        # Shell tools stay on PATH after the venv.
        assert sb.run("command -v bash && ls / >/dev/null").exit_code == 0


def test_without_python_env_commands_run_the_projects_python(workspace):
    with Sandbox(workspace, limits=LIMITS) as sb:
        assert sb.python_env is None
        result = sb.run("python -c 'import sys, pytest; print(sys.prefix)'; echo ${VIRTUAL_ENV:-unset}")
        assert result.output.split() == [sys.prefix, "unset"]


def test_a_directory_that_is_not_a_venv_is_refused(workspace, tmp_path):
    with pytest.raises(ValueError, match="not a venv"):
        Sandbox(workspace, limits=LIMITS, python_env=tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        Sandbox(workspace, limits=LIMITS, python_env=tmp_path / "missing")


def test_venv_base_prefixes_reads_home(tmp_path):
    venv = _venv(tmp_path / "v")
    bases = pythons.venv_base_prefixes(venv)
    assert os.path.realpath(Path(bases[0]) / "bin") == os.path.realpath(Path(BASE).parent)
    found = pythons.pythons(venv)
    assert found.venv == str(venv.resolve())
    assert found.bins[0] == f"{venv.resolve()}/bin" and f"{sys.prefix}/bin" in found.bins


def test_a_tasks_environment_runs_its_episode_and_its_grading(tmp_path, monkeypatch):
    """The expert's sandbox and grading's both run the task's venv: one that sees the base's packages
    (pytest) and announces itself from a .pth file at every interpreter start."""
    environments = pytest.importorskip("env.tasks.environments")
    from env.expert import solve
    from env.tasks import generate_task

    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    task = dataclasses.replace(
        generate_task(2, 2, tmp_path / "tasks", "train"), environment={"python": version}
    )
    cache = tmp_path / "envs"
    venv = environments.venv_dir(environments.from_task(task), cache)
    subprocess.run(
        [BASE, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=60
    )
    site = venv / "lib" / f"python{version}" / "site-packages"
    (site / "announce.pth").write_text("import sys; sys.stderr.write('[task venv ' + sys.prefix + ']\\n')\n")
    (venv / environments.READY).write_text("test\n")
    monkeypatch.setenv(environments.CACHE_VARIABLE, str(cache))
    assert environments.python_env(task) == venv
    try:
        trajectory = solve(task)
    finally:
        if is_root():
            pythons.remove_host_bind(str(venv))  # the route a venv under pytest's 0700 tmp dir took
    assert trajectory.reward == 1.0
    marker = f"[task venv {venv}]"
    assert marker in trajectory.grade.output
    assert any(marker in m.content for m in trajectory.messages if m.role == "tool")
