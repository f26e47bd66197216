"""The held-out curve of the RL phase: the solve rate on a fixed subset of held-out tasks as RL goes.

The subset is the first eval.curve_tasks held-out tasks, the same at every point, so that points differ by
the model only. Its two ends cost nothing: step 0 (the SFT model) and the last step (the RL model) are read
off the full EVALs' per-task rewards; the points between are greedy EVALs of the subset alone, every
eval.every_steps RL steps. Each point is an 'eval' record in metrics.jsonl (and TensorBoard) under
`KEY`, and a panel of curves.png.
"""

import ml_collections

from composer.pipeline.evaluate import evaluate

KEY = "curve_solve_rate"  # the metric's name in the 'eval' records


def tasks(config: ml_collections.ConfigDict, heldout: list) -> list:
    """The curve's fixed subset of `heldout` (of those EVAL scores: its first eval.n_tasks)."""
    return heldout[: min(config.eval.curve_tasks, config.eval.n_tasks)]


def due(config: ml_collections.ConfigDict, step: int) -> bool:
    """Whether a curve point is measured after RL step `step`: every eval.every_steps, but not the last
    (the final EVAL gives that one)."""
    every = config.eval.every_steps
    return bool(every) and bool(config.eval.curve_tasks) and step % every == 0 and step < config.rl.steps


def from_eval(stats: dict, subset: list) -> dict:
    """The curve point of a full EVAL's result `stats`: its solve rate over the subset's tasks (an episode
    not graded counts as unsolved). Empty when the subset is or the result has no per-task rewards."""
    rewards = stats.get("rewards")
    if not subset or rewards is None:
        return {}
    solved = sum(rewards.get(t.instance_id) == 1.0 for t in subset)
    return {KEY: solved / len(subset), "curve_tasks": len(subset)}


def measure(config: ml_collections.ConfigDict, params, cfg, tokenizer, subset: list) -> dict:
    """A curve point of `params`: one greedy EVAL episode on each task of the subset."""
    stats = evaluate(config, params, cfg, tokenizer, subset)
    return {**from_eval(stats, subset), "curve_wall_s": stats["wall_s"]}
