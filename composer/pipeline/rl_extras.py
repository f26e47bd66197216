"""What RL lets plug in without its loop knowing it by name: opt-in extras, one small interface each.

- episode starts (`EpisodeStarts`): conversations that some tasks' episodes continue instead of starting
  from the bug report (composer/pipeline/expert_starts.py: the expert's reads, `rl.expert_start_share`);
- group augmenters (`GroupAugmenter`): off-policy members that join a group of the policy's episodes
  before its advantages are computed (composer/pipeline/expert_members.py: the expert's guide,
  `rl.expert_guidance`).

composer/pipeline/rl.py:build_extras turns the config into them, in one place.
"""

import collections
from collections.abc import Callable, Mapping
from typing import NamedTuple

from env import chat


class EpisodeStarts(NamedTuple):
    """The opening conversations of some tasks' episodes, by task instance id."""

    name: str  # its metrics: episodes_<name> and solved_<name>, the episodes that started so
    by_task: Mapping[str, list[chat.Message]]


class GroupAugmenter(NamedTuple):
    """Extra members for a group of episodes of one task: training sequences as composer/pipeline/rl.py
    builds them ('tokens', 'loss_mask', 'sampler_logprobs', 'rewards', 'truncated', 'off_policy')."""

    name: str  # its metric: <name>_groups, the groups it added members to
    members: Callable[[list], list[dict]]  # a group's episodes (EpisodeResults) -> its extra members


class Extras(NamedTuple):
    starts: EpisodeStarts
    augmenters: tuple[GroupAugmenter, ...]

    def members(self, group: list) -> list[dict]:
        """Every augmenter's members for `group`, in registration order."""
        return [m for a in self.augmenters for m in a.members(group)]

    def augment(self, batch: list[list], counts: collections.Counter) -> list[list[dict]]:
        """The extra members of each group of `batch`, counting the groups each augmenter added to."""
        out = [[] for _ in batch]
        for augmenter in self.augmenters:
            added = [augmenter.members(group) for group in batch]
            counts[f"{augmenter.name}_groups"] += sum(bool(x) for x in added)
            for members, x in zip(out, added, strict=True):
                members.extend(x)
        return out
