"""The expert's guide: a group augmenter (composer/pipeline/rl_extras.py) for `rl.expert_guidance`.

Each group takes the expert's own continuation from the group's start (its reads, or the report) as one
more member: reward 1 (only solved trajectories are kept), trained off-policy. The group then has signal
even when no sampled episode succeeded, and the update both raises the expert's turns and lowers the
failed episodes'.
"""

import functools
from collections.abc import Mapping

import numpy as np

from composer.pipeline.rl_extras import GroupAugmenter
from env import chat
from env.tokenizer import render


def guide_sequence(messages: list, prefix: list | None, tokenizer) -> dict:
    """The expert's trajectory `messages` as one more member of a group whose episodes start from `prefix`
    (its conversation before the edit; None: the report, i.e. everything before its first turn): reward 1,
    loss on the expert's turns after the prefix only, and flagged off-policy (the sampler never drew it;
    see train._policy_loss)."""
    if prefix is None:
        prefix = messages[: next(i for i, m in enumerate(messages) if m.role == "assistant")]
    ids, mask = render(messages, tokenizer)
    n_prefix = len(render(prefix, tokenizer)[0])
    mask = mask.astype(np.float32)
    mask[:n_prefix] = 0.0
    return {
        "tokens": ids.astype(np.int32),
        "loss_mask": mask,
        "sampler_logprobs": np.zeros(len(ids), np.float32),
        "rewards": 1.0,
        "truncated": False,
        "off_policy": 1.0,
    }


def guide_augmenter(data, starts: Mapping[str, list[chat.Message]], tokenizer) -> GroupAugmenter:
    """The guide of each group whose task has an expert trajectory (`data.expert_by_task`), from the
    group's start (`starts`, by task instance id; the report for the others), built once per task."""
    expert_by_task = data.expert_by_task

    @functools.cache
    def guide(task_id: str) -> dict | None:
        if task_id not in expert_by_task:
            return None
        return guide_sequence(expert_by_task[task_id], starts.get(task_id), tokenizer)

    def members(group: list) -> list[dict]:
        x = guide(group[0].task_id)
        return [] if x is None else [x]

    return GroupAugmenter("guided", members)
