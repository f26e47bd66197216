"""The code-search encoder for codebase_search (composer/search_model), trained contrastively.

Command:

    python -m composer.search_model train --out runs/search-model [--config=experiments/search_model.py]
        [--config.steps=600 --config.suites=runs/suites/inflection,runs/suites/boltons]

Hardware: one CPU core (taskset -c 1, single-threaded XLA), no downloads. Run time and result: docs/search.md.

Variants: ``:tiny`` is a 2-layer d=32 model on a few hundred pairs, seconds; used by the tests.
"""

import ml_collections

ConfigDict = ml_collections.ConfigDict


def get_config(arg: str = "") -> ConfigDict:
    c = ConfigDict()
    c.seed = 0
    c.steps = 600
    c.batch = 32  # queries per step; each brings its chunk and one hard negative
    c.learning_rate = 2e-3
    c.warmup_steps = 40
    c.weight_decay = 0.01
    c.scale = 20.0  # logits = scale * cosine (temperature 0.05)
    c.site_files = 6000  # Python files drawn from site-packages (held-out packages excluded)
    c.generated_tasks = 150  # env/tasks/generator.py tasks made for statement -> function pairs
    c.suites = ""  # comma-separated real-repository suites (env.tasks build) to train on
    c.validation_suites = ""  # suites (not trained on) on which the fusion's dense weight is fitted
    c.report_pairs = 2000  # test failure report -> tested function pairs from installed test suites
    c.shares = (0.4, 0.3, 0.3)  # of each batch: site-packages functions, test reports, tasks
    c.vocab_min_count = 2
    c.model = ConfigDict(
        dict(
            vocab_size=40000, hash_buckets=4096, d_model=256, n_layers=2, n_heads=4, d_ff=512,
            max_len=256, query_len=64, chunk_len=128,
        )
    )  # fmt: skip
    if arg == "tiny":
        c.steps, c.batch, c.warmup_steps = 6, 8, 2
        c.site_files, c.generated_tasks, c.report_pairs = 40, 0, 0
        c.model.update(vocab_size=500, hash_buckets=64, d_model=32, n_heads=2, d_ff=64, max_len=64)
        c.model.update(query_len=32, chunk_len=48)
    elif arg:
        raise ValueError(f"unknown variant {arg!r}")
    return c
