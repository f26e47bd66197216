"""Task suites from directories: any suite (a directory of task directories, env.tasks.load_suite) in a
fixed order, and its split into train and held-out tasks.

`--config.env.tasks=DIR` trains on DIR instead of generated tasks. The held-out tasks are the suite at
`--config.eval.tasks` when set; otherwise DIR's tasks are split: the min(env.n_heldout_tasks, len // 5)
tasks (at least one) whose instance ids have the smallest SHA-256 digests are held out, the rest train. The
split depends on the instance ids alone, so a rerun (or another machine) makes the same one. A suite
directory is used whole: env.n_train_tasks and env.n_heldout_tasks count generated tasks.
"""

import hashlib
from pathlib import Path

import ml_collections
from absl import logging

from env import tasks as env_tasks
from env.tasks import environments


def suite_order(suite: list) -> list:
    """The tasks in the order every phase indexes them (SFT's first sft.n_trajectories, RL's task stream,
    EVAL's first eval.n_tasks), so a resumed run sees the same list: by generator seed when every task has
    one (a larger generated suite of one seed then begins with the smaller one's tasks), else by instance
    id."""
    if suite and all("seed" in t.metadata for t in suite):
        return sorted(suite, key=lambda t: (t.metadata["seed"], t.instance_id))
    return sorted(suite, key=lambda t: t.instance_id)


def load(path: str | Path) -> list:
    """The suite at `path` in suite_order; an error naming the directory when it holds no task, or when an
    environment its tasks name is not built (saying the prepare command)."""
    suite = suite_order(env_tasks.load_suite(Path(path).expanduser()))
    if not suite:
        raise ValueError(f"{path}: no task directories (each holds a task.json and repo/)")
    environments.require_built(suite, path)
    return suite


def _digest(task) -> bytes:
    return hashlib.sha256(task.instance_id.encode()).digest()


def split(suite: list, n_heldout: int) -> tuple[list, list]:
    """(train, held-out) of `suite`: the min(n_heldout, len // 5) tasks (at least one) with the smallest
    instance-id digests are held out. Both keep the suite's order."""
    if len(suite) < 2:
        raise ValueError(
            f"a suite of {len(suite)} task cannot be split into train and held-out tasks: add tasks, or "
            "name a held-out suite with --config.eval.tasks=DIR"
        )
    k = max(1, min(n_heldout, len(suite) // 5))
    held = {t.instance_id for t in sorted(suite, key=_digest)[:k]}
    return [t for t in suite if t.instance_id not in held], [t for t in suite if t.instance_id in held]


def from_directories(config: ml_collections.ConfigDict) -> tuple[list, list]:
    """(train, held-out) tasks for `--config.env.tasks=DIR` (module docstring)."""
    suite = load(config.env.tasks)
    if not config.eval.tasks:
        train, heldout = split(suite, config.env.n_heldout_tasks)
        logging.info(
            "DATA: suite %s: %d train tasks, %d held out (by instance-id digest)",
            config.env.tasks,
            len(train),
            len(heldout),
        )
        return train, heldout
    heldout = load(config.eval.tasks)
    shared = {t.instance_id for t in suite} & {t.instance_id for t in heldout}
    if shared:
        logging.warning(
            "DATA: %d of the %d held-out tasks in %s are also train tasks in %s",
            len(shared),
            len(heldout),
            config.eval.tasks,
            config.env.tasks,
        )
    logging.info("DATA: train suite %s (%d tasks), held-out suite %s (%d tasks)", config.env.tasks,
                 len(suite), config.eval.tasks, len(heldout))  # fmt: skip
    return suite, heldout
