"""SCREEN: before RL, one episode of the starting (SFT) model on each of `rl.screen_tasks` train tasks; RL
then draws its tasks from those the model failed.

Why: a GRPO group whose episodes all succeed has no signal and is dropped. The default SFT model solves
most train tasks, and at RL's temperature (entropy ~0.01 nats per token) a group of 4 is mostly four
copies of the same episode. Without a screen, half of each step's groups were dropped as all-solved (the
dynamic-sampling budget) and the kept ones often carried no signal either, so some steps trained on
nothing. With `rl.expert_guidance` (on by default), a failed task's group carries signal whatever its own
episodes do: one of them succeeds, or the expert's guide (reward 1) joins episodes that all failed. This
is the pass-rate filter of RL recipes for reasoning models, with one greedy episode as the pass-rate
estimate: a failed greedy episode is the evaluated policy failing.

The screen's results are written to the workdir (`rl_screen.json`), so a resumed RL phase draws from the
same tasks without screening again.
"""

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import ml_collections
from absl import logging

from composer.pipeline import rollouts

SCREEN_FILE = "rl_screen.json"


def failed_tasks(tasks: list, rewards: Mapping[str, float | None]) -> list:
    """The tasks of `tasks` whose screened reward is below 1, in their order. A task whose episode could
    not be graded (reward None: an infrastructure error) tells nothing about the policy and is left out,
    as is a task that was not screened."""
    return [t for t in tasks if rewards.get(t.instance_id) is not None and rewards[t.instance_id] < 1.0]


def screen(
    config: ml_collections.ConfigDict, workdir: Path, params, cfg, tokenizer, tasks: list,
    prompt_fn: Callable,
) -> dict[str, float | None]:  # fmt: skip
    """Each task's reward (None: not graded) from one episode of `params` at `eval.temperature` (greedy by
    default), each starting as RL's episode on it will (`prompt_fn`); read back from the workdir when a
    screen of the same tasks is there."""
    out = workdir / SCREEN_FILE
    ids = [t.instance_id for t in tasks]
    if out.exists():
        saved = json.loads(out.read_text())
        if saved["tasks"] == ids:
            return saved["rewards"]
        logging.info("SCREEN: %s holds other tasks (a changed config): screening again", out)
    sampler = rollouts.make_sampler(
        config, params, cfg, tokenizer.im_end_id, temperature=config.eval.temperature,
        key=jax.random.key(config.seed + 2),
    )  # fmt: skip
    t0 = time.time()
    results = rollouts.one_episode_each(
        config, sampler, tokenizer, tasks, desc="SCREEN", prompts=prompt_fn,
        postfix=lambda rs: {"failed": len(failed_tasks(tasks, {r.task_id: r.reward for r in rs}))},
    )  # fmt: skip
    rewards: dict[str, float | None] = {r.task_id: r.reward for r in results}
    logging.info(
        "SCREEN: the starting model failed %d of %d train tasks (%d not graded) in %.0f s",
        len(failed_tasks(tasks, rewards)), len(tasks), sum(v is None for v in rewards.values()),
        time.time() - t0,
    )  # fmt: skip
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tasks": ids, "rewards": rewards}, indent=1))
    tmp.replace(out)  # whole or absent: a run killed mid-write screens again
    return rewards
