"""Contrastive training of the code-search encoder.

    pairs  = data: site-packages functions, task statements (composer/search_model/data.py)
    vocab  = the most frequent tokenizer pieces of the pairs
    loop:  update(state, batch) -> (state, metrics), jitted once (fixed shapes), batches drawn with
           np.random.default_rng((seed, step)) so a seed gives the same run
    save   = a model directory codebase_search loads (env/tools/search_encoder.py)

Loss: InfoNCE with in-batch negatives (van den Oord et al. 2018; as in DPR, Karpukhin et al. 2020) plus one
BM25-mined hard negative per query: each query scores the batch's b chunks and b hard negatives, and its
own chunk is the label; symmetric, each chunk also picks its query among the b queries. Candidates whose
text is the label's (a duplicate) are masked out so no positive is pushed away as a negative.
"""

import collections
import dataclasses
import hashlib
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from composer.search_model import data, encoder, evaluate
from env.tools import search_encoder as se


class Batch(NamedTuple):
    query_bt: np.ndarray  # [b, query_len]
    chunks_ct: np.ndarray  # [2b, chunk_len]: the b positives, then the b hard negatives
    valid_bc: np.ndarray  # [b, 2b] bool: candidate c may be scored against query b


class TrainState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    step: jax.Array


def model_config(config) -> se.EncoderConfig:
    return se.EncoderConfig(**config.model.to_dict())


def build_vocab(texts: list[str], size: int, min_count: int) -> list[str]:
    """The `size` most frequent pieces seen at least min_count times (ties broken by the piece)."""
    counts = collections.Counter(p for t in texts for p in se.pieces(t))
    ranked = sorted((p for p, n in counts.items() if n >= min_count), key=lambda p: (-counts[p], p))
    return ranked[:size]


def loss_fn(params: dict, batch: Batch, cfg: se.EncoderConfig, scale: float) -> tuple[jax.Array, dict]:
    """Symmetric InfoNCE with hard negatives (module docstring)."""
    q_bd = encoder.forward(params, batch.query_bt, cfg)
    c_cd = encoder.forward(params, batch.chunks_ct, cfg)
    b = q_bd.shape[0]
    labels = jnp.arange(b)
    logits_bc = jnp.where(batch.valid_bc, scale * q_bd @ c_cd.T, -1e9)
    loss_q = optax.softmax_cross_entropy_with_integer_labels(logits_bc, labels).mean()
    logits_cb = jnp.where(batch.valid_bc[:, :b].T, scale * c_cd[:b] @ q_bd.T, -1e9)
    loss_c = optax.softmax_cross_entropy_with_integer_labels(logits_cb, labels).mean()
    accuracy = (jnp.argmax(logits_bc, axis=-1) == labels).mean()
    return 0.5 * (loss_q + loss_c), {"accuracy": accuracy}


def make_optimizer(config) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, config.learning_rate, config.warmup_steps, max(config.steps, config.warmup_steps + 1)
    )
    return optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=config.weight_decay)
    )


def make_update(cfg: se.EncoderConfig, optimizer: optax.GradientTransformation, scale: float):
    """update(state, batch) -> (state, metrics), jitted, the state donated."""

    def update(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, cfg, scale)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, opt_state, state.step + 1), {"loss": loss, **metrics}

    return jax.jit(update, donate_argnums=0)


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def make_batch(
    rng: np.random.Generator,
    pools: list[list[data.Pair]],
    shares: list[float],
    tok: se.Tokenizer,
    cfg: se.EncoderConfig,
    size: int,
) -> Batch:
    """`size` distinct pairs, each drawn from pools[i] with probability shares[i] (empty pools skipped), each
    with one of its hard negatives (a random chunk of pools[0] when it has none); duplicates of a label
    are masked out of its row."""
    live = [(pool, share) for pool, share in zip(pools, shares) if pool]
    probs = np.array([share for _, share in live]) / sum(share for _, share in live)
    chosen: list[data.Pair] = []
    seen: set[bytes] = set()
    while len(chosen) < size:
        pool = live[int(rng.choice(len(live), p=probs))][0]
        p = pool[int(rng.integers(len(pool)))]
        if _key(p.chunk) not in seen:
            seen.add(_key(p.chunk))
            chosen.append(p)
    other = pools[0]
    negatives = [
        p.negatives[int(rng.integers(len(p.negatives)))]
        if p.negatives
        else other[int(rng.integers(len(other)))].chunk
        for p in chosen
    ]
    candidates = [p.chunk for p in chosen] + negatives
    keys = np.array([int.from_bytes(_key(t), "little") for t in candidates], np.uint64)
    valid = keys[None, :] != keys[:size, None]
    valid[np.arange(size), np.arange(size)] = True
    return Batch(
        se.pad_rows([tok.encode(p.query, se.QUERY, cfg.query_len) for p in chosen], cfg.query_len),
        se.pad_rows([tok.encode(t, se.CHUNK, cfg.chunk_len) for t in candidates], cfg.chunk_len),
        valid,
    )


def generated_tasks(count: int, seed: int, out: Path) -> list:
    from env.tasks import generator

    return generator.generate_suite(out, count, seed, difficulty=1) if count else []


def load_pairs(config) -> tuple[list[data.Pair], list[data.Pair], list[data.Pair]]:
    """(site-packages function pairs, test-report pairs, task pairs), negatives mined."""
    from env.tasks.task import load_suite

    t0 = time.perf_counter()
    site = data.site_packages_pairs(config.site_files, config.seed)
    data.mine_negatives(site, [p.chunk for p in site])
    reports = data.test_report_pairs(config.report_pairs, config.seed)
    logging.info(
        "search_model: %d site-packages pairs, %d test reports (%.0f s)", len(site), len(reports),
        time.perf_counter() - t0,
    )  # fmt: skip
    tasks = []
    _check_not_held_out(config.suites)
    for suite in filter(None, config.suites.split(",")):
        tasks += data.task_pairs(load_suite(suite))
    with tempfile.TemporaryDirectory() as tmp:
        tasks += data.task_pairs(generated_tasks(config.generated_tasks, config.seed, Path(tmp)))
    logging.info("search_model: %d task pairs (%.0f s)", len(tasks), time.perf_counter() - t0)
    return site, reports, tasks


def _check_not_held_out(suites: str) -> None:
    """Raises if a suite is built from a held-out package (benchmarks/search.py evaluates on those)."""
    from env.tasks.task import load_suite

    dists = data.HELD_OUT_PACKAGES | {p.replace("_", "-") for p in data.HELD_OUT_PACKAGES}
    for suite in filter(None, suites.split(",")):
        sources = {t.metadata.get("source", "") for t in load_suite(suite)}
        bad = sorted(s for s in sources if any(s.startswith(f"pypi:{p}==") for p in dists))
        if bad:
            raise ValueError(f"suite {suite} is built from held-out packages {bad}")


def fit(config, pools: list[list[data.Pair]]) -> tuple[se.EncoderConfig, list[str], dict, list]:
    """Vocabulary and trained params from the pairs (site-packages, test reports, tasks), drawn by
    config.shares: (model config, vocab, numpy params, metrics history)."""
    cfg = model_config(config)
    texts = [t for pool in pools for p in pool for t in (p.query, p.chunk)]
    vocab = build_vocab(texts, cfg.vocab_size, config.vocab_min_count)
    cfg = dataclasses.replace(cfg, vocab_size=len(vocab))
    tok = se.Tokenizer(vocab, cfg.hash_buckets)
    params = encoder.init(jax.random.key(config.seed), cfg)
    optimizer = make_optimizer(config)
    state = TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))
    update = make_update(cfg, optimizer, config.scale)
    logging.info("search_model: %.1f M parameters, vocab %d", encoder.param_count(params) / 1e6, len(vocab))
    history = []
    for step in range(config.steps):
        rng = np.random.default_rng((config.seed, step))
        batch = make_batch(rng, pools, list(config.shares), tok, cfg, config.batch)
        state, metrics = update(state, batch)
        if step % 20 == 0 or step == config.steps - 1:
            m = {k: float(v) for k, v in metrics.items()}
            history.append({"step": step, **m})
            logging.info("search_model: step %d loss %.3f accuracy %.2f", step, m["loss"], m["accuracy"])
    return cfg, vocab, jax.tree.map(np.asarray, state.params), history


def train(config, out: Path | str) -> dict:
    """Makes the pairs, trains, writes the model directory `out`; returns the summary (in config.json too)."""
    t0 = time.perf_counter()
    site, reports, tasks = load_pairs(config)
    t_data = time.perf_counter() - t0
    cfg, vocab, params, history = fit(config, [site, reports, tasks])
    dense_weight, weight_mrr = 1.0, {}
    if config.validation_suites:
        from env.tasks.task import load_suite

        _check_not_held_out(config.validation_suites)
        val = [t for s in config.validation_suites.split(",") for t in load_suite(s)]
        model = se.LearnedEncoder(cfg, vocab, params)
        dense_weight, weight_mrr = evaluate.fit_dense_weight(val, model)
        logging.info("search_model: hybrid MRR by dense weight on validation %s", weight_mrr)
    summary = {
        "seed": config.seed,
        "steps": config.steps,
        "batch": config.batch,
        "site_pairs": len(site),
        "test_report_pairs": len(reports),
        "task_pairs": len(tasks),
        "suites": config.suites,
        "held_out_packages": sorted(data.HELD_OUT_PACKAGES),
        "parameters": int(encoder.param_count(params)),
        "data_s": round(t_data, 1),
        "train_s": round(time.perf_counter() - t0 - t_data, 1),
        "validation_suites": config.validation_suites,
        "validation_mrr_by_dense_weight": {str(k): v for k, v in weight_mrr.items()},
        "history": history,
    }
    se.save(out, cfg, vocab, params, summary, dense_weight)
    return summary
