"""The rollout pool and loop: episodes alternate between a decode engine and sandboxed tool workers.

pool.py      RolloutPool (backend-neutral), LocalPool (spawn worker processes), make_pool(config)
worker.py    the worker process: sandboxes, tool calls, grading
episode.py   Episode: the state machine over one episode's exact token stream; RolloutLimits
driver.py    run_episodes / iter_groups (continuous batching) and run_episodes_sync (the baseline)
engines.py   ScriptedEngine: a simulated continuous-batching engine for tests and benchmarks
"""

from env.rollout.driver import (
    Engine,
    EpisodeResult,
    default_prompt,
    iter_groups,
    run_episodes,
    run_episodes_sync,
)
from env.rollout.episode import Episode, RolloutLimits, State, TurnOutput
from env.rollout.events import Event
from env.rollout.pool import LocalPool, RolloutPool, make_pool

__all__ = [
    "Engine",
    "Episode",
    "EpisodeResult",
    "Event",
    "LocalPool",
    "RolloutLimits",
    "RolloutPool",
    "State",
    "TurnOutput",
    "default_prompt",
    "iter_groups",
    "make_pool",
    "run_episodes",
    "run_episodes_sync",
]
