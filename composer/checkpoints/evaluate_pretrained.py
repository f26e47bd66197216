"""EVAL of a pretrained checkpoint as it is (`--mode=eval` with config.model.init_from set).

Generates the held-out task suite (or reuses the one in the workdir), loads the checkpoint and its tokenizer,
and runs composer.pipeline.evaluate.evaluate on it: one episode per task, sampled at config.eval.temperature.
Writes eval_pretrained.json (the statistics) into the workdir.
"""

import json
from pathlib import Path

import ml_collections
from absl import logging
from jax.sharding import Mesh

from composer.checkpoints.pretrained import load_pretrained
from composer.pipeline import data as data_lib
from composer.pipeline import isolation
from composer.pipeline.evaluate import evaluate


def run_eval(config: ml_collections.ConfigDict, workdir: str | Path, mesh: Mesh | None = None) -> dict:
    """Evaluates the checkpoint at config.model.init_from on the held-out tasks; returns the statistics
    (composer.pipeline.rollouts.episode_stats plus tokens/s), also written to workdir/eval_pretrained.json.

    mesh: where the params live (default: config.mesh over all devices, as the learner places them).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    isolation.settle(config, workdir)
    tasks = data_lib.task_suite(config, workdir, "heldout")
    params, cfg, tokenizer = load_pretrained(config, mesh)
    stats = evaluate(config, params, cfg, tokenizer, tasks, out=workdir / "eval_pretrained.json")
    logging.info("EVAL (pretrained %s): %s", config.model.init_from, json.dumps(stats))
    print(
        f"EVAL (pretrained {config.model.init_from}): solve rate {stats['solve_rate']:.1%} over "
        f"{stats['episodes']} held-out episodes",
        flush=True,
    )
    return stats
