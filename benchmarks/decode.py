"""Decode tokens/s of the sampler, beside the peer (google-tunix 0.1.7's Qwen3-MoE Sampler) on this machine.

    python benchmarks/decode.py [--pairs 8] [--repeats 5] [--peer-python PATH] [--install-peer]
                                [--peer-with-our-flags]

Measured as the peer's own decode benchmark (its harness, decode_bench.py) measures: the wall time of one
call that prefills the batch and generates N new tokens per row (here `Sampler.generate`, which returns host
lists), after a warm-up call that compiles; tokens/s = batch * N / median wall time. Every row generates
exactly N tokens (the peer forbids EOS; here eos_id is None). Ours runs with the project's XLA flags
(composer/xla_flags.py, as launch.py sets them); the peer with the environment this script was given, or
with our flags too (--peer-with-our-flags: they make the peer faster as well). The JSON records both
(xla_flags, peer_xla_flags).

(1) peer_shape: the peer's default model and workload: 4 layers, d_model 256, 4 heads of 64 (4 kv heads),
    8 experts top-2, expert FFN 512, vocab 512, float32, rope theta 1e6, qk-norm; batch 8, prompt 32,
    64 new tokens, greedy, a cache of prompt + new tokens (as the peer sizes it).
    The peer, google-tunix's sampler, runs in its own venv, whose interpreter --peer-python names
    (--install-peer creates it: python3 -m venv + pip install google-tunix==0.1.7, about 1.6 GB). Without
    it, only our number is reported. With it, two measurements:
    - paired (the reported ratio_to_peer): a driver in the peer's venv builds the peer's model, sampler,
      prompts and call with decode_bench.py's own functions and arguments; our call and the peer's call
      then alternate, --pairs times, both warm. The ratio is the median over pairs of peer wall / our wall:
      on this shared, noisy machine two calls a second apart see the same load, two runs a minute apart
      often do not. CPU seconds of each call (all threads of its process) are reported too.
    - harness: the peer's decode_bench.py itself, unchanged (its defaults are this shape), then ours
      timed right after it (--skip-harness skips this).
(2) default: the model of experiments/composer.py (`default_model_config`: the copy head's line keys off)
    with its sampling settings (decode_slots rows, steps_per_call, temperature, top_p, a max_seq_len
    cache); prompt 256, 64 new tokens.
(3) rebuild / reuse: multi-turn episodes on the default model, each turn's prompt being the episode's
    whole stream so far (opening prompt, then per turn the generated tokens and a tool result), driven
    through add / step like the rollout driver, tools answering at once; once with every turn prefilled
    from scratch (rebuild), once with the sampler's prefix reuse (reuse, the default). Reports tokens/s,
    prefill's share of the sampler's wall time, the decode-slot occupancy, and reuse's speedup.

The last line is one JSON object: {"peer_shape": {"tokens_per_s", ["peer_tokens_per_s", "ratio_to_peer",
"harness"]}, "default": {"tokens_per_s", ...}, "rebuild": {...}, "reuse": {..., "speedup_over_rebuild"}}.
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from composer import model, xla_flags  # noqa: E402
from composer.model_config import ModelConfig  # noqa: E402
from composer.sampler import Sampler  # noqa: E402
from experiments.composer import get_config  # noqa: E402

# The peer runs in the environment this script was started with; ours with the project's XLA flags
# (composer/xla_flags.py, as launch.py sets them), added before anything starts JAX's backend.
PEER_ENV = dict(os.environ)
xla_flags.apply()
PEER_DIR = ROOT.parent / "shared" / "peers" / "tunix"
PEER_SHAPE = ModelConfig(
    vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=64, qk_norm="head",
    rope_theta=1_000_000.0, max_seq_len=96, n_experts=8, top_k=2, d_ff=512, param_dtype="float32",
    compute_dtype="float32",
)  # fmt: skip


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, length).tolist() for _ in range(batch)]


def time_generate(sampler: Sampler, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """Wall time of sampler.generate(prompts, new_tokens): one warm-up call, then `repeats` timed calls."""
    start = time.perf_counter()
    outs = sampler.generate(prompts, new_tokens)
    first_s = time.perf_counter() - start
    if any(len(o.token_ids) != new_tokens for o in outs):
        raise RuntimeError("a row generated fewer tokens than asked")
    before = sampler.stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.generate(prompts, new_tokens)
        times.append(time.perf_counter() - start)
    after = sampler.stats()
    median = statistics.median(times)
    prefill_s = after["prefill_s"] - before["prefill_s"]
    decode_s = after["decode_s"] - before["decode_s"]
    return {
        "batch": len(prompts),
        "prompt_len": len(prompts[0]),
        "new_tokens": new_tokens,
        "tokens_per_s": round(len(prompts) * new_tokens / median, 1),
        "tokens_per_s_best": round(len(prompts) * new_tokens / min(times), 1),
        "median_s": round(median, 4),
        "times_s": [round(t, 4) for t in times],
        "first_call_s": round(first_s, 2),
        "prefill_share": round(prefill_s / (prefill_s + decode_s), 3),
    }


def peer_shape_sampler(batch: int, prompt_len: int, new_tokens: int) -> Sampler:
    """Our sampler on the peer-shape model: greedy, one decode call for all new tokens, a cache of
    prompt + new tokens (as the peer sizes its own)."""
    cfg = PEER_SHAPE
    return Sampler(
        model.init(jax.random.key(0), cfg), cfg, slots=batch, max_len=prompt_len + new_tokens,
        steps_per_call=new_tokens, temperature=0.0, eos_id=None, key=jax.random.key(1),
    )  # fmt: skip


def bench_ours_peer_shape(repeats: int) -> dict:
    sampler = peer_shape_sampler(8, 32, 64)
    return time_generate(sampler, _prompts(8, 32, PEER_SHAPE.vocab_size, 0), 64, repeats)


def ensure_peer(python: Path, install: bool) -> bool:
    """Whether the peer's interpreter exists; with `install`, creates its venv (python = VENV/bin/python)."""
    if python.exists():
        return True
    if not install:
        return False
    venv = python.parents[1]
    print(f"installing the peer into {venv} (google-tunix==0.1.7, about 1.6 GB)", file=sys.stderr)
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "google-tunix==0.1.7"], check=True)
    return python.exists()


def bench_peer_harness(python: Path, repeats: int) -> dict:
    """Runs the peer's own decode_bench.py with its defaults (the peer shape); returns its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [str(python), "decode_bench.py", "--repeats", str(repeats), "--no-prefill-breakdown"]
        cmd += ["--json", str(out)]
        subprocess.run(
            cmd, cwd=PEER_DIR, env=PEER_ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        return json.loads(out.read_text())


# Runs in the peer's venv: builds the peer's model, sampler, prompts and call exactly as its decode_bench.py
# does (its own functions), warms up, then times one call per line read from stdin.
PEER_DRIVER = """
import argparse, sys, time
sys.path.insert(0, sys.argv[1])
import decode_bench as db
from tunix.generate import sampler as sampler_lib
batch, prompt_len, new = (int(a) for a in sys.argv[2:5])
p = argparse.ArgumentParser(); db.add_model_args(p); args = p.parse_args([])
model, cfg = db.build_model(args)
tok = db.ByteTokenizer(args.vocab)
cache = sampler_lib.CacheConfig(cache_size=prompt_len + new, num_layers=cfg.num_layers,
                                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
smp = sampler_lib.Sampler(transformer=model, tokenizer=tok, cache_config=cache)
prompts = db.make_prompts(batch, prompt_len, args.seed)
kw = dict(max_prompt_length=prompt_len, echo=False, forbidden_tokens=[tok.PAD, tok.BOS, tok.EOS])
smp(prompts, max_generation_steps=new, **kw)
print("ready", flush=True)
for _ in sys.stdin:
    wall, cpu = time.perf_counter(), time.process_time()
    smp(prompts, max_generation_steps=new, **kw)
    print(time.perf_counter() - wall, time.process_time() - cpu, flush=True)
"""


def bench_paired(python: Path | None, pairs: int) -> dict:
    """Ours and (when `python` is given) the peer's sampler, one call each in turn, `pairs` times.

    Both are warm (compiled) first; the order alternates each pair. On a shared, noisy machine the ratio of
    two calls made a second apart is far steadier than the ratio of two runs made a minute apart.
    Reports medians of wall time, CPU time (this process's, all threads) and the per-pair ratio.
    """
    batch, prompt_len, new = 8, 32, 64
    sampler = peer_shape_sampler(batch, prompt_len, new)
    prompts = _prompts(batch, prompt_len, PEER_SHAPE.vocab_size, 0)
    start = time.perf_counter()
    if any(len(o.token_ids) != new for o in sampler.generate(prompts, new)):
        raise RuntimeError("a row generated fewer tokens than asked")
    first_s = time.perf_counter() - start

    def ours() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        sampler.generate(prompts, new)
        return time.perf_counter() - wall, time.process_time() - cpu

    mine, other = [], []
    if python is None:
        mine = [ours() for _ in range(pairs)]
    else:
        args = [str(python), "-c", PEER_DRIVER, str(PEER_DIR), str(batch), str(prompt_len), str(new)]
        with tempfile.TemporaryFile("w+") as log:
            peer = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=PEER_ENV
            )
            try:
                if peer.stdout.readline().strip() != "ready":
                    log.seek(0)
                    raise RuntimeError(f"the peer driver failed to start:\n{log.read()[-3000:]}")

                def theirs() -> tuple[float, float]:
                    peer.stdin.write("go\n")
                    peer.stdin.flush()
                    wall, cpu = (float(x) for x in peer.stdout.readline().split())
                    return wall, cpu

                for i in range(pairs):  # alternate who goes first
                    first, second = (ours, theirs) if i % 2 == 0 else (theirs, ours)
                    a, b = first(), second()
                    mine.append(a if first is ours else b)
                    other.append(b if first is ours else a)
            finally:
                peer.stdin.close()
                peer.wait(timeout=60)
    tokens = batch * new
    res = {
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new,
        "tokens_per_s": round(tokens / statistics.median(w for w, _ in mine), 1),
        "times_s": [round(w, 4) for w, _ in mine],
        "cpu_s": round(statistics.median(c for _, c in mine), 4),
        "first_call_s": round(first_s, 2),
    }
    if other:
        res.update(
            peer_tokens_per_s=round(tokens / statistics.median(w for w, _ in other), 1),
            peer_times_s=[round(w, 4) for w, _ in other],
            peer_cpu_s=round(statistics.median(c for _, c in other), 4),
            ratio_to_peer=round(statistics.median(p[0] / m[0] for m, p in zip(mine, other)), 2),
        )
    return res


def default_model_config(config) -> ModelConfig:
    """ModelConfig.from_config(config) without the copy head's line keys: the random prompts hold no chat
    template and there is no tokenizer to take its tokens from (copy_head.LineTokens)."""
    return dataclasses.replace(ModelConfig.from_config(config), copy_head_lines=False)


def bench_default(repeats: int) -> dict:
    config = get_config()
    cfg = default_model_config(config)
    params = model.init(jax.random.key(0), cfg)
    s = config.sampling
    sampler = Sampler(
        params, cfg, slots=s.decode_slots, max_len=cfg.max_seq_len, steps_per_call=s.steps_per_call,
        temperature=s.temperature, top_p=s.top_p, eos_id=None, key=jax.random.key(1),
    )  # fmt: skip
    res = time_generate(sampler, _prompts(s.decode_slots, 256, cfg.vocab_size, 0), 64, repeats)
    return {**res, "slots": s.decode_slots, "steps_per_call": s.steps_per_call, "max_len": cfg.max_seq_len}


def bench_rebuild(episodes: int, turns: int, turn_tokens: int, tool_tokens: int, reuse: bool) -> dict:
    """Multi-turn episodes (see the module docstring); tools answer at once. reuse: the sampler's prefix
    reuse on (returning turns compute only their new tokens) or off (every turn prefilled from scratch).

    Two passes over the same workload with different request ids: the first compiles every shape, the
    second is measured.
    """
    config = get_config()
    cfg = default_model_config(config)
    params = model.init(jax.random.key(0), cfg)
    s = config.sampling
    rng = np.random.default_rng(0)
    openings = _prompts(episodes, 256, cfg.vocab_size, 1)
    tools = [
        [rng.integers(3, cfg.vocab_size, tool_tokens).tolist() for _ in range(turns)] for _ in range(episodes)
    ]

    def run(tag: str) -> tuple[dict, float]:
        sampler = Sampler(
            params, cfg, slots=s.decode_slots, max_len=cfg.max_seq_len, steps_per_call=s.steps_per_call,
            temperature=s.temperature, top_p=s.top_p, eos_id=None, key=jax.random.key(1), reuse_prefix=reuse,
        )  # fmt: skip
        streams = [list(o) for o in openings]
        start = time.perf_counter()
        for e in range(episodes):
            sampler.add(f"{tag}{e}@0", streams[e], turn_tokens)
        while sampler.pending():
            for out in sampler.step():
                e, turn = out.request_id[len(tag) :].split("@")
                e, turn = int(e), int(turn)
                streams[e] += out.token_ids
                if turn + 1 < turns:
                    streams[e] += tools[e][turn]
                    sampler.add(f"{tag}{e}@{turn + 1}", streams[e], turn_tokens)
        return sampler.stats(), time.perf_counter() - start

    run("warm")
    stats, wall = run("e")
    return {
        "episodes": episodes,
        "turns": turns,
        "turn_tokens": turn_tokens,
        "tool_tokens": tool_tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(stats["tokens_generated"] / wall, 1),
        "prefill_share": round(stats["prefill_share"], 3),
        "prefill_tokens": stats["prefill_tokens"],
        "reused_tokens": stats["reused_tokens"],
        "prefill_padded_tokens": stats["prefill_padded_tokens"],
        "occupancy": round(stats["occupancy"], 3),
        "prefill_s": round(stats["prefill_s"], 2),
        "decode_s": round(stats["decode_s"], 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="timed calls after the warm-up (median reported)")
    p.add_argument(
        "--pairs", type=int, default=8, help="alternating (ours, peer) timed calls at the peer shape"
    )
    p.add_argument("--peer-python", type=Path, default=PEER_DIR / ".venv-tunix" / "bin" / "python")
    p.add_argument("--install-peer", action="store_true", help="create the peer's venv if it is missing")
    p.add_argument("--skip-harness", action="store_true", help="do not also run the peer's decode_bench.py")
    p.add_argument(
        "--peer-with-our-flags",
        action="store_true",
        help="run the peer with the project's XLA flags too (they speed it up as well on this CPU)",
    )
    p.add_argument("--skip-default", action="store_true")
    p.add_argument("--skip-rebuild", action="store_true")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--turns", type=int, default=3)
    args = p.parse_args()
    if args.peer_with_our_flags:
        PEER_ENV["XLA_FLAGS"] = os.environ["XLA_FLAGS"]

    have_peer = ensure_peer(args.peer_python, args.install_peer)
    shape = bench_paired(args.peer_python if have_peer else None, args.pairs)
    if have_peer:
        line = f"ours {shape['tokens_per_s']} tok/s, peer {shape['peer_tokens_per_s']} tok/s"
        print(f"[peer shape, {args.pairs} pairs] {line}, ratio {shape['ratio_to_peer']}", file=sys.stderr)
        if not args.skip_harness:
            harness = bench_peer_harness(args.peer_python, args.repeats)
            ours = bench_ours_peer_shape(args.repeats)
            shape["harness"] = {
                "peer_tokens_per_s": harness["e2e_tokens_per_s"],
                "peer_times_s": harness["times_s"],
                "tokens_per_s": ours["tokens_per_s"],
                "times_s": ours["times_s"],
                "ratio_to_peer": round(ours["tokens_per_s"] / harness["e2e_tokens_per_s"], 2),
            }
            print(f"[peer shape, peer's decode_bench.py then ours] {shape['harness']}", file=sys.stderr)
    else:
        shape["peer"] = (
            f"not run: no interpreter at {args.peer_python} (pass --install-peer or --peer-python)"
        )
        print(f"[peer shape] ours {shape['tokens_per_s']} tok/s; the peer was not run", file=sys.stderr)
    shape["xla_flags"] = os.environ["XLA_FLAGS"]
    if have_peer:
        shape["peer_xla_flags"] = PEER_ENV.get("XLA_FLAGS", "")
    result = {"peer_shape": shape}
    if not args.skip_default:
        result["default"] = bench_default(args.repeats)
        print(f"[default] {result['default']['tokens_per_s']} tok/s", file=sys.stderr)
    if not args.skip_rebuild:
        for name, reuse in (("rebuild", False), ("reuse", True)):
            result[name] = bench_rebuild(args.episodes, args.turns, 64, 96, reuse)
            r = result[name]
            print(f"[{name}] {r['tokens_per_s']} tok/s, prefill share {r['prefill_share']}", file=sys.stderr)
        result["reuse"]["speedup_over_rebuild"] = round(
            result["reuse"]["tokens_per_s"] / result["rebuild"]["tokens_per_s"], 2
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
