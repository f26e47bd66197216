"""SFT: the supervised warm start on expert trajectories, until the model makes valid tool calls.

Checkpoints every `checkpoint.every_steps` steps and at the end; a rerun resumes from the last one (batches
are a function of the step number, `batch_indices`, so a resumed run sees the same data as an uninterrupted
one).
"""

import re
from pathlib import Path

import jax
import ml_collections
import numpy as np
from absl import logging
from tqdm import tqdm

from composer import copy_head, train
from composer.checkpoint import Checkpointer, finish_saves_on_sigterm
from composer.metrics import MetricsWriter
from composer.pipeline import learner as learner_lib
from composer.pipeline.data import Data
from env.tokenizer import render
from env.tools import EDIT_TOOLS


def turn_spans(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in `mask`: one per assistant turn (`render` always puts a non-loss
    token, the newline after `<|im_end|>`, between two turns)."""
    padded = np.concatenate([[0], np.asarray(mask) > 0, [0]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


# A search_replace call's two strings as the chat template renders them (JSON, old_string before new_string).
_EDIT_ARGS = re.compile(r'"old_string": "(?P<old>(?:[^"\\]|\\.)*)", "new_string": "(?P<new>(?:[^"\\]|\\.)*)"')


def changed_tokens(ids: np.ndarray, start: int, end: int, tokenizer) -> list[int]:
    """Positions in [start, end) (an assistant turn) of the tokens of each search_replace call's new_string
    that write what differs from its old_string: between the two token sequences' common prefix and common
    suffix (for a pure deletion, the token after the common prefix). Empty when the turn holds no such call
    or its text cannot be split into tokens exactly."""
    turn = [int(t) for t in ids[start:end]]
    pieces = [tokenizer.decode([t]) for t in turn]
    text = "".join(pieces)
    if text != tokenizer.decode(turn):
        return []  # a token that is not whole characters: offsets would not line up
    ends = np.cumsum([len(p) for p in pieces])

    def tokens_of(m: re.Match, group: str) -> list[int]:
        """The turn's tokens that overlap the group's characters (an empty string: the token at its start);
        token i covers characters [ends[i - 1], ends[i])."""
        lo, hi = m.start(group), max(m.end(group), m.start(group) + 1)
        return list(
            range(
                int(np.searchsorted(ends, lo, side="right")),
                int(np.searchsorted(ends, hi - 1, side="right")) + 1,
            )
        )

    out = []
    for m in _EDIT_ARGS.finditer(text):
        old, new = tokens_of(m, "old"), tokens_of(m, "new")
        pre = 0
        while pre < min(len(old), len(new)) and turn[old[pre]] == turn[new[pre]]:
            pre += 1
        suf = 0
        while suf < min(len(old), len(new)) - pre and turn[old[-1 - suf]] == turn[new[-1 - suf]]:
            suf += 1
        changed = new[pre : len(new) - suf] or new[pre : pre + 1]
        out.extend(start + i for i in changed)
    return out


# Sequences are grouped by length within windows of this many (`batch_indices`).
LENGTH_WINDOW = 64


def batch_indices(lengths: np.ndarray, batch_size: int, seed: int, step: int, window: int = LENGTH_WINDOW):
    """The sequences of SFT step `step`: epochs in a seeded random order, so every sequence is seen once
    per epoch; within each window of `window` sequences of that order, batches of neighbours by length.

    A batch is padded to its longest sequence (one compiled step per length bucket), so random pairs of
    the default's trajectories (1500 to 2200 tokens) padded 19% more than each sequence alone would
    (attention being quadratic in length); pairs of neighbours by length, ~10%. The batches of a window
    come in a random order, and a window is a random sample of the data, so neither the order of the
    data nor the lengths steer training. A function of the step alone: a resumed run draws the same
    batches. An epoch ends with its last whole batch (the rest lead the next epoch's random order).
    """
    n = len(lengths)
    if n < batch_size:  # fewer sequences than one batch: every batch repeats some
        return np.random.default_rng([seed, step]).choice(n, size=batch_size, replace=True)
    per_epoch = n // batch_size
    epoch, k = divmod(step, per_epoch)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)[: per_epoch * batch_size]
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start : start + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        chunk = chunk[: len(chunk) // batch_size * batch_size].reshape(-1, batch_size)
        batches.extend(chunk[rng.permutation(len(chunk))])
    # A window that is not a multiple of batch_size drops its longest; they cannot be lost from the
    # epoch, so they form the epoch's last batches.
    used = np.concatenate(batches) if batches else np.zeros(0, int)
    rest = np.setdiff1d(order, used, assume_unique=True)
    rest = rest[np.argsort(lengths[rest], kind="stable")]
    batches.extend(rest[: len(rest) // batch_size * batch_size].reshape(-1, batch_size))
    return batches[k]


def sequences(data: Data, edit_weight: float = 1.0, change_weight: float = 1.0) -> list[dict]:
    """Each trajectory as token ids with the loss on the expert's (assistant) tokens only; the tokens of a
    turn that edits a file weigh `edit_weight` times the others, and within it the tokens that write the
    change (`changed_tokens`) `change_weight` times more."""
    out = []
    for messages in data.trajectories:
        ids, mask = render(messages, data.tokenizer)
        weights = mask.astype(np.float32)
        if edit_weight != 1.0 or change_weight != 1.0:
            turns = [m for m in messages if m.role == "assistant"]
            spans = turn_spans(mask)
            if len(spans) != len(turns):
                raise AssertionError(f"{len(turns)} assistant turns rendered as {len(spans)} loss spans")
            for m, (start, end) in zip(turns, spans):
                if any(tc.name in EDIT_TOOLS for tc in m.tool_calls):
                    weights[start:end] *= edit_weight
                    if change_weight != 1.0:
                        weights[changed_tokens(ids, start, end, data.tokenizer)] *= change_weight
        out.append({"tokens": ids, "loss_mask": weights})
    return out


def build(
    config: ml_collections.ConfigDict, cfg, line_tokens: copy_head.LineTokens | None, init_params=None
) -> learner_lib.Learner:
    return learner_lib.build(
        config,
        cfg,
        learning_rate=config.sft.learning_rate,
        total_steps=config.sft.steps,
        step_fn=train.sft_step,
        line_tokens=line_tokens,
        init_params=init_params,
    )


def _checkpointer(config: ml_collections.ConfigDict, workdir: Path) -> Checkpointer:
    return Checkpointer(
        workdir / "checkpoints" / "sft",
        max_to_keep=config.checkpoint.max_to_keep,
        save_every=config.checkpoint.every_steps,
    )


def restore_latest(config: ml_collections.ConfigDict, workdir: Path, cfg, line_tokens, init_params=None):
    """(params, step) of the SFT phase's latest checkpoint in `workdir` (a model of `cfg`; init_params as
    for `build`), or None when there is none."""
    ckpt = _checkpointer(config, workdir)
    try:
        step = ckpt.latest_step()
        if step is None:
            return None
        learner = build(config, cfg, line_tokens, init_params)
        learner.state, _ = ckpt.restore(learner.state)
        return learner.params, step
    finally:
        ckpt.close()


def run(config: ml_collections.ConfigDict, workdir: Path, data: Data, writer: MetricsWriter):
    """Trains (or resumes, or just loads when complete) the SFT model; returns its params."""
    init_params = None
    if config.model.init_from:
        # Start from the pretrained checkpoint: its architecture, weights and tokenizer (DATA used it too).
        from composer import sharding
        from composer.checkpoints import load_pretrained

        init_params, cfg, _ = load_pretrained(config, sharding.make_mesh(config.mesh))
    else:
        cfg = learner_lib.model_config(config, data.tokenizer)
    learner = build(config, cfg, learner_lib.line_tokens(cfg, data.tokenizer), init_params)
    if not data.trajectories:  # a suite without solved trajectories (DATA said so): RL starts from here
        logging.warning(
            "SFT: skipped, no trajectories: the model is %s", config.model.init_from or "the random init"
        )
        return learner.params, cfg
    steps = config.sft.steps
    ckpt = _checkpointer(config, workdir)
    start = ckpt.latest_step() or 0
    if start:
        learner.state, _ = ckpt.restore(learner.state)
    if start >= steps:
        logging.info("SFT: complete (%d steps), loaded from %s", start, ckpt.directory)
        ckpt.close()
        return learner.params, cfg
    finish_saves_on_sigterm(ckpt)
    seqs = sequences(data, config.sft.edit_weight, config.sft.change_weight)
    lengths = np.array([len(s["tokens"]) for s in seqs])
    logging.info(
        "SFT: %d trajectories, tokens per trajectory: mean %d, max %d",
        len(seqs),
        lengths.mean(),
        lengths.max(),
    )
    key = jax.random.key(config.seed)
    with tqdm(total=steps, initial=start, desc="SFT", unit="step") as bar:
        for step in range(start, steps):
            chosen = batch_indices(lengths, config.sft.batch_size, config.seed, step)
            batch = learner_lib.pack([seqs[i] for i in chosen], config, config.sft.batch_size)
            metrics = learner.step(batch, jax.random.fold_in(key, step))
            metrics = jax.device_get(metrics)
            writer.write("sft", step + 1, metrics)
            bar.set_postfix(loss=f"{float(metrics['loss']):.3f}")
            bar.update()
            ckpt.save(step + 1, learner.state, {"step": step + 1}, force=step + 1 == steps)
    ckpt.close()
    return learner.params, cfg
