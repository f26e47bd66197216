"""The rollout pool: where episodes' tool calls run, behind a small message-based interface.

    pool.start_episode(episode_id, task_dir)     async; pins the episode to one worker
    pool.submit_calls(episode_id, calls)         async; one turn's calls (ToolCall or CallError), run together
    pool.finish_episode(episode_id, grade=True)  async; grade, then remove the workspace
    pool.poll(timeout) -> list[Event]            what happened since (see events.py)

`LocalPool` runs `n_workers` processes started with 'spawn' (env/rollout/worker.py) on this machine; a Ray
backend can implement the same `RolloutPool` with actors. A worker that dies (killed, segfault, out of
memory) is noticed through its process sentinel, replaced by a fresh process, and every episode that lived
in it gets a 'restart' event: the driver runs those episodes again from scratch. Restarts are counted in
`metrics()`. The pool removes the dead worker's workspaces it knows of (from their 'started' events); one
that died while being made is swept by env.sandbox.make_workspace, which removes workspaces of dead pids.
"""

import abc
import collections
import contextlib
import dataclasses
import multiprocessing
import statistics
import sys
import time
import types
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from env.chat import CallError, ToolCall
from env.rollout.events import Event
from env.rollout.worker import WorkerOptions, run_worker

_LATENCY_WINDOW = 10_000  # latencies kept for the percentiles in metrics()


class RolloutPool(abc.ABC):
    """Backend-neutral interface of a pool of tool executors. All calls but poll return at once."""

    @abc.abstractmethod
    def start_episode(self, episode_id: str, task_dir: str) -> None:
        """Makes the episode's workspace (a private copy of the task repo), sandbox and tool context."""

    @abc.abstractmethod
    def submit_calls(self, episode_id: str, calls: Sequence[ToolCall | CallError]) -> None:
        """Runs one turn's calls concurrently; a 'tool_results' event brings the results in call order."""

    @abc.abstractmethod
    def finish_episode(self, episode_id: str, *, grade: bool) -> None:
        """Grades the final workspace (if `grade`), then removes it; a 'graded' event follows."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> list[Event]:
        """Events since the last poll; waits up to `timeout` seconds for the first one."""

    @abc.abstractmethod
    def metrics(self) -> dict[str, float]:
        """Counters and latency statistics (worker restarts, episodes restarted, tool-call latency, ...)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stops the workers and removes what they left behind."""

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass
class _Handle:
    process: Any
    conn: Connection
    episodes: set[str] = dataclasses.field(default_factory=set)
    pid: int | None = None
    jax: bool = False
    dead: bool = False


class LocalPool(RolloutPool):
    """`n_workers` local processes; each episode is pinned to the least loaded one when it starts.

    isolation and limits go to every `env.sandbox.Sandbox` (None: the sandbox's default limits). Sandboxes
    take the first free slot themselves (slots are machine-wide locks, shared with graders and other pools).
    tools: the tools episodes may call (None: all of them; env.tools.ToolContext). search_model:
    codebase_search's trained encoder, a model directory ('': the hashed fallback; env.tools.ToolContext).
    """

    _workers_are = "workers"  # what errors call the workers

    def __init__(
        self,
        n_workers: int,
        *,
        isolation: str = "auto",
        limits: Any = None,
        tools: tuple[str, ...] | None = None,
        search_model: str = "",
    ):
        if n_workers < 1:
            raise ValueError(f"n_workers must be at least 1, got {n_workers}")
        self._mp = multiprocessing.get_context("spawn")
        self._options = WorkerOptions(isolation, limits, tools, search_model)
        self._workers: list[_Handle] = []
        self._where: dict[str, int] = {}  # live episode -> worker index
        self._workspaces: dict[str, str] = {}
        self._submitted: dict[str, float] = {}  # episode -> when its calls / finish were sent
        self._counts: collections.Counter = collections.Counter()
        self._lat: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=_LATENCY_WINDOW)
        )
        self._closed = False
        for i in range(n_workers):
            self._workers.append(self._spawn(i))

    # -- the interface
    def start_episode(self, episode_id: str, task_dir: str) -> None:
        if episode_id in self._where:
            raise ValueError(f"episode {episode_id!r} is already running")
        i = min(range(len(self._workers)), key=lambda j: (len(self._workers[j].episodes), j))
        self._where[episode_id] = i
        self._workers[i].episodes.add(episode_id)
        self._counts["episodes_started"] += 1
        self._send(i, ("start", episode_id, str(task_dir)))

    def submit_calls(self, episode_id: str, calls: Sequence[ToolCall | CallError]) -> None:
        self._submitted[episode_id] = time.monotonic()
        self._counts["tool_batches"] += 1
        self._counts["tool_calls"] += len(calls)
        self._counts["parallel_batches"] += len(calls) > 1
        self._send(self._worker_of(episode_id), ("calls", episode_id, list(calls)))

    def finish_episode(self, episode_id: str, *, grade: bool) -> None:
        self._submitted[episode_id] = time.monotonic()
        self._send(self._worker_of(episode_id), ("finish", episode_id, bool(grade)))

    def poll(self, timeout: float) -> list[Event]:
        events: list[Event] = []
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            waitables = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            remaining = 0.0 if events else max(0.0, deadline - time.monotonic())
            ready = set(wait(waitables, timeout=remaining))
            for i, w in enumerate(self._workers):
                if w.conn in ready or w.process.sentinel in ready or w.dead:
                    self._drain(w, events)
                if w.dead or w.process.sentinel in ready:
                    self._replace(i, events)
            if events or time.monotonic() >= deadline:
                return events

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = {"workers": len(self._workers), "live_episodes": len(self._where)}
        for k in (
            "worker_restarts",
            "episodes_restarted",
            "episodes_started",
            "episodes_finished",
            "episodes_graded",
            "episode_errors",
            "tool_batches",
            "tool_calls",
            "parallel_batches",
            "tool_errors",
        ):
            m[k] = self._counts[k]
        m["workers_with_jax"] = sum(w.jax for w in self._workers)
        for name, values in self._lat.items():
            if values:
                v = sorted(values)
                m[f"{name}_mean"] = statistics.fmean(v)
                m[f"{name}_p50"] = v[len(v) // 2]
                m[f"{name}_p95"] = v[min(len(v) - 1, int(0.95 * len(v)))]
                m[f"{name}_max"] = v[-1]
        return m

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for i in range(len(self._workers)):
            self._send(i, ("stop",))
        for w in self._workers:
            w.process.join(15.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5.0)
            w.conn.close()
        for episode_id in list(self._where):  # left by workers that died or did not stop in time
            self._forget(episode_id, remove_workspace=True)

    # -- beside the interface (tests, benchmarks, debugging)
    def wait_ready(self, timeout: float) -> list[Event]:
        """Waits until every worker has started and reported in; returns the events seen meanwhile."""
        events: list[Event] = []
        deadline = time.monotonic() + timeout
        while any(w.pid is None for w in self._workers):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout {self._workers_are} not ready after {timeout} s")
            events += self.poll(0.05)
        return events

    def worker_pid(self, episode_id: str) -> int:
        """The pid of the process that holds `episode_id`."""
        return self._workers[self._worker_of(episode_id)].process.pid

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    # -- internals
    def _spawn(self, index: int) -> _Handle:
        parent, child = self._mp.Pipe(duplex=True)
        process = self._mp.Process(
            target=run_worker,
            args=(child, index, self._options),
            name=f"rollout-worker-{index}",
            daemon=True,
        )
        with _main_module_hidden():
            process.start()
        child.close()
        return _Handle(process, parent)

    def _worker_of(self, episode_id: str) -> int:
        try:
            return self._where[episode_id]
        except KeyError:
            raise KeyError(f"episode {episode_id!r} is not running in this pool") from None

    def _send(self, index: int, message: tuple) -> None:
        w = self._workers[index]
        try:
            w.conn.send(message)
        except OSError:  # it died; the next poll replaces it and restarts its episodes
            w.dead = True

    def _drain(self, w: _Handle, events: list[Event]) -> None:
        try:
            while w.conn.poll():
                self._receive(w, w.conn.recv(), events)
        except (EOFError, OSError):
            w.dead = True

    def _receive(self, w: _Handle, message: tuple, events: list[Event]) -> None:
        if message[0] == "ready":
            w.pid, w.jax = message[1]["pid"], message[1]["jax"]
            return
        ev: Event = message[1]
        if ev.episode_id not in self._where:
            return  # an answer about an episode the pool already dropped
        now = time.monotonic()
        if ev.kind == "started":
            self._workspaces[ev.episode_id] = ev.payload["workspace"]
            self._lat["start_s"].append(ev.payload["start_s"])
        elif ev.kind == "tool_results":
            self._lat["tool_batch_s"].append(ev.payload["elapsed_s"])
            self._lat["tool_roundtrip_s"].append(now - self._submitted.pop(ev.episode_id, now))
            self._counts["tool_errors"] += sum(bool(r.is_error) for r in ev.payload["results"])
        elif ev.kind == "graded":
            self._counts["episodes_finished"] += 1
            if ev.payload["grade"] is not None:
                self._counts["episodes_graded"] += 1
                self._lat["grade_s"].append(ev.payload["grade_s"])
            self._forget(ev.episode_id)
        elif ev.kind == "error":
            self._counts["episode_errors"] += 1
            self._forget(ev.episode_id)
        events.append(ev)

    def _replace(self, index: int, events: list[Event]) -> None:
        """Replaces a dead worker with a fresh one; its episodes get 'restart' events."""
        reason = self._end_worker(index)
        w = self._workers[index]
        for episode_id in sorted(w.episodes):
            events.append(Event(episode_id, "restart", {"reason": reason, "worker": index}))
            self._forget(episode_id, remove_workspace=True)
            self._counts["episodes_restarted"] += 1
        self._counts["worker_restarts"] += 1
        self._workers[index] = self._spawn(index)

    def _end_worker(self, index: int) -> str:
        """Makes sure a dead worker's process is gone; returns how it ended, for its episodes' restarts."""
        w = self._workers[index]
        if w.process.is_alive():  # its pipe broke but it still runs
            w.process.kill()
        w.process.join(5.0)
        w.conn.close()
        return f"worker {index} (pid {w.process.pid}) exited with code {w.process.exitcode}"

    def _forget(self, episode_id: str, remove_workspace: bool = False) -> None:
        index = self._where.pop(episode_id)
        self._workers[index].episodes.discard(episode_id)
        self._submitted.pop(episode_id, None)
        workspace = self._workspaces.pop(episode_id, None)
        if remove_workspace and workspace is not None:
            from env.sandbox import remove_workspace as remove

            with contextlib.suppress(OSError):
                remove(workspace)


@contextlib.contextmanager
def _main_module_hidden():
    """Starts spawn children without re-running the parent's main module.

    'spawn' re-imports the parent's `__main__` in the child (as `__mp_main__`) so that functions defined
    there can be unpickled. The worker's target lives in env.rollout.worker, and the main script (launch.py,
    a notebook kernel) may import JAX at top level, which a worker must never load. With a bare stand-in as
    `__main__` while the child's start-up data is written, the child imports nothing of it.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


POOLS = {"local": LocalPool}


def make_pool(config: Any) -> RolloutPool:
    """The pool named by `config.env.rollout_backend`, sized by `config.env.n_workers`, its commands limited
    to `config.env.command_timeout_s`, its episodes offered the tools of `config.env.tools` (codebase_search
    with the trained encoder `config.env.search_model`, if any). 'ray'
    (env/rollout/ray_pool.py, imported only when chosen) connects to the cluster at `config.env.ray_address`
    ('' : RAY_ADDRESS, else a local cluster)."""
    backend = config.env.rollout_backend
    if backend != "ray" and backend not in POOLS:
        raise ValueError(f"unknown env.rollout_backend {backend!r}; known: {sorted([*POOLS, 'ray'])}")
    from env.sandbox import Limits
    from env.tools import offered_tools

    limits = Limits(timeout_s=config.env.command_timeout_s)
    tools = offered_tools(config.env.tools)
    if backend == "ray":
        from env.rollout.ray_pool import RayPool

        return RayPool(
            config.env.n_workers,
            isolation=config.env.isolation,
            limits=limits,
            tools=tools,
            search_model=config.env.search_model,
            address=config.env.ray_address or None,
        )
    return POOLS[backend](
        config.env.n_workers,
        isolation=config.env.isolation,
        limits=limits,
        tools=tools,
        search_model=config.env.search_model,
    )
