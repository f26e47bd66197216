"""The OpenAI-compatible server under load: requests/s, generated tokens/s and time to first token (p50 / p99)
at 1, 8 and 32 concurrent clients, beside the same requests sent one at a time.

    python benchmarks/serve.py [--config=experiments/composer.py:tiny] [--workdir RUN] [--requests 32]
                               [--max-tokens 32]

The server (composer/serve.py) runs in this process on a free port; the clients are the official `openai`
package, streaming (time to first token: from the request to the first chunk that carries generated text,
tool calls or the finish). Without --workdir the model is the config's random init over a tokenizer trained
here (what it says is noise: the load is what is measured). Every request generates exactly --max-tokens
tokens where the model does not stop first. The last line is one JSON object; `ratio_8` is the wall time of
8 concurrent requests over that of the same 8 one at a time.
"""

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from composer import xla_flags  # noqa: E402

xla_flags.apply()

import openai  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from composer.pipeline import learner as learner_lib  # noqa: E402
from composer.serving import load  # noqa: E402
from env import chat  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/composer.py:tiny", "Experiment config.")


def _one(client: openai.OpenAI, i: int, max_tokens: int) -> dict:
    t0 = time.time()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model="composer", messages=[{"role": "user", "content": f"Fix the bug in module_{i}.py"}],
        max_tokens=max_tokens, temperature=1.0, seed=i, stream=True,
    )  # fmt: skip
    for n, chunk in enumerate(stream):
        if n >= 1 and first is None:
            first = time.time() - t0
        tokens += 1 if chunk.choices and chunk.choices[0].delta.content else 0
    return {"s": time.time() - t0, "ttft_s": first if first is not None else time.time() - t0}


def _wave(client, n_clients: int, n_requests: int, max_tokens: int, engine) -> dict:
    before = engine_tokens(engine)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(n_clients) as pool:
        results = list(pool.map(lambda i: _one(client, i, max_tokens), range(n_requests)))
    wall = time.time() - t0
    generated = engine_tokens(engine) - before
    ttft = sorted(r["ttft_s"] for r in results)
    p99 = ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]
    return {
        "clients": n_clients, "requests": n_requests, "wall_s": round(wall, 3),
        "requests_per_s": round(n_requests / wall, 3), "tokens_per_s": round(generated / wall, 1),
        "ttft_p50_s": round(statistics.median(ttft), 4), "ttft_p99_s": round(p99, 4),
    }  # fmt: skip


def engine_tokens(engine) -> int:
    return engine.sampler.counters["tokens_generated"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    args, rest = parser.parse_known_args()
    flags.FLAGS([sys.argv[0], *rest])  # --config and its overrides
    config = _CONFIG.value
    workdir = args.workdir
    if workdir is None:
        workdir = tempfile.mkdtemp(prefix="serve-bench-")
        turn = [chat.Message("user", "fix module_1.py"), chat.Message("assistant", "ok")]
        texts = [chat.render_text(turn)] * 50 + [f"module_{i}.py" for i in range(200)]
        learner_lib.fit_tokenizer(config, texts).save(Path(workdir) / "tokenizer.json")
    api, engine = load.build(config, workdir, "composer")
    server = load.LocalServer(api)
    client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)
    try:
        # Every wave once first: each compiles the programs of its row counts and lengths.
        for n, count in [(n, max(args.requests, n)) for n in (1, 8, 32)] + [(8, 8), (8, 8)]:
            _wave(client, n, count, args.max_tokens, engine)
        waves = {n: _wave(client, n, max(args.requests, n), args.max_tokens, engine) for n in (1, 8, 32)}
        one_at_a_time = _wave(client, 1, 8, args.max_tokens, engine)
        together = _wave(client, 8, 8, args.max_tokens, engine)
    finally:
        server.close()
        engine.close()
    for n, w in waves.items():
        print(f"{n:>3} clients: {w['requests_per_s']:.2f} req/s, {w['tokens_per_s']:.0f} tok/s, "
              f"TTFT p50 {w['ttft_p50_s']:.3f} s p99 {w['ttft_p99_s']:.3f} s")  # fmt: skip
    ratio = together["wall_s"] / one_at_a_time["wall_s"]
    print(f"8 requests: one at a time {one_at_a_time['wall_s']:.2f} s, together {together['wall_s']:.2f} s "
          f"({ratio:.2f}x)")  # fmt: skip
    out = {"waves": waves, "sequential_8_s": one_at_a_time["wall_s"], "concurrent_8_s": together["wall_s"]}
    print(json.dumps({**out, "ratio_8": round(ratio, 3), "max_tokens": args.max_tokens}))


if __name__ == "__main__":
    main()
