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


class _Rollout:
    """The bookkeeping both drivers share: starting episodes, feeding turns and events through the state
    machine, restarts, collecting results by group. The drivers only decide WHEN turns enter the engine."""

    def __init__(
        self,
        tasks: Sequence[Any],
        engine: Engine,
        pool: RolloutPool,
        *,
        tokenizer: Any,
        group_size: int,
        limits: RolloutLimits,
        grade: bool,
        max_restarts: int,
        prompt_fn: Callable[[Any], list[Message]],
        clock: Callable[[], float],
    ):
        self.tasks, self.engine, self.pool, self.tok = tasks, engine, pool, tokenizer
        self.group_size, self.limits, self.grade, self.max_restarts = group_size, limits, grade, max_restarts
        self.clock = clock
        self.prompts = [prompt_fn(t) for t in tasks]
        self.prompt_ids: dict[int, list[int]] = {}  # rendered once per task, on first use
        self.live: dict[str, Episode] = {}
        self.requests: dict[str, str] = {}  # engine request id -> episode id
        self.ready: list[Episode] = []  # in GENERATE, not yet given to the engine
        self.first_start: dict[tuple[int, int], float] = {}
        self.restarts: collections.Counter = collections.Counter()
        self.results: dict[int, dict[int, EpisodeResult]] = collections.defaultdict(dict)
        self.done_groups: list[int] = []

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
            task_id=ep.task_id,
            group=ep.group,
            member=ep.member,
            episode_id=ep.episode_id,
            ids=ep.ids,
            loss_mask=ep.loss_mask,
            logprobs=ep.logprobs,
            messages=ep.messages,
            reward=None if grade is None else float(grade.reward),
            components=dict(grade.components) if grade is not None else {},
            truncated=ep.truncated,
            truncation=ep.truncation,
            n_turns=ep.n_turns,
            n_tool_calls=ep.n_tool_calls,
            n_tool_errors=ep.n_tool_errors,
            n_parallel_turns=ep.n_parallel_turns,
            n_cut_turns=ep.n_cut_turns,
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
    """
    if max_active < 1 or group_size < 1:
        raise ValueError(f"max_active ({max_active}) and group_size ({group_size}) must be at least 1")
    ro = _Rollout(
        tasks,
        engine,
        pool,
        tokenizer=tokenizer,
        group_size=group_size,
        limits=limits,
        grade=grade,
        max_restarts=max_restarts,
        prompt_fn=prompt_fn,
        clock=clock,
    )
    queue = collections.deque((g, m) for g in range(len(tasks)) for m in range(group_size))
    while queue or ro.live:
        while queue and len(ro.live) < max_active:
            ro.start(*queue.popleft())
        ro.submit_ready()
        busy = engine.pending() > 0
        if busy:
            ro.on_outputs(engine.step())
        ro.on_events(pool.poll(0.0 if busy or ro.ready else poll_s))
        yield from ro.pop_groups()


def run_episodes(
    tasks: Sequence[Any],
    engine: Engine,
    pool: RolloutPool,
    *,
    tokenizer: Any,
    group_size: int,
    limits: RolloutLimits,
    max_active: int | None = None,
    **kwargs: Any,
) -> list[EpisodeResult]:
    """All episodes of `iter_groups` (max_active defaults to every episode at once), in task-then-member
    order."""
    n = len(tasks) * group_size
    groups = iter_groups(
        tasks,
        engine,
        pool,
        tokenizer=tokenizer,
        group_size=group_size,
        limits=limits,
        max_active=max_active or n,
        **kwargs,
    )
    return sorted((r for g in groups for r in g), key=lambda r: (r.group, r.member))


def run_episodes_sync(
    tasks: Sequence[Any],
    engine: Engine,
    pool: RolloutPool,
    *,
    tokenizer: Any,
    group_size: int,
    limits: RolloutLimits,
    batch_size: int,
    grade: bool = True,
    max_restarts: int = 2,
    prompt_fn: Callable[[Any], list[Message]] = default_prompt,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
) -> list[EpisodeResult]:
    """The synchronous baseline: batches of `batch_size` episodes; within a batch every turn starts only when
    the previous turn of every member has finished generating and its tools have returned, and the next batch
    starts when the whole batch is graded. Same state machine and results as `run_episodes`."""
    ro = _Rollout(
        tasks,
        engine,
        pool,
        tokenizer=tokenizer,
        group_size=group_size,
        limits=limits,
        grade=grade,
        max_restarts=max_restarts,
        prompt_fn=prompt_fn,
        clock=clock,
    )
    order = [(g, m) for g in range(len(tasks)) for m in range(group_size)]
    for i in range(0, len(order), batch_size):
        for key in order[i : i + batch_size]:
            ro.start(*key)
        while ro.live:
            if ro.generating() == 0 and ro.in_tools() == 0:
                ro.submit_ready()  # the barrier: the whole batch's next turn at once
            busy = engine.pending() > 0
            if busy:
                ro.on_outputs(engine.step())
            ro.on_events(pool.poll(0.0 if busy else poll_s))
    return sorted((r for g in ro.results.values() for r in g.values()), key=lambda r: (r.group, r.member))
