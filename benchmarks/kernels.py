"""Benchmarks of the Pallas kernels against their XLA references.

    python benchmarks/kernels.py                      # GPU: realistic shapes, bf16; CPU: small shapes
    python benchmarks/kernels.py --shapes=realistic --kernels=gmm,flash_attention

Realistic shapes (issue 5): MoE experts 16384 tokens x top-8 over 128 experts, d 2048, f 768
(Qwen3-30B-A3B); attention sequence 4096, 32 query heads, 4 kv heads, head dim 128; decode batch 64
against an 8192-entry cache.
References: ``jax.lax.ragged_dot`` for the grouped matmuls, plain jnp attention (XLA) for attention.

Reported per case: median time, TFLOP/s (GB/s of KV cache read for decode), the share of an H200's measured
bf16 peak (790 TFLOP/s) or HBM bandwidth (4.3 TB/s) when on a GPU, the speedup over the reference, and the
relative error against it. FLOPs count useful work only: 2mkn per grouped matmul (x3 with the backward);
attention 4 b n t^2 h / 2 for the causal forward, x3.5 with the backward (FlashAttention-2's convention).

On a CPU the kernels can only run in Pallas interpret mode, so the script runs small shapes and its kernel
times measure the interpreter, not the kernels; it says so in its output. The last line is one JSON object.

If ragged_dot at full size would take longer than --ref_budget_s (XLA has expanded it into a dense matmul
over all groups on some versions), its time is extrapolated from a run on 1/16 of the rows and marked so.
"""

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_pallas.attention_ops import attend  # noqa: E402
from kernels_pallas.flash_attention.reference import attention_reference  # noqa: E402
from kernels_pallas.fp8_gmm.ops import gmm_fp8  # noqa: E402
from kernels_pallas.gmm.ops import gmm  # noqa: E402

H200_BF16_TFLOPS = 790.0
H200_HBM_GBPS = 4300.0

SHAPES = {
    "realistic": dict(
        moe=dict(tokens=16384, top_k=8, experts=128, d=2048, f=768),
        attention=dict(b=1, t=4096, n=32, g=4, h=128),
        decode=dict(b=64, s=8192, n=32, g=4, h=128),
    ),
    "small": dict(
        moe=dict(tokens=256, top_k=2, experts=8, d=128, f=64),
        attention=dict(b=1, t=128, n=4, g=2, h=64),
        decode=dict(b=4, s=512, n=8, g=2, h=64),
    ),
}


def _time(fn, args, iters: int, warmup: int) -> tuple[float, object]:
    """Median wall time in seconds of the compiled fn over iters runs, and its last output."""
    compiled = jax.jit(fn).lower(*args).compile()
    out = None
    for _ in range(warmup):
        out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _rel_err(out, ref) -> float:
    leaves = zip(jax.tree.leaves(out), jax.tree.leaves(ref))
    return max(
        float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
        / max(float(jnp.max(jnp.abs(b.astype(jnp.float32)))), 1e-30)
        for a, b in leaves
    )


def _row(name, shape, seconds, ref_seconds, work, unit, on_gpu, err, note="") -> dict:
    rate = work / seconds / (1e12 if unit == "TFLOP/s" else 1e9)
    peak = H200_BF16_TFLOPS if unit == "TFLOP/s" else H200_HBM_GBPS
    row = dict(
        case=name,
        shape=shape,
        ms=round(seconds * 1e3, 4),
        ref_ms=round(ref_seconds * 1e3, 4) if ref_seconds else None,
        rate=round(rate, 3),
        unit=unit,
        peak_share=round(rate / peak, 4) if on_gpu else None,
        speedup_vs_ref=round(ref_seconds / seconds, 3) if ref_seconds else None,
        rel_err_vs_ref=float(f"{err:.3g}") if err is not None else None,
    )
    if note:
        row["note"] = note
    return row


def _moe_inputs(cfg, dtype, key):
    kr, kx, kw, kd = jax.random.split(key, 4)
    m = cfg["tokens"] * cfg["top_k"]
    logits = jax.random.normal(kr, (cfg["tokens"], cfg["experts"]))
    _, experts = jax.lax.top_k(logits, cfg["top_k"])  # random routing: uneven group sizes
    sizes = jnp.bincount(experts.reshape(-1), length=cfg["experts"]).astype(jnp.int32)
    lhs = jax.random.normal(kx, (m, cfg["d"]), jnp.float32).astype(dtype)
    rhs = (jax.random.normal(kw, (cfg["experts"], cfg["d"], cfg["f"])) / math.sqrt(cfg["d"])).astype(dtype)
    dy = jax.random.normal(kd, (m, cfg["f"]), jnp.float32).astype(dtype)
    return lhs, rhs, sizes, dy


def _fwd_bwd(f):
    def run(x, w, dy):
        out, vjp = jax.vjp(f, x, w)
        return out, vjp(dy)

    return run


def _ragged_dot(x, w, sizes):
    return jax.lax.ragged_dot(x, w, sizes, preferred_element_type=jnp.float32).astype(x.dtype)


def _reference_time(fn, args, shrink_args, iters, warmup, budget_s) -> tuple[float, object, str]:
    """Times the reference; above budget_s (extrapolated from a 1/16-row run) reports 16 x the small run."""
    small_s, _ = _time(fn, shrink_args, 1, 1)
    if small_s * 16 > budget_s:
        return small_s * 16, None, "reference time extrapolated from 1/16 of the rows (too slow to run)"
    seconds, out = _time(fn, args, iters, warmup)
    return seconds, out, ""


def bench_gmm(cfg, dtype, args, on_gpu, key) -> list[dict]:
    lhs, rhs, sizes, dy = _moe_inputs(cfg, dtype, key)
    m, k, n = lhs.shape[0], lhs.shape[1], rhs.shape[2]
    shape = f"m={m} k={k} n={n} e={rhs.shape[0]} {jnp.dtype(dtype).name}"
    flops = 2.0 * m * k * n
    # 1/16 of the rows with proportionally smaller groups, for the extrapolation of a slow ragged_dot
    small_sizes = sizes // 16
    small_m = int(jnp.sum(small_sizes))
    small = (lhs[:small_m], rhs, small_sizes)
    rows = []

    t, out = _time(gmm, (lhs, rhs, sizes), args.iters, args.warmup)
    rt, ref, note = _reference_time(
        _ragged_dot, (lhs, rhs, sizes), small, args.iters, args.warmup, args.ref_budget_s
    )
    err = _rel_err(out, ref) if ref is not None else None
    rows.append(_row("gmm_fwd", shape, t, rt, flops, "TFLOP/s", on_gpu, err, note))
    bf16_fwd_s, bf16_out, ref_fwd_s = t, out, rt

    kernel_fb = _fwd_bwd(lambda x, w: gmm(x, w, sizes))
    ref_fb = _fwd_bwd(lambda x, w: _ragged_dot(x, w, sizes))
    t, out = _time(kernel_fb, (lhs, rhs, dy), args.iters, args.warmup)
    small_fb = (lhs[:small_m], rhs, dy[:small_m])
    ref_fb_small = _fwd_bwd(lambda x, w: _ragged_dot(x, w, small_sizes))
    small_s, _ = _time(ref_fb_small, small_fb, 1, 1)
    if small_s * 16 > args.ref_budget_s:
        rt, ref, note = (
            small_s * 16,
            None,
            "reference time extrapolated from 1/16 of the rows (too slow to run)",
        )
    else:
        rt, ref = _time(ref_fb, (lhs, rhs, dy), args.iters, args.warmup)
        note = ""
    err = _rel_err(out, ref) if ref is not None else None
    rows.append(_row("gmm_fwd_bwd", shape, t, rt, 3 * flops, "TFLOP/s", on_gpu, err, note))

    if "fp8_gmm" in args.kernels:
        t, out = _time(gmm_fp8, (lhs, rhs, sizes), args.iters, args.warmup)
        # error against the bf16 Pallas gmm (f32 accumulation), itself checked against ragged_dot above
        row = _row("fp8_gmm_fwd", shape, t, ref_fwd_s, flops, "TFLOP/s", on_gpu, _rel_err(out, bf16_out))
        row["speedup_vs_bf16_gmm"] = round(bf16_fwd_s / t, 3)
        row["note"] = "includes quantising both operands; rel_err is against the bf16 Pallas gmm"
        rows.append(row)
    return rows


def bench_attention(cfg, dtype, args, on_gpu, key) -> list[dict]:
    b, t, n, g, h = (cfg[x] for x in ("b", "t", "n", "g", "h"))
    kq, kk, kv, kd = jax.random.split(key, 4)
    q = jax.random.normal(kq, (b, t, n, h), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, t, g, h), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (b, t, g, h), jnp.float32).astype(dtype)
    do = jax.random.normal(kd, (b, t, n, h), jnp.float32).astype(dtype)
    q_pos = jnp.tile(jnp.arange(t, dtype=jnp.int32), (b, 1))
    kv_len = jnp.full((b,), t, jnp.int32)
    shape = f"b={b} t={t} n={n} g={g} h={h} {jnp.dtype(dtype).name}"
    flops = 4.0 * b * n * t * t * h / 2  # causal: half of the score matrix

    kernel = lambda q, k, v: attend(q, k, v, q_pos, kv_len)
    reference = lambda q, k, v: attention_reference(q, k, v, q_pos, kv_len, precision=None)
    rows = []
    tk, out = _time(kernel, (q, k, v), args.iters, args.warmup)
    tr, ref = _time(reference, (q, k, v), args.iters, args.warmup)
    rows.append(_row("flash_attention_fwd", shape, tk, tr, flops, "TFLOP/s", on_gpu, _rel_err(out, ref)))

    def fwd_bwd(f):
        def run(q, k, v, do):
            out, vjp = jax.vjp(f, q, k, v)
            return out, vjp(do)

        return run

    tk, out = _time(fwd_bwd(kernel), (q, k, v, do), args.iters, args.warmup)
    tr, ref = _time(fwd_bwd(reference), (q, k, v, do), args.iters, args.warmup)
    rows.append(
        _row("flash_attention_fwd_bwd", shape, tk, tr, 3.5 * flops, "TFLOP/s", on_gpu, _rel_err(out, ref))
    )
    return rows


def bench_decode(cfg, dtype, args, on_gpu, key) -> list[dict]:
    b, s, n, g, h = (cfg[x] for x in ("b", "s", "n", "g", "h"))
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (b, 1, n, h), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (b, s, g, h), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (b, s, g, h), jnp.float32).astype(dtype)
    q_pos = jnp.full((b, 1), s - 1, jnp.int32)  # full caches: every entry is read
    kv_len = jnp.full((b,), s, jnp.int32)
    shape = f"b={b} s={s} n={n} g={g} h={h} {jnp.dtype(dtype).name}"
    cache_bytes = 2.0 * b * s * g * h * jnp.dtype(dtype).itemsize  # K and V, each read once

    kernel = lambda q, k, v: attend(q, k, v, q_pos, kv_len)
    reference = lambda q, k, v: attention_reference(q, k, v, q_pos, kv_len, precision=None)
    tk, out = _time(kernel, (q, k, v), args.iters, args.warmup)
    tr, ref = _time(reference, (q, k, v), args.iters, args.warmup)
    return [_row("decode_attention", shape, tk, tr, cache_bytes, "GB/s", on_gpu, _rel_err(out, ref))]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", choices=("auto", "realistic", "small"), default="auto")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--kernels", default="gmm,fp8_gmm,flash_attention,decode_attention")
    parser.add_argument("--iters", type=int, default=None, help="timed runs (default: 20 on GPU, 5 on CPU)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ref_budget_s", type=float, default=20.0)
    args = parser.parse_args(argv)
    args.kernels = [name.strip() for name in args.kernels.split(",") if name.strip()]

    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    shapes = args.shapes if args.shapes != "auto" else ("realistic" if on_gpu else "small")
    args.iters = args.iters or (20 if on_gpu else 5)
    args.warmup = args.warmup if on_gpu else 1
    dtype = jnp.dtype(args.dtype)
    device = str(jax.devices()[0].device_kind)
    mode = (
        "native Triton kernels" if on_gpu else "Pallas INTERPRET mode (kernel times measure the interpreter)"
    )
    print(f"device: {device} ({backend}); kernels: {mode}; shapes: {shapes}; dtype: {dtype.name}")
    if not on_gpu:
        print("NOTE: no GPU here. The numbers are CPU timings of small shapes, nothing about GPU speed.")

    cases = SHAPES[shapes]
    rows, errors = [], {}
    keys = iter(jax.random.split(jax.random.key(0), 8))
    plan = [
        ("gmm", lambda: bench_gmm(cases["moe"], dtype, args, on_gpu, next(keys))),
        ("flash_attention", lambda: bench_attention(cases["attention"], dtype, args, on_gpu, next(keys))),
        ("decode_attention", lambda: bench_decode(cases["decode"], dtype, args, on_gpu, next(keys))),
    ]
    if "fp8_gmm" in args.kernels and "gmm" not in args.kernels:
        args.kernels.append("gmm")  # the fp8 case is measured next to the bf16 gmm it is compared with
    for name, run in plan:
        if name not in args.kernels:
            continue
        try:
            rows.extend(run())
        except Exception as e:  # report and go on: one failing kernel must not hide the others
            errors[name] = f"{type(e).__name__}: {str(e)[:500]}"
            print(f"{name}: FAILED {errors[name]}")

    header = (
        f"{'case':<26}{'ms':>10}{'ref ms':>11}{'rate':>10} {'unit':<8}{'peak':>7}{'x ref':>8}{'rel err':>10}"
    )
    print(header)
    for r in rows:
        share = f"{r['peak_share']:.1%}" if r["peak_share"] is not None else "n/a"
        ref_ms = f"{r['ref_ms']:.3f}" if r["ref_ms"] is not None else "-"
        speedup = f"{r['speedup_vs_ref']:.2f}" if r["speedup_vs_ref"] is not None else "-"
        err = f"{r['rel_err_vs_ref']:.2g}" if r["rel_err_vs_ref"] is not None else "-"
        rate, unit = f"{r['rate']:.3f}", r["unit"]
        print(
            f"{r['case']:<26}{r['ms']:>10.3f}{ref_ms:>11}{rate:>10} {unit:<8}{share:>7}{speedup:>8}{err:>10}"
        )
        extra = {key: r[key] for key in ("speedup_vs_bf16_gmm", "note") if key in r}
        if extra:
            print(f"    {r['case']}: {extra} [{r['shape']}]")
    summary = dict(
        device=device,
        backend=backend,
        mode="native" if on_gpu else "interpret",
        shapes=shapes,
        dtype=dtype.name,
        peaks=dict(bf16_tflops=H200_BF16_TFLOPS, hbm_gbps=H200_HBM_GBPS),
        results=rows,
        errors=errors,
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
