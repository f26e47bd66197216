"""EVAL on any suite: `--mode=eval --config.eval.tasks=DIR`.

The model is the run's latest checkpoint in the workdir (RL's, else SFT's), else model.init_from, else the
random init of config.seed; a log line says which. Each of the suite's first eval.n_tasks tasks (in
suites.suite_order) gets eval.samples_per_task episodes from its bug report at eval.temperature, graded.

Outputs in workdir/eval_suites/<suite directory name>-<model>/ (model: rl_step<N>, sft_step<N>,
init_from or random_init; rewritten by each run): results.json (the summary below with the episode
statistics, the model and the suite), tasks.jsonl (per task: its samples' rewards) and episodes.jsonl
(evaluate.episode_record of every episode, with its sample index). The last line printed to stdout is the
summary, one JSON object:

    {"tasks": N, "solved": K, "solve_rate": K / N, "pass_at_k": {"1": ..., "2": ..., ...}}

where a task is solved when any of its samples is, and pass@k (k = 1 and the powers of 2 up to
eval.samples_per_task) is the unbiased estimator over each task's samples (`pass_at_k`). With one sample a
task, solve_rate and pass@1 are the same number. An episode that could not be run (reward None) counts as
unsolved, and the summary's log line counts them.
"""

import collections
import json
import math
import time
from pathlib import Path

import jax
import ml_collections
from absl import logging

from composer import sharding
from composer.pipeline import evaluate, isolation, learner, rl, rollouts, sft, suites
from env import chat
from env.tokenizer import Tokenizer


def check(config: ml_collections.ConfigDict) -> None:
    """The eval keys that would otherwise fail after the model is built."""
    n = config.eval.samples_per_task
    if n < 1:
        raise ValueError(f"eval.samples_per_task must be at least 1, got {n}")
    if n > 1 and config.eval.temperature <= 0:
        raise ValueError(
            f"eval.samples_per_task={n} needs eval.temperature > 0: greedy samples of a task are all the "
            "same episode (e.g. --config.eval.temperature=0.6)"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k samples drawn without replacement from n, of which c are
    correct, is correct: 1 - C(n - c, k) / C(n, k) (the unbiased pass@k estimator, Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1), as a product for numerical stability."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks(n: int) -> list[int]:
    """k = 1 and the powers of 2 up to n."""
    return [2**i for i in range(n.bit_length()) if 2**i <= n]


def summarize(rewards: dict[str, list[float | None]]) -> dict:
    """The summary line of per-task sample rewards (every task the same number of samples)."""
    n = len(next(iter(rewards.values()), []))
    correct = {t: sum(r == 1.0 for r in rs) for t, rs in rewards.items()}
    solved = sum(c > 0 for c in correct.values())
    pass_k = {str(k): sum(pass_at_k(n, c, k) for c in correct.values()) / max(len(rewards), 1) for k in ks(n)}
    return {"tasks": len(rewards), "solved": solved, "solve_rate": solved / max(len(rewards), 1),
            "pass_at_k": pass_k}  # fmt: skip


def _suite_tokenizer(config: ml_collections.ConfigDict, tasks: list, path: Path) -> Tokenizer:
    """A tokenizer for the random init with nothing in the workdir, kept at `path`: trained on the tasks'
    openings (system prompt and report) and Python files, as DATA's corpus (learner.fit_tokenizer keeps the
    assistant role one token, as the copy head's line keys need, though no trajectory here repeats it)."""
    if path.exists():
        return Tokenizer.load(path)
    from composer.pipeline.data import corpus

    system = rollouts.system_prompt(config)
    openings = [[system, chat.Message("user", t.problem_statement)] for t in tasks]
    tokenizer = learner.fit_tokenizer(config, corpus(openings, tasks))
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(path)
    return tokenizer


def load_model(config: ml_collections.ConfigDict, workdir: Path, tasks: list, scratch: Path):
    """(params, cfg, tokenizer, name) of the model to evaluate (module docstring): name is rl_step<N>,
    sft_step<N>, init_from or random_init. `scratch`: where a random init's tokenizer goes when the workdir
    has none."""
    init_params = None
    if config.model.init_from:
        from composer.checkpoints import load_pretrained

        init_params, cfg, tokenizer = load_pretrained(config)
    elif (workdir / "tokenizer.json").exists():
        tokenizer = Tokenizer.load(workdir / "tokenizer.json")
        cfg = learner.model_config(config, tokenizer)
    else:
        tokenizer = _suite_tokenizer(config, tasks, scratch / "tokenizer.json")
        cfg = learner.model_config(config, tokenizer)
    line_tokens = learner.line_tokens(cfg, tokenizer)
    if init_params is None:
        mesh = sharding.make_mesh(config.mesh)
        init_params = sharding.init_sharded(jax.random.key(config.seed), cfg, mesh, tuple(config.mesh.rules))
    rl_step = rl.latest_step(config, workdir)
    if rl_step is not None:
        params = rl.run(config, workdir, None, None, init_params, cfg, tokenizer, restore_only=True)
        logging.info("EVAL: the model is the RL checkpoint of step %d in %s", rl_step, workdir)
        return params, cfg, tokenizer, f"rl_step{rl_step}"
    restored = sft.restore_latest(config, workdir, cfg, line_tokens, init_params)
    if restored is not None:
        logging.info("EVAL: the model is the SFT checkpoint of step %d in %s", restored[1], workdir)
        return restored[0], cfg, tokenizer, f"sft_step{restored[1]}"
    if config.model.init_from:
        logging.info(
            "EVAL: no checkpoint in %s: the model is model.init_from %s", workdir, config.model.init_from
        )
        return init_params, cfg, tokenizer, "init_from"
    logging.info("EVAL: no checkpoint in %s and no model.init_from: the model is the random init (seed %d)",
                 workdir, config.seed)  # fmt: skip
    return init_params, cfg, tokenizer, "random_init"


def _write(out: Path, summary: dict, stats: dict, by_task: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "tasks.jsonl").open("w") as f:
        for task_id, rs in by_task.items():
            rewards = [r.reward for r in rs]
            f.write(json.dumps({"instance_id": task_id, "rewards": rewards,
                                "solved_samples": sum(x == 1.0 for x in rewards)}) + "\n")  # fmt: skip
    with (out / "episodes.jsonl").open("w") as f:
        for rs in by_task.values():
            for i, r in enumerate(rs):
                f.write(json.dumps(dict(evaluate.episode_record(r), sample=i)) + "\n")
    (out / "results.json").write_text(json.dumps(dict(summary, stats=stats), indent=1) + "\n")


def run(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """Evaluates the model (`load_model`) on the suite at eval.tasks; prints the summary line last and
    returns it."""
    check(config)
    isolation.settle(config, workdir)
    suite = suites.load(config.eval.tasks)
    tasks = suite[: config.eval.n_tasks]
    if len(tasks) < len(suite):
        logging.info("EVAL: the first %d of the suite's %d tasks (eval.n_tasks)", len(tasks), len(suite))
    name = Path(config.eval.tasks).expanduser().resolve().name
    params, cfg, tokenizer, model_name = load_model(config, workdir, tasks, workdir / "eval_suites" / name)
    out = workdir / "eval_suites" / f"{name}-{model_name}"
    n = config.eval.samples_per_task
    sampler = evaluate.eval_sampler(config, params, cfg, tokenizer)
    t0 = time.time()
    results = rollouts.one_episode_each(
        config, sampler, tokenizer, tasks, desc="EVAL", samples=n,
        postfix=lambda rs: {"solved": sum(r.reward or 0 for r in rs)},
    )  # fmt: skip
    by_task = collections.defaultdict(list)
    for r in sorted(results, key=lambda r: (r.group, r.member)):
        by_task[r.task_id].append(r)
    by_task = {t.instance_id: by_task[t.instance_id] for t in tasks}
    summary = summarize({t: [r.reward for r in rs] for t, rs in by_task.items()})
    stats = rollouts.episode_stats(results)
    stats.update(wall_s=time.time() - t0, model=model_name, suite=str(config.eval.tasks), samples_per_task=n,
                 temperature=config.eval.temperature)  # fmt: skip
    _write(out, summary, stats, by_task)
    errors = sum(r.reward is None for r in results)
    logging.info("EVAL: %d of %d tasks solved (%d episodes, %d not run); results in %s",
                 summary["solved"], summary["tasks"], len(results), errors, out)  # fmt: skip
    print(json.dumps(summary), flush=True)
    return summary
