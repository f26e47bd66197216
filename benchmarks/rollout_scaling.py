"""Rollout throughput against the number of tool workers, for the local process pool and the Ray pool.

    python benchmarks/rollout_scaling.py [--episodes 24] [--workers 1,2,4] [--backends local,ray] [--no-grade]

The workload is benchmarks/rollout.py's (same heavy-tailed turns, tokens and tool latencies, the same
simulated engine: fixed cost per decode step, scripted turns; the tool latency is `sleep` in the real
sandbox), run by the continuous driver with `--active` live episodes. Grading is on by default: it runs
each task's tests in a fresh sandbox, the CPU-bound part of a rollout that more workers can spread.
What is real: the pools (processes / Ray actors), sandboxes, workspaces, tool path, grading.

Each (backend, workers) pool is warmed up (start-up and first sandboxes are not measured). On a machine
with few cores the CPU-bound part stops scaling at the core count. The last line is one JSON object.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rollout as workload  # noqa: E402  (benchmarks/rollout.py: the workload's plan and script)

from env import chat  # noqa: E402
from env import tokenizer as tk  # noqa: E402
from env.rollout import LocalPool, RolloutLimits, run_episodes  # noqa: E402
from env.rollout.driver import default_prompt  # noqa: E402
from env.rollout.engines import ScriptedEngine  # noqa: E402


def _pool(backend: str, n_workers: int):
    if backend == "local":
        return LocalPool(n_workers)
    from env.rollout.ray_pool import RayPool

    return RayPool(n_workers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--backends", default="local,ray")
    p.add_argument("--active", type=int, default=16)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--steps-per-call", type=int, default=8)
    p.add_argument("--no-grade", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    # The workload's distributions, as benchmarks/rollout.py's defaults.
    dist = argparse.Namespace(
        max_turns=12,
        max_turn_tokens=256,
        turn_alpha=1.2,
        tokens_mu=3.9,
        tokens_sigma=0.6,
        latency_mu=-1.6,
        latency_sigma=1.0,
        latency_cap=4.0,
    )
    workers = [int(w) for w in args.workers.split(",")]
    backends = args.backends.split(",")
    grade = not args.no_grade
    load_before = os.getloadavg()[0]
    if "ray" in backends:
        import ray

        # One cluster for every Ray pool; the actors take no CPU reservation, so any count fits.
        root = str(Path(__file__).resolve().parents[1])
        ray.init(
            num_cpus=max(workers),
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": root}},
        )

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        n_tasks = max(1, args.episodes // args.group_size)
        tasks = workload._tasks(Path(tmp) / "tasks", n_tasks, args.seed)
        texts = [chat.render_text(default_prompt(t)) for t in tasks]
        tok = tk.train_tokenizer(texts * 4, vocab_size=512)
        limits = RolloutLimits(dist.max_turns, 8192, dist.max_turn_tokens, episode_timeout_s=600.0)
        n = n_tasks * args.group_size
        common = dict(tokenizer=tok, group_size=args.group_size, limits=limits, grade=grade)
        for backend in backends:
            for n_workers in workers:
                t0 = time.monotonic()
                with _pool(backend, n_workers) as pool:
                    pool.wait_ready(120.0)
                    start_s = time.monotonic() - t0
                    warm = ScriptedEngine(workload._script(tok, args.seed + 1, dist), slots=args.slots)
                    run_episodes(
                        tasks[:1], warm, pool, max_active=2 * n_workers, **{**common, "group_size": 2}
                    )
                    engine = ScriptedEngine(
                        workload._script(tok, args.seed, dist),
                        slots=args.slots,
                        steps_per_call=args.steps_per_call,
                        step_s=args.step_ms / 1000,
                    )
                    name = f"{backend} x{n_workers}"
                    row = workload._measure(
                        name,
                        lambda pool=pool, engine=engine: run_episodes(
                            tasks, engine, pool, max_active=args.active, **common
                        ),
                        engine,
                        pool,
                        n,
                    )
                    row["pool_start_s"] = round(start_s, 2)
                    rows[name] = row
    if "ray" in backends:
        ray.shutdown()

    summary = {
        "benchmark": "rollout_scaling",
        "episodes": n,
        "active": args.active,
        "grade": grade,
        "simulated": "engine: fixed cost per decode step, scripted turns; tool latency: sleep in sandbox",
        "cpus": os.cpu_count(),
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    for name, row in rows.items():
        key = name.replace(" x", "_")
        summary[f"{key}_episodes_per_s"] = row["episodes_per_s"]
        summary[f"{key}_pool_start_s"] = row["pool_start_s"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
