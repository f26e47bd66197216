"""The modes of launch.py that run the main job: the whole pipeline, or one phase of it."""

import json
import math
import time
from pathlib import Path

import ml_collections
from absl import logging

from composer.metrics import MetricsWriter, plot_curves
from composer.pipeline import curve, headroom, isolation, rl, sft
from composer.pipeline import data as data_lib
from composer.pipeline.evaluate import evaluate
from composer.pipeline.next_call import TURN_KEY

SUMMARY_ROWS = (
    ("held-out solve rate", "solve_rate", "{:.1%}"),
    ("patch similarity to gold", "patch_similarity", "{:.3f}"),
    ("mean turns", "mean_turns", "{:.2f}"),
    ("tool calls per episode", "tool_calls_per_episode", "{:.2f}"),
    ("tool-call error rate", "tool_error_rate", "{:.1%}"),
    ("turns with parallel calls", "parallel_turn_share", "{:.1%}"),
    ("episodes with an edit call", "edited_share", "{:.1%}"),
    ("  of those, searched/read first", "searched_before_edit_share", "{:.1%}"),
    ("truncated episodes", "truncated_share", "{:.1%}"),
    ("  by the turn limit", "truncated_turns_share", "{:.1%}"),
    ("  by the token limit", "truncated_tokens_share", "{:.1%}"),
    ("  by the time limit", "truncated_time_share", "{:.1%}"),
    ("tokens/s (sampler)", "tokens_per_s", "{:.0f}"),
    ("next call right (expert prefix)", "next_call_accuracy", "{:.1%}"),
)


def sign_test(a: int, b: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of `a` against `b` discordant pairs: the chance of a
    split at least this uneven when each pair is a fair coin."""
    n = a + b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(a, b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def time_cut(stats: dict) -> set[str]:
    """The tasks whose episode in this evaluation was cut by the wall-clock limit."""
    return {t for t, limit in stats.get("truncations", {}).items() if limit == "time"}


def compared_tasks(before: dict, after: dict) -> tuple[set[str], set[str]] | None:
    """(tasks compared, tasks left out) of two evaluations with per-task rewards; None when either lacks
    them (written before they were recorded).

    The tasks compared are those both were scored on, less those either episode of which was cut by the
    wall-clock limit (left out): that limit fires when the machine is busy, so it can differ between two
    evaluations of one model, and counting it would credit or blame a model for the load it ran under.
    """
    if "rewards" not in before or "rewards" not in after:
        return None
    common = before["rewards"].keys() & after["rewards"].keys()
    left_out = common & (time_cut(before) | time_cut(after))
    return common - left_out, left_out


def flips(before: dict, after: dict) -> tuple[int, int] | None:
    """(tasks solved by `before` only, by `after` only) among compared_tasks; None without per-task
    rewards."""
    compared = compared_tasks(before, after)
    if compared is None:
        return None
    tasks, _ = compared
    solved_before = {t for t in tasks if before["rewards"][t] == 1.0}
    solved_after = {t for t in tasks if after["rewards"][t] == 1.0}
    return len(solved_before - solved_after), len(solved_after - solved_before)


def summary_table(before: dict, after: dict, pass_k: dict | None = None) -> str:
    """The SFT and RL models side by side: EVAL's rows, the sign test of their solved tasks and, with
    `pass_k` (headroom.measure of the SFT model), the sampled pass@1 and pass@k RL starts from."""
    lines = [f"{'':32} {'SFT':>10} {'SFT+RL':>10}"]
    for title, key, fmt in SUMMARY_ROWS:
        if key not in before or key not in after:  # next-call accuracy is off with eval.next_call_tasks=0
            continue
        lines.append(f"{title:32} {fmt.format(before[key]):>10} {fmt.format(after[key]):>10}")
    lines.append(f"{'held-out episodes':32} {before['episodes']:>10} {after['episodes']:>10}")
    compared = compared_tasks(before, after)
    if compared is not None:
        tasks, left_out = compared
        if left_out:
            lines.append(f"{'  time-limit cuts, left out':32} {len(left_out):>21}")
            rates = [sum(d["rewards"][t] == 1.0 for t in tasks) / max(len(tasks), 1) for d in (before, after)]
            title = f"  solve rate on the other {len(tasks)}"
            lines.append(f"{title:32} {rates[0]:>10.1%} {rates[1]:>10.1%}")
        # The solve rates' difference is the difference of these two counts; whether it is more than noise
        # depends on them alone, hence the test.
        lost, gained = flips(before, after)
        lines.append(f"{'  solved by this model only':32} {lost:>10} {gained:>10}")
        lines.append(f"{'  sign test, p (two-sided)':32} {sign_test(lost, gained):>21.3f}")
    if pass_k:
        n, k = pass_k["pass_k_tasks"], pass_k["pass_k"]
        lines.append(f"{f'sampled pass@1, first {n} tasks':32} {pass_k['sampled_pass_at_1']:>10.1%}")
        lines.append(f"{f'sampled pass@{k}, first {n} tasks':32} {pass_k['pass_at_k']:>10.1%}")
    turns = sorted(int(k.removeprefix(TURN_KEY)) for k in before if k.startswith(TURN_KEY))
    for title, d in (("SFT", before), ("SFT+RL", after)) if turns else ():
        cells = (f"{t}:{d[TURN_KEY + str(t)]:.0%}" if TURN_KEY + str(t) in d else f"{t}:-" for t in turns)
        lines.append(f"next call right by turn, {title}: {' '.join(cells)}")
    return "\n".join(lines)


def _phase(name: str) -> None:
    logging.info("==== %s", name)
    print(f"==== {name}", flush=True)


def run_pipeline(config: ml_collections.ConfigDict, workdir: Path, only: str | None = None) -> dict | None:
    """DATA -> SFT -> EVAL -> RL -> EVAL -> SUMMARY (or just phase `only`: data | sft | rl | eval)."""
    t0 = time.time()
    isolation.settle(config, workdir)  # before DATA records anything a tool returned
    writer = MetricsWriter(workdir)
    try:
        _phase("DATA")
        data = data_lib.prepare(config, workdir)
        if only == "data":
            return None
        _phase("SFT")
        sft_params, cfg = sft.run(config, workdir, data, writer)
        if only == "sft":
            return None
        if only != "rl":
            _phase("EVAL (SFT model)")
            before = evaluate(config, sft_params, cfg, data.tokenizer, data.heldout_tasks,
                              out=workdir / "eval_sft.json", expert=data.heldout_expert)  # fmt: skip
            subset = curve.tasks(config, data.heldout_tasks)
            writer.write("eval", 0, {**before, **curve.from_eval(before, subset)})
            sft_pass_k = headroom.measure(config, sft_params, cfg, data.tokenizer, data.heldout_tasks,
                                          out=workdir / "eval_sft_pass_k.json")  # fmt: skip
            if sft_pass_k:
                writer.write("eval", 0, sft_pass_k)
        rl_step, rl_out = config.rl.steps, workdir / "eval_rl.json"
        if only == "eval":
            # Evaluation never trains: the RL model is the latest RL checkpoint, if there is one. One taken
            # before the last step is scored into its own file (eval_rl.json is the finished phase's).
            rl_step = rl.latest_step(config, workdir)
            if rl_step is None:
                logging.info("EVAL: no RL checkpoint in %s yet: the SFT model is all there is", workdir)
                return {"sft": before}
            if rl_step < config.rl.steps:
                rl_out = workdir / f"eval_rl_step{rl_step}.json"
        else:
            _phase("RL")
        rl_params = rl.run(
            config, workdir, data, writer, sft_params, cfg, data.tokenizer, restore_only=only == "eval"
        )
        if only == "rl":
            return None
        _phase("EVAL (RL model)")
        after = evaluate(
            config, rl_params, cfg, data.tokenizer, data.heldout_tasks, out=rl_out, expert=data.heldout_expert
        )
        writer.write(
            "eval", rl_step, {**after, **curve.from_eval(after, curve.tasks(config, data.heldout_tasks))}
        )
    finally:
        writer.close()
    curves = {
        "RL reward": ("rl", "reward_all"),
        "held-out solve rate": ("eval", "solve_rate"),
        "held-out solve rate, fixed subset": ("eval", curve.KEY),
        "held-out patch similarity": ("eval", "patch_similarity"),
    }
    plot_curves(workdir, curves, "curves.png")
    plot_curves(workdir, {"SFT loss": ("sft", "loss"), "RL loss": ("rl", "loss")}, "losses.png")
    table = summary_table(before, after, sft_pass_k)
    wall = time.time() - t0
    text = f"{table}\n\nwall time {wall / 60:.1f} min (this invocation), workdir {workdir}"
    (workdir / "summary.txt").write_text(text + "\n")
    summary = {"sft": before, "sft_pass_k": sft_pass_k, "rl": after, "wall_s": wall}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    _phase("SUMMARY")
    print(text, flush=True)
    return {"sft": before, "rl": after}
