"""Expert starts: RL episodes that continue the expert's conversation from just before its edit.

A reverse curriculum for sparse rewards: a model that rarely gets a whole episode right still gets some
edits right from the expert's reads, so those groups carry signal on the decision that most often fails
(the edit), while the other tasks' groups start from the bug report.
"""

import hashlib

import ml_collections

from composer.pipeline import rollouts
from composer.pipeline.rl_extras import EpisodeStarts


def expert_starts(config: ml_collections.ConfigDict, data) -> EpisodeStarts:
    """The train tasks whose episodes start from the expert's reads, with those reads: a seeded
    `rl.expert_start_share` of the tasks with a trajectory that edits (the same ones on resume)."""
    share = config.rl.expert_start_share
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"rl.expert_start_share must lie in [0, 1], got {share}")
    out = {}
    for instance_id, messages in sorted(data.expert_by_task.items()):
        digest = hashlib.sha256(f"{config.seed}/{instance_id}".encode()).digest()
        u = int.from_bytes(digest[:8], "little") / 2**64
        prefix = rollouts.before_first_edit(messages)
        if u < share and prefix is not None:
            out[instance_id] = prefix
    return EpisodeStarts("expert_start", out)
