"""Per-task environments: the spec, its hash, building a venv once, and `python -m env.tasks prepare`."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from env.tasks import environments
from env.tasks.__main__ import main as tasks_main

HOST = f"{sys.version_info.major}.{sys.version_info.minor}"


def _task(tmp_path, name, environment):
    path = tmp_path / "suite" / name
    (path / "repo").mkdir(parents=True)
    data = {
        "instance_id": name, "problem_statement": "p", "test_cmd": "python -m pytest -q",
        "FAIL_TO_PASS": ["test_a.py::test_a"], "PASS_TO_PASS": [], "patch": "", "test_patch": "",
        "timeout_s": 10, "environment": environment,
    }  # fmt: skip
    (path / "task.json").write_text(json.dumps(data))
    return SimpleNamespace(instance_id=name, environment=environment, path=path)


def test_parse_checks_keys_and_types():
    assert environments.parse({}) is None
    env = environments.parse({"python": HOST, "requirements": ["pytest"], "install": ["true"]})
    assert env == environments.Environment(HOST, ("pytest",), ("true",))
    with pytest.raises(ValueError, match="unknown key.*pip"):
        environments.parse({"pip": []})
    with pytest.raises(ValueError, match="'python' must be a version"):
        environments.parse({"python": "latest"})
    with pytest.raises(ValueError, match="'requirements' must be a list"):
        environments.parse({"requirements": "pytest"})


def test_key_names_the_spec_not_its_spelling():
    a = environments.parse({"python": HOST, "requirements": ["x==1"]})
    b = environments.parse({"requirements": ["x==1"], "python": HOST, "install": []})
    c = environments.parse({"python": HOST, "requirements": ["x==2"]})
    assert environments.key(a) == environments.key(b) != environments.key(c)


def test_missing_interpreter_is_a_clear_error():
    with pytest.raises(environments.EnvironmentMissing, match="no Python 2.1 on this machine"):
        environments.interpreter("2.1")


def test_prepare_builds_each_environment_once(tmp_path, capsys):
    cache = tmp_path / "cache"
    spec = {"python": HOST, "install": ['echo built >> "$VIRTUAL_ENV/marker"']}
    a, b = _task(tmp_path, "a", spec), _task(tmp_path, "b", spec)
    plain = _task(tmp_path, "plain", {})
    assert environments.python_env(plain, cache) is None
    with pytest.raises(environments.EnvironmentMissing, match="run: python -m env.tasks prepare"):
        environments.python_env(a, cache)
    assert tasks_main(["prepare", str(tmp_path / "suite"), "--cache", str(cache)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["tasks"] == 3 and summary["environments"] == 1
    venv = environments.python_env(a, cache)
    assert venv == environments.python_env(b, cache)
    assert (venv / "marker").read_text() == "built\n"  # install commands ran once, in the venv
    out = subprocess.run(
        [venv / "bin" / "python", "-c", "import sys; print(sys.prefix)"], capture_output=True
    )
    assert out.stdout.decode().strip() == str(venv)
    assert venv.stat().st_mode & 0o005 == 0o005  # sandbox uids may enter and read it
    environments.prepare([a, b], cache, log=lambda line: pytest.fail(f"rebuilt: {line}"))


def test_failed_build_leaves_nothing_half_built(tmp_path):
    cache = tmp_path / "cache"
    task = _task(tmp_path, "bad", {"python": HOST, "install": ["echo broken >&2; exit 3"]})
    with pytest.raises(environments.EnvironmentMissing, match="exit 3.*\n.*broken"):
        environments.prepare([task], cache, log=lambda line: None)
    env = environments.from_task(task)
    assert not environments.venv_dir(env, cache).exists()
    assert tasks_main(["prepare", str(tmp_path / "suite"), "--cache", str(cache)]) == 2
