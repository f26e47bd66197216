"""One call on a lent GPU: are the kernels right and fast, do `:gpu`-shaped steps run, and does the memory
plan hold? Runs unchanged on a CPU (small shapes, interpret-mode kernels) so that it is tested before then.

    python benchmarks/gpu_smoke.py                  # GPU: realistic shapes; CPU: --small is implied
    python benchmarks/gpu_smoke.py --layers 2 --tokens 16384 --steps 3

Sections, each reported even when another fails (its error under "errors"):
  kernels   benchmarks/kernels.py: each Pallas kernel against its reference (relative error) and its time
            against XLA's (speedup), at Qwen3-30B-A3B expert and attention shapes on a GPU;
  sft, rl   a few SFT and RL steps of the `:gpu` model with --layers layers on one --tokens-token row
            ('auto' kernels: the Pallas ones on a GPU): loss, seconds a step, tokens/s, peak memory;
  plan      `--mode=plan` of the same reduced config (a subprocess on the CPU, as anyone would plan it) for
            this device: the planned learner (train state, gradients, backward pass, update) against the
            peak measured over the sft and rl sections;
  sampler   decode tokens/s of the sampler on that model: --slots prompts of 512 tokens, 128 new each.
The last line is one JSON object.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from composer import xla_flags  # noqa: E402

xla_flags.apply()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from composer import model, train  # noqa: E402
from composer.pipeline import learner as learner_lib  # noqa: E402
from composer.sampler import Sampler  # noqa: E402
from experiments import composer as experiment  # noqa: E402

# The plan's device kind for a GPU's device_kind string (the first that it contains).
_PLAN_DEVICES = (("H200", "h200"), ("H100", "h100"), ("B200", "b200"), ("A100", "a100"))
# --small: the :gpu config at a size a CPU steps in seconds (its kernels, dtypes and memory savers kept).
_SMALL = dict(vocab_size=1024, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff_dense=128)


def config_for(args) -> "experiment.ConfigDict":
    config = experiment.get_config("gpu")
    config.model.update(n_layers=args.layers, n_dense_layers=min(1, args.layers - 1), max_seq_len=args.tokens)
    config.env.max_episode_tokens = args.tokens
    config.optim.update(micro_batches=1, micro_batch_tokens=args.tokens)
    config.rl.update(tasks_per_step=1, group_size=1, expert_guidance=False)
    config.sft.batch_size = 1
    if args.small:
        config.model.update(**_SMALL)
        config.moe.update(n_experts=4, top_k=2, d_ff=64)
        config.model.logits_chunk = min(config.model.logits_chunk, args.tokens // 2)
    return config


def _peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _batch(cfg, tokens: int, rl: bool) -> dict:
    rng = np.random.default_rng(0)
    batch = {
        "tokens": rng.integers(0, cfg.vocab_size, (1, 1, tokens)).astype(np.int32),
        "positions": np.arange(tokens, dtype=np.int32)[None, None],
        "loss_mask": np.ones((1, 1, tokens), np.float32),
    }
    if rl:
        batch.update(
            sampler_logprobs=np.full((1, 1, tokens), -math.log(cfg.vocab_size), np.float32),
            advantages=np.ones((1, 1), np.float32),
            truncated=np.zeros((1, 1), bool),
            rewards=np.ones((1, 1), np.float32),
            off_policy=np.zeros((1, 1), np.float32),
        )
    return batch


def run_steps(config, cfg, kind: str, steps: int, params=None) -> tuple[dict, object]:
    """`steps` updates of one row; the first compiles. Returns (metrics, the learner's params)."""
    rl = kind == "rl"
    static = {"hp": train.RLHParams.from_config(config)} if rl else {}
    learner = learner_lib.build(
        config, cfg, learning_rate=config.rl.learning_rate if rl else config.sft.learning_rate,
        total_steps=steps, step_fn=train.rl_step if rl else train.sft_step, line_tokens=None,
        init_params=params, **static,
    )  # fmt: skip
    batch = _batch(cfg, config.env.max_episode_tokens, rl)
    times, losses = [], []
    for i in range(steps):
        t0 = time.time()
        metrics = jax.device_get(learner.step(batch, jax.random.key(i)))
        times.append(time.time() - t0)
        losses.append(float(metrics["loss"]))
    steady = times[1:] or times
    tokens = config.env.max_episode_tokens
    out = {
        "compile_and_first_s": round(times[0], 2),
        "step_s": round(float(np.median(steady)), 4),
        "tokens_per_s": round(tokens / float(np.median(steady)), 1),
        "losses": [round(x, 4) for x in losses],
        "finite": bool(np.all(np.isfinite(losses))),
    }
    return out, learner.params


def plan_for(args, device_kind: str) -> dict:
    """The memory plan of the reduced config (a CPU subprocess, as `--mode=plan` runs)."""
    device = next((plan for name, plan in _PLAN_DEVICES if name in device_kind), "h100")
    overrides = [
        f"--config.model.n_layers={args.layers}", f"--config.model.n_dense_layers={min(1, args.layers - 1)}",
        f"--config.model.max_seq_len={args.tokens}", f"--config.env.max_episode_tokens={args.tokens}",
        "--config.optim.micro_batches=1", f"--config.optim.micro_batch_tokens={args.tokens}",
        "--config.rl.tasks_per_step=1", "--config.rl.group_size=1", "--config.rl.expert_guidance=False",
        "--config.sft.batch_size=1", "--config.sft.steps=0", f"--config.plan.device={device}",
    ]  # fmt: skip
    if args.small:
        overrides += [f"--config.model.{k}={v}" for k, v in _SMALL.items()]
        overrides += ["--config.moe.n_experts=4", "--config.moe.top_k=2", "--config.moe.d_ff=64"]
        overrides += [f"--config.model.logits_chunk={min(1024, args.tokens // 2)}"]
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    out = subprocess.run(
        [sys.executable, "launch.py", "--config=experiments/composer.py:gpu", "--mode=plan", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"--mode=plan failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sampler_tokens_per_s(config, cfg, params, slots: int) -> dict:
    sampler = Sampler(
        params, cfg, slots=slots, max_len=640, steps_per_call=config.sampling.steps_per_call, temperature=1.0,
        eos_id=None, key=jax.random.key(0),
    )  # fmt: skip
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, 512).tolist() for _ in range(slots)]
    sampler.generate(prompts, 8)  # compiles
    t0 = time.time()
    outs = sampler.generate(prompts, 128)
    seconds = time.time() - t0
    generated = sum(len(o.token_ids) for o in outs)
    return {
        "slots": slots,
        "tokens": generated,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(generated / seconds, 1),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--layers", type=int, default=2, help="layers of the :gpu model (1 dense, the rest MoE)"
    )
    parser.add_argument(
        "--tokens", type=int, default=None, help="tokens of the row (default 16384; --small 256)"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--slots", type=int, default=None, help="sampler rows (default 64; --small 4)")
    parser.add_argument("--kernels", default="gmm,fp8_gmm,flash_attention,decode_attention")
    parser.add_argument("--small", action="store_true", help="CPU-sized model and shapes (implied off a GPU)")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    args.small = args.small or not on_gpu
    args.tokens = args.tokens or (256 if args.small else 16_384)
    args.slots = args.slots or (4 if args.small else 64)
    device_kind = str(jax.devices()[0].device_kind)
    print(f"device: {device_kind} ({jax.default_backend()}); small: {args.small}", flush=True)
    result: dict = {
        "device": device_kind,
        "backend": jax.default_backend(),
        "small": args.small,
        "errors": {},
    }

    def section(name, fn):
        try:
            result[name] = fn()
            print(f"{name}: {json.dumps(result[name])[:600]}", flush=True)
        except Exception as e:  # report and go on: one failing part must not hide the others
            result["errors"][name] = f"{type(e).__name__}: {str(e)[:800]}"
            traceback.print_exc()

    if args.kernels:
        from benchmarks import kernels as kernels_bench

        def kernels():
            shapes = "small" if args.small else "realistic"
            summary = kernels_bench.main([f"--shapes={shapes}", f"--kernels={args.kernels}"])
            keep = ("case", "ms", "ref_ms", "speedup_vs_ref", "rel_err_vs_ref", "rate", "unit")
            return {
                "mode": summary["mode"],
                "results": [{k: r.get(k) for k in keep} for r in summary["results"]],
                "errors": summary["errors"],
            }

        section("kernels", kernels)
    config = config_for(args)
    cfg = model.ModelConfig.from_config(config)
    result["model"] = {
        "layers": cfg.n_layers, "params": model.param_counts(cfg)[0], "attention_impl": cfg.attention_impl,
        "dispatch": cfg.dispatch, "remat": cfg.remat, "tokens": args.tokens,
    }  # fmt: skip
    state = {}

    def sft():
        out, state["params"] = run_steps(config, cfg, "sft", args.steps)
        return out

    def rl():
        out, _ = run_steps(config, cfg, "rl", args.steps, state.get("params"))
        return out

    section("sft", sft)
    section("rl", rl)
    measured = _peak_bytes()

    def plan():
        planned = plan_for(args, device_kind)
        parts = planned["parts"]
        learner = sum(parts[k] for k in ("params", "master", "optimizer", "gradients", "activations"))
        learner += parts["optimizer_update"]
        out = {"device": planned["device"], "planned_learner_gib": round(learner, 3)}
        if measured is not None:
            out["measured_peak_gib"] = round(measured / 2**30, 3)
            out["ratio"] = round(learner / (measured / 2**30), 3)
        return out

    section("plan", plan)
    if "params" in state:
        section("sampler", lambda: sampler_tokens_per_s(config, cfg, state["params"], args.slots))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
