"""--mode=eval from a pretrained checkpoint: held-out tasks, its own tokenizer, an episode per task."""

import json
from pathlib import Path

import jax
import pytest

from composer import sharding
from composer.checkpoints.evaluate_pretrained import run_eval
from experiments.composer import get_config

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "qwen3_moe"


@pytest.mark.slow
def test_run_eval_on_the_tiny_fixture(tmp_path):
    config = get_config("tiny")
    config.model.init_from = str(FIXTURE)
    # The fixture's 287-token vocabulary spells the system prompt out in ~2300 tokens: leave room for a turn.
    config.env.max_episode_tokens = 4096
    config.env.max_turns = 2
    config.sampling.max_turn_tokens = 32
    # One device: the sampler runs where the params are, and 8 fake CPU devices would each run every step.
    stats = run_eval(config, tmp_path, sharding.make_mesh(config.mesh, jax.devices()[:1]))
    assert stats["episodes"] == config.eval.n_tasks == 4
    assert stats["errors"] == 0
    assert stats["mean_turns"] >= 1 and stats["tokens_per_s"] > 0  # the random model did generate
    assert 0.0 <= stats["solve_rate"] <= 1.0
    assert json.loads((tmp_path / "eval_pretrained.json").read_text()) == stats
    assert len(list((tmp_path / "tasks" / "heldout").glob("*/task.json"))) == config.env.n_heldout_tasks
    assert not (tmp_path / "tokenizer.json").exists()  # the checkpoint's tokenizer, none trained
