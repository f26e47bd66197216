"""Episodes/s of the rollout loop with continuous batching against the synchronous baseline.

    python benchmarks/rollout.py [--episodes 48] [--slots 8] [--workers 2] [--seed 0]

The workload is uneven on purpose: each episode's number of turns, the tokens of each turn and the latency
of each tool call are drawn from heavy-tailed distributions (turns: 1 + Pareto; tokens: lognormal; tool
latency: lognormal), the same draws for both drivers.

What is real and what is simulated:
- REAL: the rollout pool (LocalPool worker processes), the sandboxes (the isolation the machine offers), the
  workspaces (a private copy of a generated task repo per episode), the tool call path (run_terminal_cmd),
  the episode state machine and its token stream, both drivers.
- SIMULATED: the model. `ScriptedEngine` stands in for the sampler: `--slots` decode slots, each decode step
  costs a fixed `--step-ms` of sleep whatever the occupancy (as a batched decode step on an accelerator) and
  emits one token per occupied slot; `--steps-per-call` steps per call; no prefill cost. Each turn's tokens
  are scripted: filler text and one run_terminal_cmd call.
- SIMULATED: the tool latency: the call is `sleep X` run through the real sandbox (X drawn per call).
- Grading is off by default (`--grade` turns it on): it costs the same in both drivers.

Baseline (`run_episodes_sync`): batches of `--slots` episodes; every turn waits for the slowest generation
and the slowest tool call of the batch; the next batch starts when the whole batch is done. Continuous
(`run_episodes`): up to `--active` episodes alive (default 2 x slots: episodes waiting on tools hold no
decode slot); a turn enters the engine as soon as its tool results are back.

The last line is one JSON object.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env import chat  # noqa: E402
from env import tokenizer as tk  # noqa: E402
from env.chat import ToolCall  # noqa: E402
from env.rollout import LocalPool, RolloutLimits, run_episodes, run_episodes_sync  # noqa: E402
from env.rollout.driver import default_prompt, episode_key  # noqa: E402
from env.rollout.engines import ScriptedEngine  # noqa: E402
from env.tasks import generate_suite  # noqa: E402


def _plan(key: str, seed: int, args: argparse.Namespace) -> list[tuple[int, float]]:
    """(tokens, tool latency in s) of each turn of the episode `key`; the last turn has no call (latency 0).

    turns = min(1 + floor(Pareto(alpha)), max_turns) (at least one turn with a call); tokens ~ lognormal;
    latency ~ lognormal, capped.
    """
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "little"))
    n_turns = min(1 + int(rng.paretovariate(args.turn_alpha)), args.max_turns)
    plan = []
    for t in range(n_turns):
        tokens = int(
            min(args.max_turn_tokens - 8, max(8, rng.lognormvariate(args.tokens_mu, args.tokens_sigma)))
        )
        latency = (
            0.0
            if t == n_turns - 1
            else min(args.latency_cap, rng.lognormvariate(args.latency_mu, args.latency_sigma))
        )
        plan.append((tokens, latency))
    return plan


def _script(tok: tk.Tokenizer, seed: int, args: argparse.Namespace):
    filler = tok.encode(" step")

    def turn(tokens: int, latency: float) -> list[int]:
        if latency > 0:
            call = ToolCall("run_terminal_cmd", {"command": f"sleep {latency:.3f}", "is_background": False})
            tail = tok.encode("\n" + chat.format_call(call) + chat.IM_END)
        else:
            tail = tok.encode(" done." + chat.IM_END)
        head = tok.encode("Working:")
        n = max(0, tokens - len(head) - len(tail))
        return head + (filler * (n // len(filler) + 1))[:n] + tail

    def script(request_id: str, prompt_ids) -> list[int]:
        plan = _plan(episode_key(request_id), seed, args)
        n = int(request_id.rsplit("@", 1)[1])
        return turn(*plan[min(n, len(plan) - 1)])

    return script


def _tasks(out: Path, count: int, seed: int) -> list:
    return generate_suite(out, count=count, seed=seed, difficulty=1, split="train")


def _measure(name, fn, engine, pool, n_episodes) -> dict:
    before = pool.metrics()
    t0 = time.monotonic()
    results = fn()
    wall = time.monotonic() - t0
    after = pool.metrics()
    assert len(results) == n_episodes and all(r.error is None for r in results), [r.error for r in results]
    row = {
        "wall_s": round(wall, 3),
        "episodes_per_s": round(n_episodes / wall, 3),
        "decode_steps": engine.decode_steps,
        "slot_occupancy": round(engine.occupancy(), 3),
        "turns": sum(r.n_turns for r in results),
        "tool_calls": int(after["tool_calls"] - before["tool_calls"]),
        "tool_roundtrip_p50_s": round(after.get("tool_roundtrip_s_p50", 0.0), 3),
    }
    print(f"{name:>28}: {json.dumps(row)}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--active", type=int, default=0, help="continuous: live episodes (0: 2 x slots)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--steps-per-call", type=int, default=8)
    p.add_argument("--max-turns", type=int, default=12)
    p.add_argument("--max-turn-tokens", type=int, default=256)
    p.add_argument("--turn-alpha", type=float, default=1.2, help="Pareto shape of the turn count")
    p.add_argument(
        "--tokens-mu", type=float, default=3.9, help="lognormal mu of tokens per turn (e^3.9 ~ 50)"
    )
    p.add_argument("--tokens-sigma", type=float, default=0.6)
    p.add_argument(
        "--latency-mu", type=float, default=-1.6, help="lognormal mu of tool latency (e^-1.6 ~ 0.2 s)"
    )
    p.add_argument("--latency-sigma", type=float, default=1.0)
    p.add_argument("--latency-cap", type=float, default=4.0)
    p.add_argument("--grade", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    active = args.active or 2 * args.slots
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory() as tmp:
        n_tasks = max(1, args.episodes // args.group_size)
        tasks = _tasks(Path(tmp) / "tasks", n_tasks, args.seed)
        texts = [chat.render_text(default_prompt(t)) for t in tasks]
        tok = tk.train_tokenizer(texts * 4, vocab_size=512)
        limits = RolloutLimits(args.max_turns, 8192, args.max_turn_tokens, episode_timeout_s=600.0)
        n = n_tasks * args.group_size
        keys = [f"{t.instance_id}/{g}/{m}" for g, t in enumerate(tasks) for m in range(args.group_size)]
        plans = [_plan(k, args.seed, args) for k in keys]
        turns = [len(pl) for pl in plans]
        lat = sorted(x for pl in plans for _, x in pl if x > 0)
        print(
            f"workload: {n} episodes ({n_tasks} tasks x {args.group_size}), turns per episode mean "
            f"{sum(turns) / n:.2f} max {max(turns)}, tool latency p50 {lat[len(lat) // 2]:.3f} s p95 "
            f"{lat[int(0.95 * len(lat))]:.3f} s max {lat[-1]:.3f} s (simulated: sleep in the real sandbox); "
            f"engine simulated: {args.slots} slots, {args.step_ms} ms per decode step",
            flush=True,
        )
        common = dict(tokenizer=tok, group_size=args.group_size, limits=limits, grade=args.grade)
        rows = {}
        with LocalPool(args.workers) as pool:
            # Warm-up: worker start-up and the first sandbox of each worker are not what is measured.
            warm = ScriptedEngine(_script(tok, args.seed + 1, args), slots=args.slots)
            run_episodes(tasks[:1], warm, pool, max_active=2 * args.workers, **{**common, "group_size": 2})

            def engine() -> ScriptedEngine:
                return ScriptedEngine(
                    _script(tok, args.seed, args),
                    slots=args.slots,
                    steps_per_call=args.steps_per_call,
                    step_s=args.step_ms / 1000,
                )

            e = engine()
            rows["sync"] = _measure(
                f"sync (batch {args.slots})",
                lambda: run_episodes_sync(tasks, e, pool, batch_size=args.slots, **common),
                e,
                pool,
                n,
            )
            e = engine()
            rows["continuous"] = _measure(
                f"continuous (active {active})",
                lambda: run_episodes(tasks, e, pool, max_active=active, **common),
                e,
                pool,
                n,
            )
            e = engine()
            rows["continuous_same_active"] = _measure(
                f"continuous (active {args.slots})",
                lambda: run_episodes(tasks, e, pool, max_active=args.slots, **common),
                e,
                pool,
                n,
            )
            m = pool.metrics()
        speedup = rows["continuous"]["episodes_per_s"] / rows["sync"]["episodes_per_s"]
        speedup_same = rows["continuous_same_active"]["episodes_per_s"] / rows["sync"]["episodes_per_s"]
        print(f"speed-up: {speedup:.2f}x (same live episodes as the baseline's batch: {speedup_same:.2f}x)")
        summary = {
            "benchmark": "rollout",
            "episodes": n,
            "simulated": "engine: fixed cost per decode step, scripted turns; tool latency: sleep in sandbox",
            "slots": args.slots,
            "active": active,
            "workers": args.workers,
            "step_ms": args.step_ms,
            "grade": args.grade,
            "sync_episodes_per_s": rows["sync"]["episodes_per_s"],
            "continuous_episodes_per_s": rows["continuous"]["episodes_per_s"],
            "continuous_same_active_episodes_per_s": rows["continuous_same_active"]["episodes_per_s"],
            "speedup": round(speedup, 3),
            "speedup_same_active": round(speedup_same, 3),
            "worker_restarts": m["worker_restarts"],
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "tool_batch_s_p50": round(m.get("tool_batch_s_p50", 0.0), 4),
        }
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
