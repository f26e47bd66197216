"""The body of one LocalPool worker process: it owns the sandboxes of the episodes pinned to it.

Messages in (one duplex pipe from the pool), each a tuple:

    ("start", episode_id, task_dir)          make the workspace, the sandbox and the tool context
    ("calls", episode_id, calls)             run one turn's calls concurrently (env.tools.execute_parallel)
    ("finish", episode_id, grade)            grade the workspace if asked; remove it, close the sandbox
    ("stop",)                                close every episode and exit

Messages out: ("ready", {"pid", "jax"}) once, then ("event", Event) for each command done.

Each episode has its own thread that runs its commands in arrival order, so the commands of different
episodes overlap and a command sent before the previous one finished simply waits its turn. A command that
raises ends the episode on this worker (its workspace removed) with an 'error' event; later commands for it
answer 'error' too. The process imports env/ and env.chat only: it is started with 'spawn' and never
inherits the parent's JAX state.
"""

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from env import reward, sandbox, tasks, tools
from env.chat import ToolCall
from env.rollout.events import Event
from env.tasks import environments
from env.tools import first_edit_after_read

log = logging.getLogger(__name__)
_STOP_JOIN_S = 10.0  # how long "stop" waits for episodes still running a command


@dataclasses.dataclass
class _Live:
    """What the worker holds for one episode."""

    task: Any
    workspace: Path
    sandbox: Any
    ctx: Any
    tool_errors: int = 0
    turn_calls: list[list[str]] = dataclasses.field(default_factory=list)
    closed: bool = False


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What every worker of a pool runs episodes with: the sandboxes' isolation level and limits (None: the
    sandbox's defaults), the tools episodes may call (None: all of them) and codebase_search's trained
    encoder, a model directory ('': the hashed fallback; env.tools.ToolContext)."""

    isolation: str = "auto"
    limits: Any = None
    tools: tuple[str, ...] | None = None
    search_model: str = ""


class _Worker:
    def __init__(self, conn: Connection, index: int, options: WorkerOptions):
        self.conn, self.index = conn, index
        self.isolation, self.tools, self.search_model = options.isolation, options.tools, options.search_model
        self.limits = options.limits if options.limits is not None else sandbox.Limits()
        self.send_lock = threading.Lock()
        self.lock = threading.Lock()
        self.queues: dict[str, queue.SimpleQueue] = {}
        self.threads: dict[str, threading.Thread] = {}
        self.task_cache: dict[str, Any] = {}

    def send(self, message: tuple) -> None:
        # Connection.send is not thread-safe; OSError: the pool is gone and nobody is left to tell.
        with self.send_lock, contextlib.suppress(OSError):
            self.conn.send(message)

    def event(self, episode_id: str, kind: str, **payload: Any) -> None:
        self.send(("event", Event(episode_id, kind, payload)))

    def serve(self) -> None:
        self.send(("ready", {"pid": os.getpid(), "jax": "jax" in sys.modules}))
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):  # the pool is gone: clean up and leave
                break
            if message[0] == "stop":
                break
            op, episode_id = message[0], message[1]
            with self.lock:
                q = self.queues.get(episode_id)
                if op == "start" and q is None:
                    q = self.queues[episode_id] = queue.SimpleQueue()
                    thread = threading.Thread(target=self._episode, args=(episode_id, q), daemon=True)
                    self.threads[episode_id] = thread
                    thread.start()
                elif op == "start":
                    q = None
            if q is None:
                self.event(episode_id, "error", reason=f"{op!r} for an episode this worker does not hold")
            else:
                q.put(message)
        self.stop()

    def stop(self) -> None:
        """Closes every episode still here (no grading) and waits a bounded time for their threads."""
        with self.lock:
            pending = list(self.queues.items())
        for _, q in pending:
            q.put(("finish", None, False))
        deadline = time.monotonic() + _STOP_JOIN_S
        for episode_id, _ in pending:
            thread = self.threads.get(episode_id)
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))

    # -- one episode's thread
    def _episode(self, episode_id: str, q: queue.SimpleQueue) -> None:
        live: _Live | None = None
        op = "start"
        try:
            while True:
                message = q.get()
                op = message[0]
                if op == "start":
                    t0 = time.monotonic()
                    live = self._start(message[2])
                    self.event(
                        episode_id,
                        "started",
                        workspace=str(live.workspace),
                        worker=self.index,
                        pid=os.getpid(),
                        start_s=time.monotonic() - t0,
                    )
                elif op == "calls":
                    self._calls(episode_id, live, message[2])
                elif op == "finish":  # message[1] is None when the worker stops: no event then
                    self._finish(message[1] and episode_id, live, grade=message[2])
                    live = None
                    return
        except Exception as e:
            self._close(live)
            reason = f"{op} failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"
            self.event(episode_id, "error", reason=reason, stage=op, worker=self.index)
        finally:
            with self.lock:
                self.queues.pop(episode_id, None)
                self.threads.pop(episode_id, None)

    def _start(self, task_dir: str) -> _Live:
        task = self.task_cache.get(task_dir)
        if task is None:
            task = self.task_cache[task_dir] = tasks.load_task(task_dir)
        workspace = sandbox.make_workspace(task.repo)
        try:
            box = sandbox.Sandbox(
                workspace,
                limits=self.limits,
                isolation=self.isolation,
                python_env=environments.python_env(task),
            )
        except Exception:
            sandbox.remove_workspace(workspace)
            raise
        return _Live(
            task,
            Path(workspace),
            box,
            tools.ToolContext(workspace, box, tools=self.tools, search_model=self.search_model),
        )

    def _calls(self, episode_id: str, live: _Live, calls: list) -> None:
        t0 = time.monotonic()
        results = tools.execute_parallel(live.ctx, calls)
        elapsed = time.monotonic() - t0
        live.tool_errors += sum(bool(r.is_error) for r in results)
        live.turn_calls.append([c.name if isinstance(c, ToolCall) else "" for c in calls])
        self.event(episode_id, "tool_results", results=results, elapsed_s=elapsed, n_calls=len(calls))

    def _finish(self, episode_id: str | None, live: _Live | None, *, grade: bool) -> None:
        t0 = time.monotonic()
        result = None
        try:
            if grade and live is not None:
                result = reward.grade(
                    live.task,
                    live.workspace,
                    edited_files=live.ctx.edited_files,
                    tool_errors=live.tool_errors,
                    first_edit_after_read=first_edit_after_read(live.turn_calls),
                    isolation=self.isolation,
                )
        finally:
            self._close(live)
        if episode_id is not None:
            self.event(episode_id, "graded", grade=result, grade_s=time.monotonic() - t0)

    @staticmethod
    def _close(live: _Live | None) -> None:
        """Closes the sandbox and removes the workspace, once; a failure is logged, never raised, so that the
        episode's event still goes out."""
        if live is None or live.closed:
            return
        live.closed = True
        for what, fn in (
            ("sandbox", live.sandbox.close),
            ("workspace", lambda: sandbox.remove_workspace(live.workspace)),
        ):
            try:
                fn()
            except Exception:
                log.exception("closing the %s of an episode failed (%s)", what, live.workspace)


def run_worker(conn: Connection, index: int, options: WorkerOptions) -> None:
    """Entry point of a worker process (multiprocessing target)."""
    # Ctrl-C reaches the whole process group; the pool decides when workers stop (and they clean up then).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _Worker(conn, index, options).serve()
    finally:
        conn.close()
