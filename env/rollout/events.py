"""The one message type a rollout pool sends back to the driver."""

import dataclasses
from typing import Any

# 'started': the episode's workspace is ready       payload: workspace, worker, pid, start_s
# 'tool_results': one turn's calls ran              payload: results (list[ToolResult], call order), elapsed_s
# 'graded': the episode is closed                   payload: grade (env.reward.Grade, or None if not graded)
# 'restart': its worker died; nothing of it is left payload: reason, worker
# 'error': a command for it raised; it is closed    payload: reason, stage
KINDS = ("started", "tool_results", "graded", "restart", "error")


@dataclasses.dataclass(frozen=True)
class Event:
    """Something that happened to one episode in the pool."""

    episode_id: str
    kind: str
    payload: dict[str, Any]
