"""The memory plan (`--mode=plan`): honest both ways at full size, close to a measured peak at a size this
CPU runs, and the pieces it rests on (memory twins, 'auto' kernels, the KV cache budget)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from composer import attention, memory_plan, memory_twins, model
from composer.model_config import ModelConfig, resolve_auto
from composer.pipeline import rollouts
from composer.sampler_device import cache_bytes_per_slot
from experiments import composer as experiment

ROOT = Path(__file__).resolve().parents[2]
QWEN3_30B = ROOT / "tests/fixtures/hf/qwen3_30b_a3b_config"  # config.json only: no weights, no tokenizer


def _clean_env() -> dict:
    """The environment of a real run: no test-only XLA flags (fake devices, optimisation level 0)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_PLATFORMS", None)
    return env


def _plan(*overrides: str) -> dict:
    out = subprocess.run(
        [sys.executable, "launch.py", "--config=experiments/composer.py:gpu", "--mode=plan", *overrides],
        cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "memory plan: h200" in out.stdout
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_gpu_config_fits_one_h200_with_a_tenth_to_spare():
    result = _plan()
    assert result["device"] == "h200" and result["fits"]
    assert result["per_device_gib"] <= 0.9 * result["device_gib"]
    parts = result["parts"]
    # bf16 params with their f32 master copy and f32 AdamW moments: 2 + 4 + 8 bytes a parameter.
    assert parts["master"] == pytest.approx(2 * parts["params"], rel=1e-3)
    assert parts["optimizer"] == pytest.approx(4 * parts["params"], rel=1e-3)
    assert parts["activations"] > 1 and parts["kv_cache"] <= 16.0


def test_qwen3_30b_a3b_rl_fits_eight_h200s_and_not_one():
    # RL's plan only (sft.steps 0: no SFT phase to compile; at 8 GPUs it is the smaller of the two).
    budget = ("--config.eval.every_steps=0", "--config.sampling.kv_cache_gib=8", "--config.sft.steps=0")
    eight = _plan(f"--config.model.init_from={QWEN3_30B}", "--config.mesh.fsdp=8", *budget)
    one = _plan(f"--config.model.init_from={QWEN3_30B}", *budget)
    assert eight["fits"] and not one["fits"]
    # FSDP shards the train state eight ways; the plan reads config.json alone.
    assert one["parts"]["optimizer"] == pytest.approx(8 * eight["parts"]["optimizer"], rel=1e-3)
    assert one["parts"]["params"] > 50  # 30.5 B parameters in bf16


# The default model without its copy head, and no SFT phase to plan: fewer, smaller programs to compile.
_NO_COPY_HEAD = [
    "--config.model.copy_head_dim=0",
    "--config.model.copy_head_lines=False",
    "--config.model.copy_head_ngram=0",
    "--config.model.copy_head_recency=False",
    "--config.model.copy_loss_coef=0",
]


def test_the_planned_learner_is_within_15_percent_of_its_measured_peak():
    out = subprocess.run(
        [sys.executable, "benchmarks/memory_plan_check.py", "--config.rl.tasks_per_step=2",
         "--config.rl.group_size=2", "--config.optim.micro_batches=1", "--config.env.max_episode_tokens=1024",
         "--config.sft.steps=0", *_NO_COPY_HEAD],
        cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["measured_gib"] > 1.0  # large enough that the process's own noise does not matter
    assert 0.85 <= result["ratio"] <= 1.15, result


def test_step_shapes_split_as_the_learner_packs():
    config = experiment.get_config("gpu")
    assert memory_plan.step_shape(config, 544, 16_384, 1) == memory_plan.StepShape(544, 1, 16_384)
    assert memory_plan.step_shape(config, 544, 2_000, 1) == memory_plan.StepShape(68, 8, 2_048)
    assert memory_plan.step_shape(config, 544, 16_384, 8) == memory_plan.StepShape(68, 8, 16_384)
    assert memory_plan.rl_sequences(config) == 32 * (16 + 1)


def test_an_unknown_device_fails_with_its_name():
    config = experiment.get_config("tiny")
    config.plan.device = "h300"
    with pytest.raises(ValueError, match="plan.device 'h300'"):
        memory_plan.plan(config)


def test_auto_kernels_are_the_pallas_ones_on_a_gpu_only():
    values = {"attention_impl": "auto", "dispatch": "auto", "d_model": 8}
    assert resolve_auto(values, "gpu") == {"attention_impl": "pallas", "dispatch": "gmm", "d_model": 8}
    assert resolve_auto(values, "cpu") == {"attention_impl": "cpu", "dispatch": "ragged_dot", "d_model": 8}
    config = experiment.get_config("gpu")
    assert ModelConfig.from_config(config, "gpu").attention_impl == "pallas"
    assert ModelConfig.from_config(config, "cpu").dispatch == "ragged_dot"
    twins = memory_plan.with_twins(ModelConfig.from_config(config, "gpu"), "gpu")
    assert (twins.attention_impl, twins.dispatch) == ("twin", "twin")


def test_the_twins_have_the_kernels_shapes_and_gradients():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 8, 4, 16), jnp.bfloat16)
    k = jax.random.normal(kk, (2, 8, 2, 16), jnp.bfloat16)
    v = jax.random.normal(kv, (2, 8, 2, 16), jnp.bfloat16)
    pos, lengths = jnp.broadcast_to(jnp.arange(8), (2, 8)), jnp.full((2,), 8)
    want = attention.attend_reference(q, k, v, pos, lengths)
    got = memory_twins.attend(q, k, v, pos, lengths, self_keys=True)
    assert got.shape == want.shape and got.dtype == want.dtype
    grads = jax.grad(
        lambda q, k, v: memory_twins.attend(q, k, v, pos, lengths).astype(jnp.float32).sum(), (0, 1, 2)
    )(q, k, v)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    lhs, rhs = jnp.ones((6, 4)), jnp.ones((3, 4, 5))
    sizes = jnp.array([2, 1, 3])
    assert memory_twins.grouped_matmul(lhs, rhs, sizes).shape == jax.lax.ragged_dot(lhs, rhs, sizes).shape
    d_lhs, d_rhs = jax.grad(lambda a, b: memory_twins.grouped_matmul(a, b, sizes).sum(), (0, 1))(lhs, rhs)
    assert d_lhs.shape == lhs.shape and d_rhs.shape == rhs.shape


def test_the_kv_cache_budget_bounds_the_slots_and_too_small_a_budget_fails():
    config = experiment.get_config()
    cfg = model.ModelConfig.from_config(config)
    per_slot = cache_bytes_per_slot(cfg, rollouts.max_len(config))
    assert rollouts.decode_slots(config, cfg) == config.sampling.decode_slots  # no budget
    config.sampling.kv_cache_gib = 5.5 * per_slot / 2**30
    assert rollouts.decode_slots(config, cfg) == 5
    config.sampling.kv_cache_gib = 100.0
    assert rollouts.decode_slots(config, cfg) == config.sampling.decode_slots
    config.sampling.kv_cache_gib = 0.5 * per_slot / 2**30
    with pytest.raises(ValueError, match="holds no decode slot"):
        rollouts.decode_slots(config, cfg)


def test_a_sampler_of_the_same_config_shares_the_first_ones_weights():
    from composer.sampler_device import unstack_layers

    cfg = model.ModelConfig(n_layers=2)
    layered = unstack_layers(model.init(jax.random.key(0), cfg))
    assert unstack_layers(layered) is layered
    assert len(layered["layers"]) == 2
