"""DATA: the task suite (train and held-out splits), expert trajectories for SFT, and the tokenizer.

Outputs in the workdir: tasks/{train,heldout}/ (with a DONE marker once complete), sft_data.jsonl (one
expert trajectory per line, solved ones only, with the task's instance id), heldout_expert.jsonl (the same
for the first eval.next_call_tasks held-out tasks) and tokenizer.json.
"""

import collections
import concurrent.futures
import dataclasses
import json
import multiprocessing
import re
import time
from pathlib import Path

import ml_collections
from absl import logging
from tqdm import tqdm

from composer.pipeline import rollouts
from env import chat
from env import tasks as env_tasks
from env.tokenizer import Tokenizer, train_tokenizer


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
    """The `split` ('train' or 'heldout') suite: env.n_train_tasks or env.n_heldout_tasks tasks of
    env.families, generated once into workdir/tasks/<split> (a DONE marker once complete) and loaded after;
    in seed order either way, so a larger suite of the same seed begins with the smaller one's tasks."""
    out = workdir / "tasks" / split
    done = out / "DONE"
    if done.exists():
        return _seed_order(env_tasks.load_suite(out))
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
    return _seed_order(suite)


def _seed_order(suite: list) -> list:
    """The tasks by generator seed. The generator returns them so, load_suite by directory name; a resumed
    run must see the same list (RL's task stream, SFT's first sft.n_trajectories and EVAL's first
    eval.n_tasks index it), and raising env.n_train_tasks must keep the tasks SFT had."""
    return sorted(suite, key=lambda t: (t.metadata["seed"], t.instance_id))


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


def _solve(task_dir: str) -> tuple[str, str, float, list[dict]]:
    from env import expert

    task = env_tasks.load_task(Path(task_dir))
    traj = expert.solve(task)
    messages = fixed_test_times(traj.messages)
    return task.instance_id, traj.family, traj.reward, [chat.message_to_dict(m) for m in messages]


def _trajectories(
    path: Path, tasks: list, n: int, workers: int, split: str
) -> list[tuple[str | None, list[chat.Message]]]:
    """(task instance id, messages) of the expert's solved trajectories on tasks[:n], collected once into
    `path`. The id is None in files written before it was recorded."""
    if not path.exists():
        chosen = [str(t.path) for t in tasks[:n]]
        tmp = path.with_suffix(".tmp")
        solved = 0
        ctx = multiprocessing.get_context("spawn")
        with (
            concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex,
            tmp.open("w") as f,
            tqdm(total=len(chosen), desc=f"DATA: expert on {split} tasks", unit="task") as bar,
        ):
            for instance_id, family, reward, messages in ex.map(_solve, chosen):
                bar.update()
                if reward == 1.0:
                    solved += 1
                    record = {"instance_id": instance_id, "family": family, "messages": messages}
                    f.write(json.dumps(record) + "\n")
        logging.info("DATA: the expert solved %d of %d %s tasks", solved, len(chosen), split)
        tmp.rename(path)
    records = [json.loads(x) for x in path.read_text().splitlines()]
    return [(r.get("instance_id"), [chat.message_from_dict(m) for m in r["messages"]]) for r in records]


def _corpus(trajectories: list[list[chat.Message]], tasks: list) -> list[str]:
    texts = [chat.render_text(t) for t in trajectories]
    for task in tasks:
        texts.extend(p.read_text() for p in sorted(task.repo.rglob("*.py")))
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
    env = config.env
    train = task_suite(config, workdir, "train")
    heldout = task_suite(config, workdir, "heldout")
    n = min(config.sft.n_trajectories, len(train))
    solved = _trajectories(workdir / "sft_data.jsonl", train, n, env.n_workers, "train")
    system = rollouts.system_prompt(config)
    trajectories = _with_system([m for _, m in solved], system)
    by_task = _by_task(solved, trajectories, train)
    if not trajectories:
        raise RuntimeError("DATA: the expert solved no task, so there is nothing to learn from")
    n_probe = min(config.eval.next_call_tasks, len(heldout))
    heldout_expert = []
    if n_probe:
        probe = _trajectories(workdir / "heldout_expert.jsonl", heldout, n_probe, env.n_workers, "held-out")
        heldout_expert = _with_system([m for _, m in probe], system)
    tok_path = workdir / "tokenizer.json"
    if config.model.init_from:
        from composer.checkpoints import pretrained_tokenizer

        tokenizer = pretrained_tokenizer(config)  # a pretrained model keeps its own vocabulary
    elif tok_path.exists():
        tokenizer = Tokenizer.load(tok_path)
    else:
        t0 = time.time()
        tokenizer = train_tokenizer(
            _corpus(trajectories, train[:50]), config.model.vocab_size, config.model.split_closing_quotes
        )
        tokenizer.save(tok_path)
        logging.info("DATA: tokenizer (vocab %d) trained in %.1f s", tokenizer.vocab_size, time.time() - t0)
    return Data(train, heldout, tokenizer, trajectories, heldout_expert, by_task)
