"""The main job end to end on the tiny config: every phase, the summary, and resuming after kill -9."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from composer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--config=experiments/composer.py:tiny", "--config.rl.steps=4", "--config.checkpoint.every_steps=1"]
# The data every test here starts from: 12 train tasks, of which SFT takes 8 (RL draws from all 12).
DATA = ("--config.env.n_train_tasks=12",)


def _launch(workdir: Path, log: Path, *extra: str, cache: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's run
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the config's, below
    # The runs of this module share one compilation cache (jax_cache), of their own: a run after the first
    # loads the programs the first compiled, as a user's rerun does from ~/.cache.
    extra = (f"--config.compilation_cache_dir={cache}", *extra)
    # Output to a file, not a pipe: nobody reads a pipe while the run goes on, and a full one blocks it.
    with log.open("w") as f:
        return subprocess.Popen(
            [sys.executable, "launch.py", *TINY, f"--workdir={workdir}", *extra],
            cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jax_cache")


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory, jax_cache) -> Path:
    """A workdir through DATA and SFT (`--mode=sft`), made once for this module: every test below continues
    a copy of it, as a rerun of the same workdir would, and the pipeline's first two phases run once."""
    root = tmp_path_factory.mktemp("sft_run")
    workdir, log = root / "run", root / "sft.log"
    proc = _launch(workdir, log, *DATA, "--mode=sft", cache=jax_cache)
    proc.wait(timeout=600)
    assert proc.returncode == 0, log.read_text()[-5000:]
    assert any(p.name.endswith("-cache") for p in jax_cache.iterdir()), "SFT cached no compiled program"
    return workdir


def _copy(sft_run: Path, tmp_path: Path) -> Path:
    workdir = tmp_path / "run"
    shutil.copytree(sft_run, workdir, symlinks=True)
    return workdir


@pytest.mark.slow
def test_tiny_pipeline_runs_and_resumes_after_kill(sft_run, jax_cache, tmp_path):
    workdir = _copy(sft_run, tmp_path)
    # First run: kill -9 as soon as the first RL checkpoint is complete.
    log = tmp_path / "first.log"
    # With the SFT model's pass@k on 2 held-out tasks, which the tiny config leaves off.
    proc = _launch(workdir, log, *DATA, "--config.eval.pass_k_tasks=2", cache=jax_cache)
    deadline = time.time() + 600
    rl_ckpt = workdir / "checkpoints" / "rl"
    while time.time() < deadline and proc.poll() is None:
        if rl_ckpt.exists() and any(p.name.isdigit() for p in rl_ckpt.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()[-5000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    steps_before = [r["step"] for r in read_metrics(workdir, "rl")]
    assert steps_before, "RL logged nothing before the kill"
    # Rerun with the same workdir: DATA and SFT are skipped, RL resumes after its last checkpoint.
    log = tmp_path / "second.log"
    proc = _launch(workdir, log, *DATA, "--config.eval.pass_k_tasks=2", cache=jax_cache)
    proc.wait(timeout=900)
    out = log.read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "SFT: complete" in out, out[-5000:]
    assert "RL: resuming at step" in out, out[-5000:]
    steps_after = [r["step"] for r in read_metrics(workdir, "rl")][len(steps_before) :]
    assert steps_after and steps_after[0] <= steps_before[-1] + 1 and steps_after[-1] == 4
    # The expert's guide (a group augmenter, on by default) counted the groups it joined at every step.
    assert sum(r["guided_groups"] for r in read_metrics(workdir, "rl")) > 0
    summary = json.loads((workdir / "summary.json").read_text())
    for phase in ("sft", "rl"):
        assert summary[phase]["episodes"] == 4
        assert 0.0 <= summary[phase]["solve_rate"] <= 1.0
        # Next-call accuracy from the expert's prefixes on 2 held-out tasks (about 4 scored turns each).
        assert summary[phase]["next_call_turns"] >= 2 and 0.0 <= summary[phase]["next_call_accuracy"] <= 1.0
    assert "held-out solve rate" in out and "next call right (expert prefix)" in out
    # The held-out curve on its fixed subset (2 tasks): SFT's end and RL's read off the full EVALs, and the
    # point between measured after RL step 2 (eval.every_steps); each a rate over the same 2 tasks.
    curve = {r["step"]: r for r in read_metrics(workdir, "eval") if "curve_solve_rate" in r}
    assert sorted(curve) == [0, 2, 4]
    assert all(r["curve_tasks"] == 2 and r["curve_solve_rate"] in (0.0, 0.5, 1.0) for r in curve.values())
    assert "curve_wall_s" in curve[2] and "curve_wall_s" not in curve[0]
    # The SFT model's headroom: k = rl.group_size (2) sampled episodes on each of 2 held-out tasks.
    pass_k = summary["sft_pass_k"]
    assert pass_k["pass_k"] == 2 and pass_k["pass_k_tasks"] == 2
    assert 0.0 <= pass_k["sampled_pass_at_1"] <= pass_k["pass_at_k"] <= 1.0
    assert "sampled pass@2, first 2 tasks" in out
    names = (
        "curves.png",
        "losses.png",
        "tokenizer.json",
        "sft_data.jsonl",
        "heldout_expert.jsonl",
        "metrics.jsonl",
    )
    for name in names:
        assert (workdir / name).exists(), name


@pytest.mark.slow
def test_tiny_pipeline_with_the_ray_pool_and_ppo(sft_run, jax_cache, tmp_path):
    # PPO with a KL term to the SFT model, sampling below temperature 1, on all 12 train tasks; each update
    # in a thread beside the next batch's rollouts (rl.overlap_update).
    pytest.importorskip("ray", reason="the Ray backend needs ray (requirements.txt installs it)")
    workdir, log = _copy(sft_run, tmp_path), tmp_path / "run.log"
    # Up to RL: the EVAL phases are the other tests' (and the Ray pool's EVAL is tests/env/rollout's).
    proc = _launch(
        workdir, log, "--config.env.n_train_tasks=12", "--config.rl.steps=2", "--mode=rl",
        "--config.env.rollout_backend=ray", "--config.rl.algorithm=gae", "--config.rl.kl_coef=0.05",
        "--config.sampling.temperature=0.8", "--config.rl.overlap_update=True", cache=jax_cache,
    )  # fmt: skip
    proc.wait(timeout=900)
    out = log.read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "Started a local Ray instance" in out
    rl = read_metrics(workdir, "rl")
    assert [r["step"] for r in rl] == [1, 2]
    assert all(r["step_s"] > 0 and r["update_skipped"] == 0.0 for r in rl)
    assert all("value_loss" in r and "value_error" in r for r in rl)  # the PPO loss ran, critic included
    # The KL to the reference ran: zero at the first update (the reference is the starting policy), then not.
    assert abs(rl[0]["kl_ref"]) < 1e-5 and rl[1]["kl_ref"] > 0
    assert not (workdir / "summary.json").exists()  # --mode=rl ends with RL


@pytest.mark.slow
def test_eval_mode_never_trains(sft_run, jax_cache, tmp_path):
    # After SFT, --mode=eval: the SFT model is evaluated and no RL step runs (there is no RL checkpoint to
    # evaluate, and evaluating is not a reason to train).
    workdir, log = _copy(sft_run, tmp_path), tmp_path / "eval.log"
    assert not (workdir / "eval_sft.json").exists()  # --mode=sft stops before EVAL
    proc = _launch(workdir, log, *DATA, "--mode=eval", cache=jax_cache)
    proc.wait(timeout=600)
    out = log.read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "no RL checkpoint" in out, out[-5000:]
    assert (workdir / "eval_sft.json").exists()
    # Each evaluated episode, for reading why it failed: its grade as the result records it.
    rewards = json.loads((workdir / "eval_sft.json").read_text())["rewards"]
    episodes = [json.loads(x) for x in (workdir / "eval_sft_episodes.jsonl").read_text().splitlines()]
    assert {e["task_id"]: e["reward"] for e in episodes} == rewards and len(episodes) == 4
    assert all(e["messages"][0]["role"] == "user" and e["turns"] >= 1 for e in episodes)
    assert not read_metrics(workdir, "rl") and not (workdir / "eval_rl.json").exists()
    assert [r["step"] for r in read_metrics(workdir, "eval")] == [0]


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    """A suite as one from elsewhere comes: written by `python -m env.tasks generate`, every task.json
    without metadata.seed, and every other one without any metadata (the expert cannot plan those)."""
    out = tmp_path_factory.mktemp("suite") / "suite"
    subprocess.run(
        [sys.executable, "-m", "env.tasks", "generate", "--out", str(out), "--count", "6", "--seed", "0",
         "--families", "missing_return,early_return"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    for i, path in enumerate(sorted(out.glob("*/task.json"))):
        task = json.loads(path.read_text())
        del task["metadata"]["seed"]
        if i % 2:
            task["metadata"] = {}
        path.write_text(json.dumps(task))
    return out


@pytest.mark.slow
def test_tiny_pipeline_trains_on_a_suite_directory_and_evaluates_on_it(suite_dir, jax_cache, tmp_path):
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    # Up to RL only, and RL from the random init (no SFT steps): the EVAL phases of a whole run and SFT are
    # covered by the other runs of this module.
    proc = _launch(
        workdir, log, f"--config.env.tasks={suite_dir}", "--config.rl.steps=2", "--config.sft.steps=0",
        "--mode=rl", cache=jax_cache,
    )  # fmt: skip
    proc.wait(timeout=900)
    out = log.read_text()
    assert proc.returncode == 0, out[-5000:]
    assert "5 train tasks, 1 held out" in out, out[-5000:]
    steps = read_metrics(workdir, "rl")
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["tokens_generated"] > 0 for r in steps)  # each step's own generation (benchmarks/rl_step.py)
    records = [json.loads(x) for x in (workdir / "sft_data.jsonl").read_text().splitlines()]
    assert {r["source"] for r in records} == {
        "expert",
        "gold",
    }  # the expert where it plans, else the gold patch
    assert not (workdir / "tasks").exists()  # nothing generated
    assert json.loads((workdir / "isolation.json").read_text())["level"] in ("bwrap", "unshare", "none")
    # The same run's latest checkpoint on the whole suite: the JSON summary is the last line printed.
    log = tmp_path / "eval.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    r = subprocess.run(
        [sys.executable, "launch.py", *TINY, f"--workdir={workdir}", f"--config.env.tasks={suite_dir}",
         f"--config.eval.tasks={suite_dir}", "--config.eval.n_tasks=6", "--mode=eval",
         f"--config.compilation_cache_dir={jax_cache}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-5000:]
    assert "the model is the RL checkpoint of step 2" in r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == 6 and set(summary) == {"tasks", "solved", "solve_rate", "pass_at_k"}
    assert (workdir / "eval_suites" / "suite-rl_step2" / "episodes.jsonl").exists()
