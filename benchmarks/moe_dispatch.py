"""Times the MoE layer, forward and forward+backward, for each expert dispatch implementation.

    python benchmarks/moe_dispatch.py [--tokens=4096 --d_model=512 --experts=8 --top_k=2 --d_ff=1024
                                       --dtype=float32 --capacity_factor=1.25 --reps=5 --dispatch=a,b]

Every implementation gets the same weights and input; each function is jitted, run once to compile, then
timed `reps` times (median). Implementations whose import fails are skipped, saying why; on a CPU backend
the Pallas kernels are skipped unless named with --dispatch (they would run in interpret mode). Prints a
table with the ratio to the fastest; the LAST line is one JSON object with every number.
"""

import argparse
import dataclasses
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from composer import model, moe  # noqa: E402
from composer.model_config import ModelConfig  # noqa: E402


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=2)
    parser.add_argument("--d_ff", type=int, default=1024)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--capacity_factor", type=float, default=1.25)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dispatch", default="", help="comma-separated names (default: all registered)")
    return parser.parse_args()


def _uses_pallas(name: str) -> bool:
    entry = moe.DISPATCH_IMPLS[name]
    gmm = entry.keywords.get("gmm") if isinstance(entry, functools.partial) else None
    return isinstance(gmm, str) and gmm.startswith("kernels_pallas")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _median_ms(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def _time_dispatch(cfg: ModelConfig, p: dict, x_btd: jax.Array, reps: int) -> dict:
    valid_bt = jnp.ones(x_btd.shape[:2], bool)
    cotangent = jax.random.normal(jax.random.key(2), x_btd.shape, x_btd.dtype)

    def forward(p, x):
        return moe.moe_layer(p, x, valid_bt, cfg)

    def loss(p, x):
        y, aux = moe.moe_layer(p, x, valid_bt, cfg)
        return jnp.sum(y.astype(jnp.float32) * cotangent) + aux["load_balance_loss"] + aux["router_z_loss"]

    fwd = jax.jit(forward)
    fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    dropped = float(fwd(p, x_btd)[1]["dropped_fraction"])
    return {
        "forward_ms": _median_ms(fwd, p, x_btd, reps=reps),
        "fwd_bwd_ms": _median_ms(fwd_bwd, p, x_btd, reps=reps),
        "dropped_fraction": dropped,
    }


def main() -> None:
    args = _parse()
    device = jax.devices()[0]
    backend = jax.default_backend()
    machine = (
        f"{_cpu_name()}, {os.cpu_count()} cores; jax {jax.__version__}, "
        f"backend {backend} ({device.device_kind}, {jax.device_count()} device(s))"
    )
    base = ModelConfig(
        vocab_size=128,
        d_model=args.d_model,
        n_layers=1,
        n_experts=args.experts,
        top_k=args.top_k,
        d_ff=args.d_ff,
        capacity_factor=args.capacity_factor,
        param_dtype=args.dtype,
        compute_dtype=args.dtype,
    )
    params = model.init(jax.random.key(0), base)
    p = jax.tree.map(lambda w: w[0], params["moe_layers"]["moe"])
    x_btd = jax.random.normal(jax.random.key(1), (1, args.tokens, args.d_model)).astype(args.dtype)

    requested = [n for n in args.dispatch.split(",") if n]
    names = requested or list(moe.DISPATCH_IMPLS)
    results, skipped = {}, {}
    for name in names:
        if not requested and backend == "cpu" and _uses_pallas(name):
            skipped[name] = "Pallas kernel: interpret mode only on CPU (name it with --dispatch to time it)"
            continue
        try:
            results[name] = _time_dispatch(dataclasses.replace(base, dispatch=name), p, x_btd, args.reps)
        except ImportError as e:
            skipped[name] = f"import failed: {e}"

    print(
        f"MoE layer: {args.tokens} tokens, d {args.d_model}, {args.experts} experts top-{args.top_k}, "
        f"f {args.d_ff}, {args.dtype}, capacity factor {args.capacity_factor}; median of {args.reps} reps"
    )
    print(f"machine: {machine}")
    if results:
        best_f = min(r["forward_ms"] for r in results.values())
        best_b = min(r["fwd_bwd_ms"] for r in results.values())
        header = ("dispatch", "forward ms", "x fastest", "fwd+bwd ms", "x fastest", "dropped")
        print("{:<12} {:>11} {:>9} {:>11} {:>9} {:>8}".format(*header))
        for name, r in results.items():
            r["forward_ratio"] = r["forward_ms"] / best_f
            r["fwd_bwd_ratio"] = r["fwd_bwd_ms"] / best_b
            print(
                f"{name:<12} {r['forward_ms']:>11.1f} {r['forward_ratio']:>9.2f} "
                f"{r['fwd_bwd_ms']:>11.1f} {r['fwd_bwd_ratio']:>9.2f} {r['dropped_fraction']:>8.4f}"
            )
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    record = {"benchmark": "moe_dispatch", "machine": machine, "backend": backend, "args": vars(args)}
    print(json.dumps({**record, "results": results, "skipped": skipped}))


if __name__ == "__main__":
    main()
