"""Checkpoints with orbax: train state (params, optimizer state, step, RNG) plus JSON metadata.

A save goes to `<dir>/<step>.orbax-checkpoint-tmp` and is committed by rename, so a run killed at any
moment (kill -9 included) leaves the last complete step restorable; `cleanup_tmp_directories=True` removes
half-written steps on the next start. Saves are asynchronous: `wait()` (called on exit and on SIGTERM)
makes sure the last one lands.
"""

import signal
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging


class Checkpointer:
    """A thin, typed wrapper over orbax's CheckpointManager for one phase of a run (e.g. 'sft', 'rl').

    Each checkpoint holds two items: 'state' (a pytree of arrays: params, optimizer state, RNG key, ...)
    and 'meta' (a JSON-able dict: step, policy version, data position, ...).
    """

    def __init__(self, directory: Path, *, max_to_keep: int = 2, save_every: int = 1) -> None:
        self.directory = Path(directory).absolute()
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, cleanup_tmp_directories=True, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> bool:
        """Saves when `step` is a multiple of save_every (or `force`); returns whether it did."""
        if not force and step % self.save_every:
            return False
        if self._manager.latest_step() == step:
            return False
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        saved = self._manager.save(step, args=args, force=True)
        if saved:
            logging.info("checkpoint: saving step %d to %s", step, self.directory)
        return saved

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores (state, meta) at `step` (default: latest) into the structure/shardings of `target`."""
        step = self._manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        logging.info("checkpoint: restored step %d from %s", step, self.directory)
        return restored.state, dict(restored.meta)

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finish_saves_on_sigterm(checkpointer: Checkpointer) -> None:
    """On SIGTERM, waits for the in-flight asynchronous save to land, then exits (status 143)."""

    def handler(signum: int, frame: object) -> None:
        del frame
        logging.warning("signal %d: waiting for the last checkpoint to finish, then exiting", signum)
        checkpointer.close()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
