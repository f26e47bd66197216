"""EVAL: solve rate and behaviour of a policy on the held-out tasks (one greedy-or-sampled episode each)."""

import json
import time
from pathlib import Path

import jax
import ml_collections
from absl import logging

from composer.pipeline import learner, next_call, rollouts
from env import chat


def episodes_path(out: Path) -> Path:
    """Where the episodes behind the result file `out` go (eval_sft.json: eval_sft_episodes.jsonl)."""
    return out.with_name(f"{out.stem}_episodes.jsonl")


def episode_record(result) -> dict:
    """One evaluated episode for a person reading why it failed: its grade, how it ended and the
    conversation after the system turn (the tool schemas, the same in every episode)."""
    messages = (
        result.messages[1:] if result.messages and result.messages[0].role == "system" else result.messages
    )
    return {
        "task_id": result.task_id,
        "reward": result.reward,
        "truncation": result.truncation,
        "turns": result.n_turns,
        "tool_errors": result.n_tool_errors,
        "tokens": len(result.ids),
        "error": result.error,
        "messages": [chat.message_to_dict(m) for m in messages],
    }


def eval_sampler(config: ml_collections.ConfigDict, params, cfg, tokenizer):
    """The sampler of an EVAL: eval.temperature, and a key of its own (seed + 1) that no RL step draws."""
    return rollouts.make_sampler(
        config, params, cfg, tokenizer.im_end_id, line_tokens=learner.line_tokens(cfg, tokenizer),
        temperature=config.eval.temperature, key=jax.random.key(config.seed + 1),
    )  # fmt: skip


def evaluate(
    config: ml_collections.ConfigDict, params, cfg, tokenizer, tasks: list, *, out: Path | None = None,
    expert: list | None = None,
) -> dict:  # fmt: skip
    """Runs one episode per task (config.eval.n_tasks of them) and returns episode_stats plus tokens/s,
    each task's reward by task id under 'rewards' and, for each cut episode, the limit that cut it under
    'truncations'. The wall-clock limit is eval.episode_timeout_s (rollouts.limits with grading).

    With `expert` (expert trajectories on held-out tasks), the stats also hold the next-call accuracy from
    their prefixes (composer/pipeline/next_call.py), at the same temperature. With `out`, the result is
    written there, and read back instead of recomputed when already present; each episode goes to
    `episodes_path(out)`, one JSON object a line (`episode_record`).
    """
    if out is not None and out.exists():
        return json.loads(out.read_text())
    tasks = tasks[: config.eval.n_tasks]
    sampler = eval_sampler(config, params, cfg, tokenizer)
    t0 = time.time()
    results = rollouts.one_episode_each(
        config,
        sampler,
        tokenizer,
        tasks,
        desc="EVAL",
        postfix=lambda rs: {"solved": sum(r.reward or 0 for r in rs)},
    )
    stats = rollouts.episode_stats(results)
    # Each task's reward (None: not graded), so that two models can be compared task by task.
    stats["rewards"] = {r.task_id: r.reward for r in results}
    # And the limit that cut each cut one, so a comparison can leave out the tasks cut by the wall clock,
    # which measures the machine's load as much as the model.
    stats["truncations"] = {r.task_id: r.truncation for r in results if r.truncation is not None}
    s = sampler.stats()
    stats.update({k: s[k] for k in ("tokens_per_s", "occupancy", "prefill_share")}, wall_s=time.time() - t0)
    if expert:
        env, max_new = config.env, config.sampling.max_turn_tokens
        stats.update(
            next_call.next_call_accuracy(
                sampler, tokenizer, expert, max_turns=env.max_turns,
                max_prompt_tokens=env.max_episode_tokens, max_new_tokens=max_new,
            )
        )  # fmt: skip
    logging.info("EVAL: %s", json.dumps({k: v for k, v in stats.items() if k != "rewards"}))
    if out is not None:
        with episodes_path(out).open("w") as f:
            for r in sorted(results, key=lambda r: r.task_id):
                f.write(json.dumps(episode_record(r)) + "\n")
        out.write_text(json.dumps(stats, indent=1))  # last: its presence means the EVAL is complete
    return stats
