"""RL's headroom: the SFT model's held-out pass@k with k = rl.group_size, sampled as RL samples.

A GRPO group learns from a task when some of its k episodes solve it and some do not, so pass@k of the
policy RL starts from bounds what RL can turn into pass@1 (greedy). Measured on the first
eval.pass_k_tasks held-out tasks (0: off), k episodes each at sampling.temperature from the bug report;
pass@1 and pass@k are the unbiased estimators over each task's k samples (eval_suite.pass_at_k).
"""

import json
from pathlib import Path

import jax
import ml_collections
from absl import logging

from composer.pipeline import learner, rollouts
from composer.pipeline.eval_suite import pass_at_k


def measure(config: ml_collections.ConfigDict, params, cfg, tokenizer, heldout: list, out: Path) -> dict:
    """{'pass_k': k, 'pass_k_tasks': n, 'sampled_pass_at_1': ..., 'pass_at_k': ...} of `params` on the
    first eval.pass_k_tasks of `heldout`, written to `out` (and read back from it when present); empty when
    eval.pass_k_tasks is 0."""
    n_tasks, k = min(config.eval.pass_k_tasks, config.eval.n_tasks), config.rl.group_size
    if n_tasks <= 0:
        return {}
    if out.exists():
        return json.loads(out.read_text())
    sampler = rollouts.make_sampler(
        config, params, cfg, tokenizer.im_end_id, line_tokens=learner.line_tokens(cfg, tokenizer),
        temperature=config.sampling.temperature, key=jax.random.key(config.seed + 2),
    )  # fmt: skip
    results = rollouts.one_episode_each(
        config, sampler, tokenizer, heldout[:n_tasks], desc=f"EVAL pass@{k}", samples=k
    )
    correct: dict[str, int] = {}
    for r in results:
        correct[r.task_id] = correct.get(r.task_id, 0) + (r.reward == 1.0)
    stats = {
        "pass_k": k,
        "pass_k_tasks": len(correct),
        "sampled_pass_at_1": sum(pass_at_k(k, c, 1) for c in correct.values()) / len(correct),
        "pass_at_k": sum(pass_at_k(k, c, k) for c in correct.values()) / len(correct),
    }
    logging.info("EVAL: %s", json.dumps(stats))
    out.write_text(json.dumps(stats, indent=1))
    return stats
