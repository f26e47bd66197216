"""launch.py: the locked config and the modes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import composer as composer_config

ROOT = Path(__file__).resolve().parents[1]


def _launch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "launch.py", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_unknown_key_fails_before_work_naming_it(tmp_path):
    workdir = tmp_path / "w"
    r = _launch("--config=experiments/composer.py:tiny", "--config.rl.lrr=1", f"--workdir={workdir}")
    assert r.returncode != 0
    assert "rl.lrr" in r.stderr
    assert not workdir.exists()


def test_an_unknown_tool_fails_before_work_naming_it(tmp_path):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny", "--config.env.tools=grep,grap", f"--workdir={workdir}"
    )
    assert r.returncode != 0
    assert "'grap'" in r.stderr
    assert not workdir.exists()


def test_an_unknown_bug_family_fails_before_work_naming_it(tmp_path):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny",
        "--config.env.families=early_return,early_retrun",
        f"--workdir={workdir}",
    )
    assert r.returncode != 0
    assert "env.families" in r.stderr and "'early_retrun'" in r.stderr
    assert not workdir.exists()


def test_known_override_is_accepted_and_typed():
    config = composer_config.get_config("tiny")
    config.lock()
    config.rl.learning_rate = 3e-6
    assert config.rl.learning_rate == 3e-6
    with pytest.raises(AttributeError):
        config.rl.lrr = 1


@pytest.mark.parametrize("variant", [None, "tiny", "gpu"])
def test_variants_have_every_section(variant):
    config = composer_config.get_config(variant)
    for section in ("model", "moe", "mesh", "optim", "rl", "sampling", "env", "eval", "checkpoint"):
        assert section in config, section


def test_unknown_variant_is_an_error():
    with pytest.raises(ValueError, match="nope"):
        composer_config.get_config("nope")


def test_an_unknown_chat_template_choice_fails_before_work_naming_it(tmp_path):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny", "--config.model.chat_template=qwen", f"--workdir={workdir}"
    )
    assert r.returncode != 0
    assert "model.chat_template" in r.stderr and "'qwen'" in r.stderr
    assert not workdir.exists()


def test_a_search_model_that_is_not_one_fails_before_work_naming_the_key(tmp_path):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny",
        f"--config.env.search_model={tmp_path}",
        f"--workdir={workdir}",
    )
    assert r.returncode != 0
    assert "env.search_model" in r.stderr and "params.npz" in r.stderr
    assert not workdir.exists()


def test_eval_of_a_pretrained_checkpoint_runs(tmp_path):
    """The fixture checkpoint with Qwen3's own chat template: the episodes are prompted in it."""
    checkpoint = tmp_path / "qwen3_moe"
    shutil.copytree(ROOT / "tests/fixtures/hf/qwen3_moe", checkpoint)
    shutil.copy(ROOT / "tests/fixtures/chat_templates/qwen3.jinja", checkpoint / "chat_template.jinja")
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny",
        f"--config.model.init_from={checkpoint}",
        "--config.eval.n_tasks=2",
        "--config.env.max_turns=2",
        "--mode=eval",
        f"--workdir={workdir}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "solve rate" in r.stdout and "over 2 held-out episodes" in r.stdout
    assert "conversations in the checkpoint's chat template" in r.stderr
    stats = json.loads((workdir / "eval_pretrained.json").read_text())
    assert stats["episodes"] == 2 and stats["tool_calls_per_episode"] >= 0


def test_info_prints_parameter_counts():
    r = _launch("--config=experiments/composer.py:tiny", "--mode=info")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "parameters: total" in r.stdout and "active per token" in r.stdout


def test_the_compilation_cache_directory_is_the_environment_s_else_the_config_s(monkeypatch, tmp_path):
    from composer import run

    config = composer_config.get_config("tiny")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    config.compilation_cache_dir = ""
    assert run.compilation_cache(config) is None  # off
    # On: a compiled program lands in the directory (in a process of its own: JAX's cache settings hold
    # from before a process's first compilation).
    code = (
        "import jax, jax.numpy as jnp\n"
        "from composer import run\n"
        "from experiments.composer import get_config\n"
        "c = get_config('tiny')\n"
        f"c.compilation_cache_dir = {str(tmp_path / 'ours')!r}\n"
        "print(run.compilation_cache(c))\n"
        "jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()\n"
    )
    for env, where in (({}, "ours"), ({"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "theirs")}, "theirs")):
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
            env=dict(os.environ, **env),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(tmp_path / where)
        # The program, under JAX's cache naming (an entry per program, '-cache'), and the size limit's lock.
        names = [p.name for p in (tmp_path / where).iterdir()]
        assert any(n.startswith("jit__lambda") and n.endswith("-cache") for n in names), names
        assert ".lockfile" in names


@pytest.mark.parametrize("key", ["screen_tasks", "search_turn_tasks", "similarity_reward", "unseen_tasks"])
def test_removed_rl_extras_are_unknown_keys(key):
    # Their measurements are in docs/experiments.md; an override of one fails like any misspelt key.
    config = composer_config.get_config()
    config.lock()
    with pytest.raises(AttributeError, match=key):
        setattr(config.rl, key, 1)


def test_a_workdir_recorded_under_another_isolation_level_is_refused_before_data(tmp_path):
    # The workdir's DATA ran under 'none'; this machine resolves 'auto' to something else (bwrap in CI).
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "isolation.json").write_text(json.dumps({"level": "none", "requested": "none"}))
    r = _launch("--config=experiments/composer.py:tiny", "--mode=data", f"--workdir={workdir}")
    assert r.returncode != 0
    assert "'none'" in r.stderr and "--config.env.isolation=none" in r.stderr, r.stderr[-3000:]
    assert "FATAL:" in r.stderr and "Traceback" not in r.stderr  # one message, not a stack to read through
    assert sorted(p.name for p in workdir.iterdir()) == ["isolation.json"]  # no task was generated


@pytest.mark.parametrize("key", ["env.tasks", "eval.tasks"])
def test_a_suite_that_is_not_a_directory_fails_before_work_naming_the_key(tmp_path, key):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny", f"--config.{key}={tmp_path / 'nope'}", f"--workdir={workdir}"
    )
    assert r.returncode != 0
    assert key in r.stderr and "not a directory" in r.stderr
    assert not workdir.exists()


def test_several_greedy_samples_a_task_fail_before_work(tmp_path):
    workdir = tmp_path / "w"
    r = _launch(
        "--config=experiments/composer.py:tiny", "--mode=eval", f"--config.eval.tasks={tmp_path}",
        "--config.eval.samples_per_task=4", f"--workdir={workdir}",
    )  # fmt: skip
    assert r.returncode != 0
    assert "eval.samples_per_task=4" in r.stderr and "eval.temperature" in r.stderr
    assert not workdir.exists()


@pytest.mark.parametrize("variant", [None, "tiny", "gpu"])
def test_suite_keys_default_to_generated_tasks(variant):
    config = composer_config.get_config(variant)
    assert config.env.tasks == "" and config.eval.tasks == "" and config.eval.samples_per_task == 1
