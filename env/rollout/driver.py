"""The rollout loop: episodes move between a decode engine and a tool pool, and nobody waits for the slowest.

    run_episodes(tasks, engine, pool, tokenizer=tok, group_size=G, limits=RolloutLimits(...))

Continuous batching at the episode level (`iter_groups`, `run_episodes`): an episode's next turn goes to the
engine the moment its tool results are back, its calls go to the pool the moment its turn is out, and a
finished episode's place goes to the next episode in the queue at once. While some episodes wait on tools,
the others keep the engine busy. `run_episodes_sync` is the synchronous baseline for the benchmark: a batch
of episodes advances turn by turn, and every turn waits for the batch's slowest generation and slowest tools.

The engine is anything with this protocol (the sampler implements it; `engines.ScriptedEngine` fakes it):

    add(request_id, prompt_ids, max_new_tokens) -> None   queue one turn
    step() -> list[TurnOutput]                               some decode steps; the turns that finished
    pending() -> int                                         requests queued or generating

(TurnOutput is in episode.py; anything with its fields request_id, token_ids, logprobs, stop will do.)

A worker death or an infrastructure error restarts the episode from scratch (fresh workspace); it is
counted (`EpisodeResult.restarts`) and never scored. An episode that cannot be run after `max_restarts`
restarts comes back with `reward=None` and `error` set, never with a made-up reward of 0.
"""

import collections
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from env.chat import Message, system_message
from env.expert import INSTRUCTIONS
from env.rollout.episode import (
    Episode,
    RolloutLimits,
    State,
    TurnOutput,
    render_prompt_ids,
)
from env.rollout.pool import Event, RolloutPool
from env.tools import first_edit_after_read, tool_schemas


class Engine(Protocol):
    def add(self, request_id: str, prompt_ids: Sequence[int], max_new_tokens: int) -> None: ...

    def step(self) -> list[TurnOutput]: ...

    def pending(self) -> int: ...


@dataclasses.dataclass
class EpisodeResult:
    """One finished episode: its token stream for the learner, its grade and its statistics.

    ids / loss_mask / logprobs are [t] lists (see episode.py). reward is None only when the episode could not
    be run or graded (`error` says why); a truncated episode is graded like any other.
    """

    task_id: str
    group: int
    member: int
    episode_id: str
    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[Message]
    reward: float | None
    components: dict
    truncated: bool
    truncation: str | None
    n_turns: int
    n_tool_calls: int
    n_tool_errors: int
    n_parallel_turns: int
    n_cut_turns: int
    searched_before_edit: bool | None
    restarts: int
    wall_s: float
    error: str | None = None
    grade: Any = None  # env.reward.Grade (tests, output) when graded
    # [start, end) in `ids` of the generated turns whose calls got at least one error result (a malformed
    # call, an unknown tool, a failed edit): always-wrong turns, whatever the episode's reward
    error_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # ... and of those with a search that found nothing (a wrong name, a pattern that cannot match)
    empty_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)


# What an EpisodeResult takes from its Episode as it is (the rest it derives or adds).
_FROM_EPISODE = (
    "task_id",
    "group",
    "member",
    "episode_id",
    "ids",
    "loss_mask",
    "logprobs",
    "messages",
    "truncated",
    "truncation",
    "n_turns",
    "n_tool_calls",
    "n_tool_errors",
    "n_parallel_turns",
    "n_cut_turns",
)


def default_prompt(task: Any) -> list[Message]:
    """The opening of an episode: the system turn with the tool schemas, then the task's bug report; the same
    opening as the expert's trajectories, so that RL prompts are the ones SFT trained on."""
    return [system_message(tool_schemas(), INSTRUCTIONS), Message("user", task.problem_statement)]


def request_id(episode_id: str, turn: int) -> str:
    """The engine request of turn `turn` of an episode: '{episode_id}@{turn}'."""
    return f"{episode_id}@{turn}"


def episode_id(task_id: str, group: int, member: int, attempt: int) -> str:
    """'{task_id}/{group}/{member}#{attempt}': unique per attempt, so events of a dead attempt never match."""
    return f"{task_id}/{group}/{member}#{attempt}"


def episode_key(request: str) -> str:
    """The part of a request id that names the episode's place, the same for every attempt and turn:
    '{task_id}/{group}/{member}'. Test engines use it to replay the same script after a restart."""
    return request.rsplit("@", 1)[0].rsplit("#", 1)[0]


@dataclasses.dataclass(eq=False)
class _Rollout:
    """The episodes' bookkeeping under `iter_groups`' loop: starting episodes, feeding turns and events
    through the state machine, restarts, collecting results by group. The loop only decides WHEN turns enter
    the engine (continuously, or in lockstep for the synchronous baseline)."""

    tasks: Sequence[Any]
    engine: Engine
    pool: RolloutPool
    tok: Any
    group_size: int
    limits: RolloutLimits
    grade: bool
    max_restarts: int
    prompts: list[list[Message]]  # each task's opening messages
    clock: Callable[[], float]
    prompt_ids: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # per task, on first use
    live: dict[str, Episode] = dataclasses.field(default_factory=dict)
    requests: dict[str, str] = dataclasses.field(default_factory=dict)  # engine request id -> episode id
    ready: list[Episode] = dataclasses.field(default_factory=list)  # in GENERATE, not yet with the engine
    first_start: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)
    restarts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    results: dict[int, dict[int, EpisodeResult]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(dict)
    )
    done_groups: list[int] = dataclasses.field(default_factory=list)

    # -- the driver's moves
    def start(self, group: int, member: int) -> None:
        attempt = self.restarts[group, member]
        task = self.tasks[group]
        eid = episode_id(task.instance_id, group, member, attempt)
        now = self.clock()
        self.first_start.setdefault((group, member), now)
        ep = Episode.create(
            eid,
            group=group,
            member=member,
            attempt=attempt,
            task_id=task.instance_id,
            prompt=self.prompts[group],
            prompt_ids=self._prompt_ids(group),
            now=now,
        )
        self.live[eid] = ep
        # The workspace is made while the first turn generates: the pool runs a worker's commands in order,
        # so calls sent before 'started' arrives wait for it there.
        self.pool.start_episode(eid, str(task.path))
        self._to_generate(ep)

    def _prompt_ids(self, group: int) -> list[int]:
        if group not in self.prompt_ids:
            self.prompt_ids[group] = render_prompt_ids(self.prompts[group], self.tok)
        return self.prompt_ids[group]

    def submit_ready(self) -> None:
        """Gives every ready episode's next turn to the engine (or ends it when a limit is reached)."""
        ready, self.ready = self.ready, []
        for ep in ready:
            budget = ep.next_turn_budget(self.limits, self.clock())
            if budget is None:
                self._finish(ep)
                continue
            rid = request_id(ep.episode_id, ep.n_turns)
            self.requests[rid] = ep.episode_id
            self.engine.add(rid, ep.ids, budget)

    def on_outputs(self, outputs: Sequence[TurnOutput]) -> None:
        for out in outputs:
            ep = self.live.get(self.requests.pop(out.request_id, ""))
            if ep is None:  # the turn of an attempt that was restarted meanwhile
                continue
            calls = ep.on_turn(out, self.tok, self.limits, self.clock())
            if ep.state is State.TOOLS:
                self.pool.submit_calls(ep.episode_id, calls)
            else:
                self._finish(ep)

    def on_events(self, events: Sequence[Event]) -> None:
        for ev in events:
            ep = self.live.get(ev.episode_id)
            if ep is None:
                continue  # e.g. the 'graded' that closes an attempt dropped after an error
            if ev.kind == "tool_results":
                ep.on_results(ev.payload["results"], self.tok, self.limits, self.clock())
                if ep.state is State.GENERATE:
                    self._to_generate(ep)
                else:
                    self._finish(ep)
            elif ev.kind == "graded":
                self._done(ep, ev.payload.get("grade"))
            elif ev.kind in ("restart", "error"):
                self._restart(ep, f"{ev.kind}: {ev.payload.get('reason', '')}")

    def generating(self) -> int:
        """Episodes whose turn is queued or generating in the engine."""
        return sum(1 for eid in self.requests.values() if eid in self.live)

    def in_tools(self) -> int:
        return sum(ep.state is State.TOOLS for ep in self.live.values())

    # -- internals
    def _to_generate(self, ep: Episode) -> None:
        self.ready.append(ep)

    def _finish(self, ep: Episode) -> None:
        ep.state = State.GRADING
        self.pool.finish_episode(ep.episode_id, grade=self.grade)

    def _restart(self, ep: Episode, reason: str) -> None:
        """Drops the attempt (its worker died or failed it; either way the worker holds nothing of it any
        more) and starts the episode again from scratch, or gives up after max_restarts."""
        del self.live[ep.episode_id]
        if ep in self.ready:
            self.ready.remove(ep)
        key = (ep.group, ep.member)
        self.restarts[key] += 1
        if self.restarts[key] > self.max_restarts:
            self._record(ep, None, error=f"gave up after {self.restarts[key]} restarts; last: {reason}")
        else:
            self.start(*key)

    def _done(self, ep: Episode, grade: Any) -> None:
        del self.live[ep.episode_id]
        ep.state = State.DONE
        self._record(ep, grade, error=None if grade is not None or not self.grade else "no grade")

    def _record(self, ep: Episode, grade: Any, error: str | None) -> None:
        key = (ep.group, ep.member)
        self.results[ep.group][ep.member] = EpisodeResult(
            **{name: getattr(ep, name) for name in _FROM_EPISODE},
            reward=None if grade is None else float(grade.reward),
            components=dict(grade.components) if grade is not None else {},
            searched_before_edit=first_edit_after_read(ep.turn_calls),
            restarts=self.restarts[key],
            wall_s=self.clock() - self.first_start[key],
            error=error,
            grade=grade,
            error_spans=[s for s, n in zip(ep.turn_spans, ep.turn_errors, strict=True) if n],
            empty_spans=[s for s, n in zip(ep.turn_spans, ep.turn_empty, strict=True) if n],
        )
        if len(self.results[ep.group]) == self.group_size:
            self.done_groups.append(ep.group)

    def pop_groups(self) -> Iterator[list[EpisodeResult]]:
        groups, self.done_groups = self.done_groups, []
        for g in groups:
            yield [self.results[g][m] for m in range(self.group_size)]


def iter_groups(
    tasks: Sequence[Any],
    engine: Engine,
    pool: RolloutPool,
    *,
    tokenizer: Any,
    group_size: int,
    limits: RolloutLimits,
    max_active: int,
    lockstep: bool = False,
    grade: bool = True,
    max_restarts: int = 2,
    prompt_fn: Callable[[Any], list[Message]] = default_prompt,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[list[EpisodeResult]]:
    """Runs `group_size` episodes of every task with continuous batching; yields each group (its
    EpisodeResults by member) as soon as the whole group is done, so the learner can start on it.

    At most `max_active` episodes are alive at once (each holds a workspace); a finished episode's place goes
    to the next one in task order at once. The loop never blocks on the pool while the engine has work.

    `lockstep` is the synchronous baseline's schedule instead: the next `max_active` episodes start only when
    the whole batch before them is done, and a turn of the batch goes to the engine only when every live
    member's previous turn has finished generating and its tools have returned.
    """
    if max_active < 1 or group_size < 1:
        raise ValueError(f"max_active ({max_active}) and group_size ({group_size}) must be at least 1")
    prompts = [prompt_fn(t) for t in tasks]
    ro = _Rollout(tasks, engine, pool, tokenizer, group_size, limits, grade, max_restarts, prompts, clock)
    queue = collections.deque((g, m) for g in range(len(tasks)) for m in range(group_size))
    while queue or ro.live:
        if not (lockstep and ro.live):
            while queue and len(ro.live) < max_active:
                ro.start(*queue.popleft())
        if not lockstep or ro.generating() == ro.in_tools() == 0:  # lockstep: the whole batch's turns at once
            ro.submit_ready()
        busy = engine.pending() > 0
        if busy:
            ro.on_outputs(engine.step())
        # Waits on the pool only when the engine is idle: every ready turn has been given to it by now, but
        # those held back by the lockstep barrier, which only tool results can release.
        ro.on_events(pool.poll(0.0 if busy else poll_s))
        yield from ro.pop_groups()


def run_episodes(
    tasks: Sequence[Any],
    engine: Engine,
    pool: RolloutPool,
    *,
    group_size: int,
    max_active: int | None = None,
    **kwargs: Any,
) -> list[EpisodeResult]:
    """All episodes of `iter_groups` (kwargs as there; max_active defaults to every episode at once), in
    task-then-member order."""
    n = len(tasks) * group_size
    groups = iter_groups(tasks, engine, pool, group_size=group_size, max_active=max_active or n, **kwargs)
    return sorted((r for g in groups for r in g), key=lambda r: (r.group, r.member))


def run_episodes_sync(
    tasks: Sequence[Any], engine: Engine, pool: RolloutPool, *, batch_size: int, **kwargs: Any
) -> list[EpisodeResult]:
    """The synchronous baseline: batches of `batch_size` episodes; within a batch every turn starts only when
    the previous turn of every member has finished generating and its tools have returned, and the next batch
    starts when the whole batch is graded (`iter_groups` in lockstep; kwargs as there). Same state machine
    and results as `run_episodes`, in the same order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    return run_episodes(tasks, engine, pool, max_active=batch_size, lockstep=True, **kwargs)
