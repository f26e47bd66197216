"""benchmarks/gpu_smoke.py, the script a lent GPU runs in one call, runs end to end here on the CPU (small
shapes, interpret-mode kernels), so that it needs no edits on the day a GPU is lent."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_smoke_runs_every_section_on_the_cpu():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu_smoke.py", "--kernels=gmm", "--steps=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == {} and result["small"] and result["backend"] == "cpu"
    assert {r["case"] for r in result["kernels"]["results"]} == {"gmm_fwd", "gmm_fwd_bwd"}
    assert all(r["rel_err_vs_ref"] < 1e-2 for r in result["kernels"]["results"])
    for kind in ("sft", "rl"):
        assert result[kind]["finite"] and len(result[kind]["losses"]) == 2 and result[kind]["step_s"] > 0
    assert result["sft"]["losses"][1] < result["sft"]["losses"][0]  # a step on the same row lowers its loss
    assert (
        result["model"]["remat"] == "full" and result["model"]["dispatch"] == "ragged_dot"
    )  # 'auto' on a CPU
    assert result["plan"]["planned_learner_gib"] > 0
    assert result["sampler"]["tokens"] == 4 * 128 and result["sampler"]["tokens_per_s"] > 0
