"""Suites from directories: a fixed task order with or without generator seeds, a deterministic split."""

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from composer.pipeline import data as data_lib
from composer.pipeline import suites
from experiments import composer as composer_config

ROOT = Path(__file__).resolve().parents[3]


def _task(name: str, seed: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(instance_id=name, metadata={} if seed is None else {"seed": seed})


def test_seed_order_when_every_task_has_a_seed_else_name_order():
    seeded = [_task("b", 2), _task("a", 3), _task("c", 1)]
    assert [t.instance_id for t in suites.suite_order(seeded)] == ["c", "b", "a"]
    mixed = [_task("b", 2), _task("a"), _task("c", 1)]
    assert [t.instance_id for t in suites.suite_order(mixed)] == ["a", "b", "c"]


def test_the_split_depends_on_the_instance_ids_alone():
    suite = [_task(f"task-{i:02d}") for i in range(23)]
    train, heldout = suites.split(suite, n_heldout=200)
    assert len(heldout) == 23 // 5 and len(train) == 23 - len(heldout)
    assert {t.instance_id for t in train} | {t.instance_id for t in heldout} == {t.instance_id for t in suite}
    assert [t.instance_id for t in train] == sorted(t.instance_id for t in train)  # the suite's order kept
    shuffled = random.Random(0).sample(suite, len(suite))
    assert {t.instance_id for t in suites.split(shuffled, 200)[1]} == {t.instance_id for t in heldout}
    assert len(suites.split(suite, n_heldout=2)[1]) == 2  # env.n_heldout_tasks bounds it
    assert len(suites.split(suite[:3], n_heldout=200)[1]) == 1  # at least one
    with pytest.raises(ValueError, match="eval.tasks"):
        suites.split(suite[:1], 200)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    """A generated suite of 6 tasks written by the command line, its task.json without metadata.seed."""
    out = tmp_path_factory.mktemp("suite") / "suite"
    subprocess.run(
        [sys.executable, "-m", "env.tasks", "generate", "--out", str(out), "--count", "6", "--seed", "0"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    for path in out.glob("*/task.json"):
        task = json.loads(path.read_text())
        del task["metadata"]["seed"]
        path.write_text(json.dumps(task))
    return out


def test_a_suite_directory_gives_the_train_and_held_out_tasks(suite_dir, tmp_path):
    config = composer_config.get_config("tiny")
    config.env.tasks = str(suite_dir)
    train = data_lib.task_suite(config, tmp_path, "train")
    heldout = data_lib.task_suite(config, tmp_path, "heldout")
    names = sorted(p.parent.name for p in suite_dir.glob("*/task.json"))
    assert len(heldout) == 1 and len(train) == 5  # a suite directory is used whole (not env.n_train_tasks)
    assert sorted(t.instance_id for t in train + heldout) == names
    assert [t.instance_id for t in train] == sorted(t.instance_id for t in train)  # name order
    assert not (tmp_path / "tasks").exists()  # nothing generated
    # With eval.tasks, the held-out tasks are that suite's, and the train suite is all of env.tasks.
    config.eval.tasks = str(suite_dir)
    assert len(data_lib.task_suite(config, tmp_path, "train")) == 6
    assert [t.instance_id for t in data_lib.task_suite(config, tmp_path, "heldout")] == names


def test_an_empty_suite_directory_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path)):
        suites.load(tmp_path)


def test_a_suite_whose_environments_are_not_built_fails_to_load_saying_the_prepare_command(
    tmp_path, monkeypatch
):
    # Before a run starts, not as an error in every episode.
    suite = tmp_path / "suite"
    repo = suite / "t1" / "repo"
    repo.mkdir(parents=True)
    task = {
        "instance_id": "t1", "problem_statement": "p", "test_cmd": "python -m pytest -q",
        "FAIL_TO_PASS": ["test_a.py::test_a"], "PASS_TO_PASS": [], "patch": "", "test_patch": "",
        "timeout_s": 10, "environment": {"requirements": ["pytest"]},
    }  # fmt: skip
    (suite / "t1" / "task.json").write_text(json.dumps(task))
    monkeypatch.setenv("COMPOSER_ENV_CACHE", str(tmp_path / "empty-cache"))
    from env.tasks.environments import EnvironmentMissing

    with pytest.raises(
        EnvironmentMissing, match=f"1 task environment.*run: python -m env.tasks prepare {suite}"
    ):
        suites.load(suite)
    task["environment"] = {}
    (suite / "t1" / "task.json").write_text(json.dumps(task))
    assert [t.instance_id for t in suites.load(suite)] == [
        "t1"
    ]  # the project's interpreter: nothing to build
