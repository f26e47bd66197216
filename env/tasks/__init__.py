"""Tasks: the on-disk format (task.py), the procedural generator of bug-fix tasks (generator.py) and its
building blocks (domains.py: code templates; families.py: bug families; probe.py: running generated code;
diffs.py: unified diffs). `python -m env.tasks` is the command line (generate, grade, solve)."""

from env.tasks.families import FAMILIES, parse_families
from env.tasks.generator import (
    HELDOUT_SEEDS,
    SPLITS,
    TRAIN_SEEDS,
    generate_suite,
    generate_task,
    split_of,
    split_seed,
    suite_seeds,
    verify,
)
from env.tasks.task import Task, TaskError, load_suite, load_task, save_task

__all__ = [
    "FAMILIES",
    "HELDOUT_SEEDS",
    "SPLITS",
    "TRAIN_SEEDS",
    "Task",
    "TaskError",
    "generate_suite",
    "generate_task",
    "load_suite",
    "load_task",
    "parse_families",
    "save_task",
    "split_of",
    "split_seed",
    "suite_seeds",
    "verify",
]
