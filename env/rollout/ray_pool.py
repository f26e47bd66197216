"""RayPool: the rollout pool's backend on a Ray cluster, with the same interface and events as LocalPool.

Each worker is a Ray actor that runs the LocalPool worker body (env/rollout/worker.py: sandboxes, tool
calls, grading) unchanged, on a thread, with two queues in place of the pipe. The pool keeps one
`receive` call in flight per actor; poll() waits on those, so events arrive as the actors produce them.

Commands reach an actor as numbered messages and run in number order: a threaded actor runs its method
calls concurrently and in no guaranteed order, and an episode's 'start' must precede its 'calls'.

An actor that dies (its node lost, killed, out of memory) surfaces as a RayActorError from its `receive`;
the pool starts a fresh actor in its place and every episode that lived in it gets a 'restart' event, so
the driver reruns it from scratch: never scored. The actors are created with max_restarts=0 because a
restarted actor would come back without its episodes' sandboxes: replacing it is the pool's job.

Connects to a running cluster by address (or the RAY_ADDRESS environment variable), else starts a local
one with `num_cpus` (default: one per worker).
"""

import contextlib
import dataclasses
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from env.rollout.events import Event
from env.rollout.pool import LocalPool, _Handle
from env.rollout.worker import WorkerOptions, _Worker

_RECEIVE_WAIT_S = 1.0  # how long an actor's receive call blocks when it has nothing to send
_CLOSED = ("closed",)


class _QueueConnection:
    """The worker's end of the pipe, made of the actor's inbox and outbox (same send / recv / close)."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()

    def send(self, message: tuple) -> None:
        self.outbox.put(message)

    def recv(self) -> tuple:
        message = self.inbox.get()
        if message is _CLOSED:
            raise EOFError("the pool closed this worker")
        return message

    def close(self) -> None:
        pass


class RolloutActor:
    """A rollout worker as a Ray actor: the worker body on a thread, messages in order by number."""

    def __init__(self, index: int, options: WorkerOptions) -> None:
        self._conn = _QueueConnection()
        self._next = 0
        self._held: dict[int, tuple] = {}
        self._lock = threading.Lock()
        worker = _Worker(self._conn, index, options)
        self._thread = threading.Thread(target=worker.serve, name=f"rollout-worker-{index}", daemon=True)
        self._thread.start()

    def send(self, number: int, message: tuple) -> None:
        with self._lock:
            self._held[number] = message
            while self._next in self._held:
                self._conn.inbox.put(self._held.pop(self._next))
                self._next += 1

    def receive(self, timeout: float) -> list[tuple]:
        """The worker's messages: waits up to `timeout` for the first, then takes all that are there."""
        try:
            messages = [self._conn.outbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                messages.append(self._conn.outbox.get_nowait())
            except queue.Empty:
                return messages

    def stop(self, timeout: float) -> bool:
        """Closes the worker's episodes (no grading) and waits for it; True if it stopped in time."""
        self._conn.inbox.put(("stop",))
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def pid(self) -> int:
        return os.getpid()


@dataclasses.dataclass
class _ActorState:
    """Per actor, beside LocalPool's handle: messages sent so far and the receive call in flight."""

    sent: int = 0
    receiving: Any = None


class RayPool(LocalPool):
    """`n_workers` Ray actors; episodes pinned to the least loaded actor, as in LocalPool (whose bookkeeping,
    events and metrics it shares: only how workers are started, reached and replaced differs).

    address and num_cpus: which cluster (see the module docstring); the other keywords are LocalPool's.
    """

    _workers_are = "actors"

    def __init__(
        self, n_workers: int, *, address: str | None = None, num_cpus: int | None = None, **options: Any
    ) -> None:
        import ray

        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            elif not os.environ.get("RAY_ADDRESS"):
                # A local cluster: its workers import this repository like the driver does.
                root = str(Path(__file__).resolve().parents[2])
                path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
                kwargs.update(num_cpus=num_cpus or n_workers, runtime_env={"env_vars": {"PYTHONPATH": path}})
            ray.init(**kwargs)
        # Threads: receive blocks while send and stop come in. num_cpus=0 places actors by the pool's size,
        # not by a CPU count (their tools run as child processes the sandbox limits).
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)(RolloutActor)
        self._actors: list[_ActorState] = []
        super().__init__(n_workers, **options)

    # -- the interface (start_episode, submit_calls, finish_episode, metrics: LocalPool's)
    def poll(self, timeout: float) -> list[Event]:
        ray = self._ray
        events: list[Event] = []
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            pending = {self._actors[i].receiving: i for i in range(len(self._workers))}
            remaining = 0.0 if events else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            if ready:  # take every other answer that is already there too
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
            for ref in ready:
                i = pending[ref]
                try:
                    messages = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._workers[i].dead = True
                    messages = []
                for message in messages:
                    self._receive(self._workers[i], message, events)
                if self._workers[i].dead:
                    self._replace(i, events)
                else:
                    self._actors[i].receiving = self._workers[i].process.receive.remote(_RECEIVE_WAIT_S)
            if events or time.monotonic() >= deadline:
                return events

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        stops = [w.process.stop.remote(10.0) for w in self._workers]
        for w, ref in zip(self._workers, stops, strict=True):
            with contextlib.suppress(Exception):  # dead or stuck: it goes with the kill below
                ray.get(ref, timeout=15.0)
            ray.kill(w.process, no_restart=True)
        for episode_id in list(self._where):
            self._forget(episode_id, remove_workspace=True)
        if self._owns_ray:
            ray.shutdown()

    # -- RayPool only (tests, benchmarks, debugging; wait_ready: LocalPool's)
    def actor_of(self, episode_id: str) -> Any:
        """The actor handle that holds `episode_id` (e.g. for ray.kill in tests)."""
        return self._workers[self._worker_of(episode_id)].process

    def worker_pid(self, episode_id: str) -> int:
        return self._workers[self._worker_of(episode_id)].pid

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    # -- internals: LocalPool's, for actors
    def _spawn(self, index: int) -> _Handle:
        actor = self._actor_cls.remote(index, self._options)
        state = _ActorState(receiving=actor.receive.remote(_RECEIVE_WAIT_S))
        if index < len(self._actors):
            self._actors[index] = state
        else:
            self._actors.append(state)
        return _Handle(process=actor, conn=None)

    def _send(self, index: int, message: tuple) -> None:
        state = self._actors[index]
        # Fire and forget: an actor that died shows it through its pending receive.
        self._workers[index].process.send.remote(state.sent, message)
        state.sent += 1

    def _end_worker(self, index: int) -> str:
        w = self._workers[index]
        self._ray.kill(w.process, no_restart=True)
        return f"actor {index} (pid {w.pid}) died"
