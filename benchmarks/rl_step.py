"""RL steps per minute and generated tokens/s of composer's RL phase, beside Tunix's GRPO step.

    python benchmarks/rl_step.py [--config=experiments/composer.py[:tiny]] [--steps 3] [--workdir RUN]
                                 [--sft-steps 10] [--peer-python /path/to/tunix/venv/bin/python]
                                 [--peer-script ../shared/peers/tunix/grpo_step_bench.py]
                                 [--baseline="--config.KEY=VALUE ..."]
                                 [--config.KEY=VALUE ...]

Ours: the RL phase of the config (`launch.py --mode=rl`) runs `--steps` steps in a scratch workdir, with
held-out evaluation during RL off. Its loop already times each step (composer/pipeline/rl.py): rollout_s
(from the previous step's end to a full batch of groups: sampler, tools, grading, dropped groups included)
and update_s (advantages, reference, learner step, the sampler's new weights); tokens_generated is what the
sampler generated in that time. These are read back from the scratch workdir's metrics.jsonl. A step's
time is step_s, the wall time from the previous step's end to its own (with rl.overlap_update its update
runs beside the next rollout, so rollout_s + update_s would count that time twice); steps/min and
tokens/s are given over all steps and over the steady ones (all but the first, which compiles or loads
the programs).

The starting model:
- `--workdir RUN` (a run whose SFT phase finished, with the same config): its tasks, tokenizer and SFT
  checkpoint are copied into the scratch workdir and RL starts from that SFT model, as in the real run.
- without it: DATA runs as configured and SFT is cut to `--sft-steps` steps. The policy is then barely
  trained, so its episodes (turns, lengths, tool calls) differ from a real run's: the update's cost holds,
  the rollout's is only indicative.

The peer: `grpo_step_bench.py` of ../shared/peers/tunix (its README; elsewhere: `--peer-script`) at its own
default shape, run with the Python of `--peer-python` (a venv with google-tunix; none: the peer is skipped),
after ours, never at the same time. Its tokens/s counts every completion at full length (an upper bound).

`--baseline="--config.KEY=VALUE ..."`: the loop before a change, as config overrides (e.g.
"--config.rl.overlap_update=False"): run first, from the same starting model, and reported as `before` with
`ours_over_before`. Beside steps/min it gives episodes and trained groups per minute, since a smaller step
is a faster one without the loop being any faster.

Extra `--config.KEY=VALUE` flags go to launch.py (both runs). The last line is one JSON object.
"""

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from composer.metrics import read_metrics  # noqa: E402

PEER = ROOT.parent / "shared" / "peers" / "tunix" / "grpo_step_bench.py"  # beside the project root
# What a finished run holds that the RL phase writes again: left out of the copy of `--workdir`.
_NOT_COPIED = ("metrics.jsonl", "tb", "summary.txt", "summary.json", "curves.png", "losses.png")


def _scratch(workdir: Path | None, root: Path) -> Path:
    """A workdir for the RL phase: a copy of `workdir` without its RL phase and metrics, or a new one."""
    out = root / "run"
    root.mkdir(parents=True, exist_ok=True)
    if workdir is None:
        return out

    def ignore(folder: str, names: list[str]) -> list[str]:
        here = Path(folder)
        skip = [n for n in names if here == workdir and (n in _NOT_COPIED or n.startswith("eval_rl"))]
        return skip + (["rl"] if here == workdir / "checkpoints" and "rl" in names else [])

    if not (workdir / "checkpoints" / "sft").is_dir():
        sys.exit(f"{workdir}: no checkpoints/sft (a workdir whose SFT phase finished is needed)")
    shutil.copytree(workdir, out, symlinks=True, ignore=ignore)
    return out


def _run_ours(args: argparse.Namespace, overrides: list[str], root: Path) -> list[dict]:
    workdir = _scratch(args.workdir, root)
    flags = [f"--config={args.config}", f"--workdir={workdir}", "--mode=rl"]
    flags += [f"--config.rl.steps={args.steps}", "--config.eval.every_steps=0"]
    if args.workdir is None:
        flags.append(f"--config.sft.steps={args.sft_steps}")
    log = root / "rl.log"
    print(f"{root.name}: launch.py {' '.join(flags + overrides)} (log {log})", flush=True)
    t0 = time.monotonic()
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "launch.py", *flags, *overrides],
            cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=f, stderr=subprocess.STDOUT,
        )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{root.name}: launch.py failed (rc {proc.returncode}):\n{log.read_text()[-4000:]}")
    steps = read_metrics(workdir, "rl")
    print(f"{root.name}: {len(steps)} RL steps, {time.monotonic() - t0:.0f} s with DATA and SFT", flush=True)
    for r in steps:
        print(
            f"  step {r['step']}: rollout {r['rollout_s']:.2f} s, update {r['update_s']:.2f} s, "
            f"{r['tokens_generated']:.0f} tokens generated, {r['episodes']:.0f} episodes",
            flush=True,
        )
    return steps


def _rates(steps: list[dict]) -> dict:
    """Per-step medians and rates over `steps` (records of metrics.jsonl's RL phase)."""
    rollout = sum(r["rollout_s"] for r in steps)
    update = sum(r["update_s"] for r in steps)
    tokens = sum(r["tokens_generated"] for r in steps)
    # A step's wall time: step_s where the loop logs it (with rl.overlap_update the update runs during the
    # next step's rollout, so the two no longer add up), else rollout_s + update_s.
    wall = sum(r["step_s"] for r in steps) if all("step_s" in r for r in steps) else rollout + update
    return {
        "steps": len(steps),
        "steps_per_min": round(60 * len(steps) / wall, 3),
        "generated_tokens_per_s": round(tokens / wall, 2),
        "rollout_tokens_per_s": round(tokens / rollout, 2),
        "rollout_s_median": round(statistics.median(r["rollout_s"] for r in steps), 3),
        "update_s_median": round(statistics.median(r["update_s"] for r in steps), 3),
        "step_s_median": round(
            statistics.median(r.get("step_s", r["rollout_s"] + r["update_s"]) for r in steps), 3
        ),
        "rollout_share": round(rollout / (rollout + update), 3),
        "tokens_generated_per_step": round(tokens / len(steps), 1),
        "episodes_per_step": round(sum(r["episodes"] for r in steps) / len(steps), 1),
        # A smaller step is a faster one: the episodes run and the groups trained on per minute say
        # whether the loop as a whole got faster.
        "episodes_per_min": round(60 * sum(r["episodes"] for r in steps) / wall, 2),
        "groups_trained_per_min": round(60 * sum(r.get("groups_trained", math.nan) for r in steps) / wall, 2),
    }


def _measure(args: argparse.Namespace, overrides: list[str], root: Path) -> dict:
    """Our RL phase's rates over all its steps and over the steady ones (all but the first)."""
    steps = _run_ours(args, overrides, root)
    out = {"all": _rates(steps)}
    if len(steps) > 1:
        out["steady"] = _rates(steps[1:])
    return out


def _run_peer(python: str, script: Path, root: Path) -> dict:
    out = root / "peer.json"
    print(f"peer: {python} {script} --json {out} (its default shape)", flush=True)
    proc = subprocess.run(
        [python, str(script), "--json", str(out)], cwd=script.parent, capture_output=True, text=True
    )
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"peer failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    res = json.loads(out.read_text())
    phases = res["phase_median_s"]
    print(
        f"peer: {res['s_per_step']:.3f} s per step (rollout {phases['rollout']} s, reference "
        f"{phases['ref_logps']} s, update {phases['actor_update']} s), "
        f"{res['generated_tokens_per_s']} generated tokens/s",
        flush=True,
    )
    return {
        "model": f"{res['model_family']}, {res['n_params']:,} parameters",
        "sequences_per_step": res["sequences_per_step"],
        "prompt_len": res["prompt_len"],
        "new_tokens": res["new_tokens"],
        "steps": res["timed_steps"],
        "steps_per_min": round(60 / res["s_per_step"], 3),
        "generated_tokens_per_s": res["generated_tokens_per_s"],
        "rollout_s_median": phases["rollout"],
        "ref_logps_s_median": phases["ref_logps"],
        "update_s_median": phases["actor_update"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="experiments/composer.py")
    p.add_argument("--steps", type=int, default=3, help="RL steps to run and time")
    p.add_argument(
        "--workdir", type=Path, default=None, help="a run whose SFT finished: start from its model"
    )
    p.add_argument("--sft-steps", type=int, default=10, help="without --workdir: SFT cut to this many steps")
    p.add_argument("--peer-python", default=None, help="Python with google-tunix (none: skip the peer)")
    p.add_argument("--peer-script", type=Path, default=PEER)
    p.add_argument(
        "--baseline", default=None,
        help="config overrides of the loop to compare with, as --baseline='--config.KEY=VALUE ...': run "
        "first, from the same starting model, as 'before'",
    )  # fmt: skip
    args, overrides = p.parse_known_args()
    bad = [o for o in overrides if not o.startswith("--config.")]
    if bad:
        p.error(f"unknown arguments {bad} (only --config.KEY=VALUE pass through to launch.py)")
    if args.workdir is not None:
        args.workdir = args.workdir.resolve()
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="rl_step-") as tmp:
        before = None
        if args.baseline is not None:
            before = _measure(args, overrides + shlex.split(args.baseline), Path(tmp) / "before")
        ours = _measure(args, overrides, Path(tmp) / "ours")
        if args.peer_python:
            peer = _run_peer(args.peer_python, args.peer_script, Path(tmp))
        else:
            peer = None
            print("peer: skipped (no --peer-python)", flush=True)

    best = ours.get("steady", ours["all"])
    summary = {
        "benchmark": "rl_step",
        "config": args.config,
        "overrides": overrides,
        "start": str(args.workdir) if args.workdir else f"fresh DATA, SFT cut to {args.sft_steps} steps",
        "ours": ours,
        "before": before and {"overrides": shlex.split(args.baseline), **before},
        "peer": peer,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    if before is not None:
        base = before.get("steady", before["all"])
        keys = ("steps_per_min", "generated_tokens_per_s", "episodes_per_min", "groups_trained_per_min")
        summary["ours_over_before"] = {k: round(best[k] / base[k], 3) for k in keys}
        print(f"ours / before: {summary['ours_over_before']}", flush=True)
    if peer is not None:
        summary["ours_over_peer"] = {
            k: round(best[k] / peer[k], 3) for k in ("steps_per_min", "generated_tokens_per_s")
        }
        print(
            f"ours ({'steady' if 'steady' in ours else 'all'} steps) / peer: steps/min "
            f"{summary['ours_over_peer']['steps_per_min']}x, generated tokens/s "
            f"{summary['ours_over_peer']['generated_tokens_per_s']}x",
            flush=True,
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
