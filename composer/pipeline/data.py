"""DATA: the task suite (train and held-out splits), expert trajectories for SFT, and the tokenizer.

Outputs in the workdir: tasks/{train,heldout}/ (with a DONE marker once complete), sft_data.jsonl (one
expert trajectory per line, solved ones only) and tokenizer.json.
"""

import concurrent.futures
import dataclasses
import json
import multiprocessing
import time
from pathlib import Path

import ml_collections
from absl import logging
from tqdm import tqdm

from composer import chat
from composer.pipeline import rollouts
from composer.tokenizer import Tokenizer, train_tokenizer
from env import tasks as env_tasks


@dataclasses.dataclass
class Data:
    train_tasks: list
    heldout_tasks: list
    tokenizer: Tokenizer
    trajectories: list[list[chat.Message]]
    # The expert on the first eval.next_call_tasks held-out tasks: prefixes for next-call accuracy (EVAL).
    heldout_expert: list[list[chat.Message]] = dataclasses.field(default_factory=list)


def _suite(out: Path, count: int, seed: int, difficulty: int, split: str) -> list:
    done = out / "DONE"
    if done.exists():
        return env_tasks.load_suite(out)
    t0 = time.time()
    logging.info("DATA: generating %d %s tasks (difficulty %d) in %s", count, split, difficulty, out)
    suite = env_tasks.generate_suite(out, count, seed, difficulty, split)
    done.write_text(json.dumps({"count": len(suite), "seconds": round(time.time() - t0, 1)}))
    return suite


def _solve(task_dir: str) -> tuple[str, float, list[dict]]:
    from env import expert

    traj = expert.solve(env_tasks.load_task(Path(task_dir)))
    return traj.family, traj.reward, [chat.message_to_dict(m) for m in traj.messages]


def _trajectories(path: Path, tasks: list, n: int, workers: int, split: str) -> list[list[chat.Message]]:
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
            for family, reward, messages in ex.map(_solve, chosen):
                bar.update()
                if reward == 1.0:
                    solved += 1
                    f.write(json.dumps({"family": family, "messages": messages}) + "\n")
        logging.info("DATA: the expert solved %d of %d %s tasks", solved, len(chosen), split)
        tmp.rename(path)
    lines = path.read_text().splitlines()
    return [[chat.message_from_dict(m) for m in json.loads(x)["messages"]] for x in lines]


def _corpus(trajectories: list[list[chat.Message]], tasks: list) -> list[str]:
    texts = [chat.render_text(t) for t in trajectories]
    for task in tasks:
        texts.extend(p.read_text() for p in sorted(task.repo.rglob("*.py")))
    return texts


def _with_system(trajectories: list[list[chat.Message]], system: chat.Message) -> list[list[chat.Message]]:
    """The trajectories with the system turn the episodes will see (the expert's may differ in form)."""
    return [[system, *t[1:]] if t and t[0].role == "system" else [system, *t] for t in trajectories]


def prepare(config: ml_collections.ConfigDict, workdir: Path) -> Data:
    """Builds (or loads, when already in the workdir) the tasks, trajectories and tokenizer."""
    env = config.env
    train = _suite(workdir / "tasks" / "train", env.n_train_tasks, config.seed, env.difficulty, "train")
    heldout = _suite(
        workdir / "tasks" / "heldout", env.n_heldout_tasks, config.seed, env.difficulty, "heldout"
    )
    n = min(config.sft.n_trajectories, len(train))
    trajectories = _trajectories(workdir / "sft_data.jsonl", train, n, env.n_workers, "train")
    trajectories = _with_system(trajectories, rollouts.system_prompt(config))
    if not trajectories:
        raise RuntimeError("DATA: the expert solved no task, so there is nothing to learn from")
    n_probe = min(config.eval.next_call_tasks, len(heldout))
    heldout_expert = _with_system(
        _trajectories(workdir / "heldout_expert.jsonl", heldout, n_probe, env.n_workers, "held-out")
        if n_probe
        else [],
        rollouts.system_prompt(config),
    )
    tok_path = workdir / "tokenizer.json"
    if config.model.init_from:
        from composer.checkpoints import pretrained_tokenizer

        tokenizer = pretrained_tokenizer(config)  # a pretrained model keeps its own vocabulary
    elif tok_path.exists():
        tokenizer = Tokenizer.load(tok_path)
    else:
        t0 = time.time()
        tokenizer = train_tokenizer(_corpus(trajectories, train[:50]), config.model.vocab_size)
        tokenizer.save(tok_path)
        logging.info("DATA: tokenizer (vocab %d) trained in %.1f s", tokenizer.vocab_size, time.time() - t0)
    return Data(train, heldout, tokenizer, trajectories, heldout_expert)
