"""DATA: the task suite (train and held-out splits), trajectories for SFT, and the tokenizer.

The tasks are generated, or with env.tasks a suite directory's (composer/pipeline/suites.py). A trajectory
is the scripted expert's on a generated task, the gold patch's (composer/pipeline/gold.py) on any other.

Outputs in the workdir: tasks/{train,heldout}/ for generated tasks (with a DONE marker once complete),
sft_data.jsonl (one trajectory per line, solved ones only, with the task's instance id and its source),
heldout_expert.jsonl (the same for the first eval.next_call_tasks held-out tasks) and tokenizer.json.
"""

import collections
import concurrent.futures
import dataclasses
import itertools
import json
import multiprocessing
import re
import time
from pathlib import Path

import ml_collections
from absl import logging
from tqdm import tqdm

from composer.pipeline import gold, learner, rollouts, suites
from env import chat
from env import tasks as env_tasks
from env.tokenizer import Tokenizer
from env.tools import offered_tools


@dataclasses.dataclass
class Data:
    train_tasks: list
    heldout_tasks: list
    tokenizer: Tokenizer
    trajectories: list[list[chat.Message]]
    # The expert on the first eval.next_call_tasks held-out tasks: prefixes for next-call accuracy (EVAL).
    heldout_expert: list[list[chat.Message]] = dataclasses.field(default_factory=list)
    # The train trajectories by task instance id (RL may start episodes from their prefixes).
    expert_by_task: dict[str, list[chat.Message]] = dataclasses.field(default_factory=dict)


def task_families(config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The bug families of env.families (comma-separated; empty: all of them), checked by name."""
    try:
        return env_tasks.parse_families(config.env.families)
    except ValueError as e:
        raise ValueError(f"env.families: {e}") from None


def task_suite(config: ml_collections.ConfigDict, workdir: Path, split: str) -> list:
    """The `split` ('train' or 'heldout') tasks in suite order (composer/pipeline/suites.py): with
    env.tasks, that suite's (suites.from_directories); else env.n_train_tasks or env.n_heldout_tasks
    generated tasks of env.families, written once into workdir/tasks/<split> (a DONE marker once complete)
    and loaded after, so that a larger suite of the same seed begins with the smaller one's tasks."""
    if config.env.tasks:
        train, heldout = suites.from_directories(config)
        return train if split == "train" else heldout
    out = workdir / "tasks" / split
    done = out / "DONE"
    if done.exists():
        return suites.suite_order(env_tasks.load_suite(out))
    env = config.env
    count = env.n_train_tasks if split == "train" else env.n_heldout_tasks
    families = task_families(config)
    t0 = time.time()
    which = f" of families {', '.join(families)}" if families else ""
    logging.info(
        "DATA: generating %d %s tasks%s (difficulty %d) in %s", count, split, which, env.difficulty, out
    )
    with tqdm(total=count, desc=f"DATA: {split} tasks", unit="task") as bar:
        suite = env_tasks.generate_suite(
            out,
            count,
            config.seed,
            env.difficulty,
            split,
            progress=lambda *_: bar.update(),
            families=families,
            workers=env.n_workers,
        )
    done.write_text(json.dumps({"count": len(suite), "seconds": round(time.time() - t0, 1)}))
    return suites.suite_order(suite)


def _splits(config: ml_collections.ConfigDict, workdir: Path) -> tuple[list, list]:
    if config.env.tasks:
        return suites.from_directories(config)
    return task_suite(config, workdir, "train"), task_suite(config, workdir, "heldout")


# pytest's closing line ("2 failed, 8 passed in 0.05s"), whose wall time is the one part of an expert
# trajectory that differs between two runs of one seed.
_PYTEST_OUTCOME = r"\d+ (?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|rerun)"
_PYTEST_TIME = re.compile(
    rf"\b((?:{_PYTEST_OUTCOME}, )*{_PYTEST_OUTCOME}) in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?"
)
RECORDED_PYTEST_TIME = "0.05s"


def fixed_test_times(messages: list[chat.Message]) -> list[chat.Message]:
    """The messages with pytest's wall time in tool results set to RECORDED_PYTEST_TIME.

    SFT is deterministic given its data (two 20-step runs on one DATA output: the same loss to the last
    bit), but the expert's trajectories were not: two runs of one seed differed in 546 of 600 of them, all
    in pytest's timing. Those few tokens were enough to make each run's SFT model a new draw, 121 to 178
    of 200 held-out tasks. With them fixed, one seed gives one SFT model. Only the recorded trajectories
    change; episodes see pytest's real output."""
    out = []
    for m in messages:
        if m.role == "tool" and m.content:
            m = dataclasses.replace(m, content=_PYTEST_TIME.sub(rf"\1 in {RECORDED_PYTEST_TIME}", m.content))
        out.append(m)
    return out


def expert_plans(task) -> bool:
    """Whether the scripted expert can plan `task`: a generated task, whose metadata holds the call chain
    down to the bug and the test the report shows (env/expert.py)."""
    bug = task.metadata.get("bug")
    return isinstance(bug, dict) and "chain" in bug and "shown_test" in task.metadata


def _solve(
    task_dir: str, tools: tuple[str, ...] | None, isolation: str
) -> tuple[str, str, float, list[dict]]:
    """(instance id, source, reward, messages) of a task's recorded trajectory: the scripted expert's on a
    generated task, else the gold patch's (composer/pipeline/gold.py); source 'expert', 'gold', or
    'none: <why>' (reward 0, no messages) where there is neither."""
    from env import expert

    task = env_tasks.load_task(Path(task_dir))
    if expert_plans(task):
        traj, source = expert.solve(task, isolation=isolation), "expert"
    elif (reason := gold.applicable(task, tools)) is None:
        traj, source = gold.solve(task, tools=tools, isolation=isolation), "gold"
    else:
        return task.instance_id, f"none: {reason}", 0.0, []
    messages = fixed_test_times(traj.messages)
    return task.instance_id, source, traj.reward, [chat.message_to_dict(m) for m in messages]


def _trajectories(
    path: Path, tasks: list, n: int, config: ml_collections.ConfigDict, split: str
) -> list[tuple[str | None, list[chat.Message]]]:
    """(task instance id, messages) of the solved trajectories on tasks[:n] (the expert's or the gold
    patch's, `_solve`), collected once into `path`. The id is None in files written before it was
    recorded."""
    if not path.exists():
        chosen = [str(t.path) for t in tasks[:n]]
        tools, isolation = offered_tools(config.env.tools), config.env.isolation
        tmp = path.with_suffix(".tmp")
        tried, solved = collections.Counter(), collections.Counter()
        ctx = multiprocessing.get_context("spawn")
        with (
            concurrent.futures.ProcessPoolExecutor(config.env.n_workers, mp_context=ctx) as ex,
            tmp.open("w") as f,
            tqdm(total=len(chosen), desc=f"DATA: trajectories on {split} tasks", unit="task") as bar,
        ):
            runs = ex.map(_solve, chosen, itertools.repeat(tools), itertools.repeat(isolation))
            for instance_id, source, reward, messages in runs:
                bar.update()
                tried[source] += 1
                if reward == 1.0:
                    solved[source] += 1
                    record = {"instance_id": instance_id, "source": source, "messages": messages}
                    f.write(json.dumps(record) + "\n")
        counts = [f"{source} {solved[source]} of {n}" for source, n in sorted(tried.items())]
        logging.info("DATA: solved %s tasks by source: %s", split, "; ".join(counts))
        tmp.rename(path)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    return [(r.get("instance_id"), [chat.message_from_dict(m) for m in r["messages"]]) for r in records]


# The tokenizer's corpus takes the Python files of the first CORPUS_TASKS train tasks (a file shared by
# several tasks counts once per task, as it appears in their episodes), up to CORPUS_CHARS characters: a
# real repository is far larger than a generated one, whose corpus stays well under the cap.
CORPUS_TASKS = 50
CORPUS_CHARS = 20_000_000


def corpus(trajectories: list[list[chat.Message]], tasks: list) -> list[str]:
    """The tokenizer's training texts: the trajectories as the model sees them, and the tasks' code."""
    texts = [chat.render_text(t) for t in trajectories]
    size = 0
    for task in tasks[:CORPUS_TASKS]:
        for p in sorted(task.repo.rglob("*.py")):
            text = p.read_text(errors="replace")
            if size + len(text) > CORPUS_CHARS:
                return texts
            size += len(text)
            texts.append(text)
    return texts


def _with_system(trajectories: list[list[chat.Message]], system: chat.Message) -> list[list[chat.Message]]:
    """The trajectories with the system turn the episodes will see (the expert's may differ in form)."""
    return [[system, *t[1:]] if t and t[0].role == "system" else [system, *t] for t in trajectories]


def _by_task(solved: list, trajectories: list, tasks: list) -> dict[str, list[chat.Message]]:
    """Trajectories by task instance id; a record without one (older files) is matched by its bug report
    when exactly one task has that report."""
    by_statement = collections.defaultdict(list)
    for task in tasks:
        by_statement[task.problem_statement].append(task.instance_id)
    out = {}
    for (instance_id, messages), final in zip(solved, trajectories):
        if instance_id is None:
            report = next((m.content for m in messages if m.role == "user"), None)
            ids = by_statement.get(report, [])
            instance_id = ids[0] if len(ids) == 1 else None
        if instance_id is not None:
            out[instance_id] = final
    return out


def prepare(config: ml_collections.ConfigDict, workdir: Path) -> Data:
    """Builds (or loads, when already in the workdir) the tasks, trajectories and tokenizer."""
    train, heldout = _splits(config, workdir)
    n = min(config.sft.n_trajectories, len(train))
    solved = _trajectories(workdir / "sft_data.jsonl", train, n, config, "train")
    system = rollouts.system_prompt(config)
    trajectories = _with_system([m for _, m in solved], system)
    by_task = _by_task(solved, trajectories, train)
    if not trajectories and not config.env.tasks:
        raise RuntimeError("DATA: the expert solved no task, so there is nothing to learn from")
    if not trajectories:
        logging.warning(
            "DATA: no solved trajectory on the first %d train tasks of %s: SFT is skipped and RL starts "
            "from %s",
            n,
            config.env.tasks,
            config.model.init_from or "the random init",
        )
    n_probe = min(config.eval.next_call_tasks, len(heldout))
    heldout_expert = []
    if n_probe:
        probe = _trajectories(workdir / "heldout_expert.jsonl", heldout, n_probe, config, "held-out")
        heldout_expert = _with_system([m for _, m in probe], system)
    tok_path = workdir / "tokenizer.json"
    if config.model.init_from:
        from composer.checkpoints import pretrained_tokenizer

        tokenizer = pretrained_tokenizer(config)  # a pretrained model keeps its own vocabulary
    elif tok_path.exists():
        tokenizer = Tokenizer.load(tok_path)
    else:
        t0 = time.time()
        tokenizer = learner.fit_tokenizer(config, corpus(trajectories, train))
        tokenizer.save(tok_path)
        logging.info("DATA: tokenizer (vocab %d) trained in %.1f s", tokenizer.vocab_size, time.time() - t0)
    return Data(train, heldout, tokenizer, trajectories, heldout_expert, by_task)
