"""Host side: turn variable-length token sequences into padded, bucketed [m, b, t] numpy batches.

Lengths are rounded up to a bucket (`multiple` times a power of two, with three more steps in each octave
from 4 * multiple up) so a run compiles a handful of step shapes and pads at most a quarter, and sequences
are sorted by length before being cut into micro-batches so rows of one micro-batch have similar lengths
(little padding).
"""

from collections.abc import Sequence

import numpy as np


def bucket_length(n: int, *, multiple: int = 64, max_len: int | None = None) -> int:
    """The smallest bucket that holds n tokens (capped at max_len): multiple * 2^i, and from 4 * multiple
    up also 1.25, 1.5 and 1.75 times each power (a 1700-token sequence takes 1792, not 2048: with
    attention quadratic in length, a step 0.75x as long)."""
    length = multiple
    while length < n:
        length *= 2
    if length >= 8 * multiple:  # the octave below starts at 4 * multiple: its quarter steps are whole
        half = length // 2
        length = next(half + q * half // 4 for q in (1, 2, 3, 4) if half + q * half // 4 >= n)
    return min(length, max_len) if max_len else length


# Per-sequence values that ride along with the tokens (one per row).
SCALARS = ("advantages", "rewards", "truncated", "off_policy")


def pack_sequences(
    sequences: Sequence[dict],
    *,
    micro_batch: int,
    multiple: int = 64,
    max_len: int | None = None,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Pads and stacks sequences into [m, b, t] arrays (m = micro-batches of b = micro_batch rows).

    Each sequence is a dict with 'tokens' [n] and 'loss_mask' [n] and optionally 'sampler_logprobs' [n]
    (token-aligned) and per-sequence scalars 'advantages', 'rewards', 'truncated', 'off_policy'; the
    'advantages' may instead be token-aligned [n] (in every sequence, then packed [m, b, t]). Rows
    beyond the data are empty (positions -1, mask 0) so the batch shape stays fixed; sequences longer than
    max_len are cut (their tail carries no loss). Returns tokens, positions (-1 on padding), loss_mask,
    and the optional fields.
    """
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]["tokens"]))
    n_rows = -(-max(len(sequences), 1) // micro_batch) * micro_batch
    longest = max((len(s["tokens"]) for s in sequences), default=1)
    t = bucket_length(longest, multiple=multiple, max_len=max_len)
    out = {
        "tokens": np.full((n_rows, t), pad_id, np.int32),
        "positions": np.full((n_rows, t), -1, np.int32),
        "loss_mask": np.zeros((n_rows, t), np.float32),
    }
    has_logprobs = bool(sequences) and "sampler_logprobs" in sequences[0]
    if has_logprobs:
        out["sampler_logprobs"] = np.zeros((n_rows, t), np.float32)
    token_advantages = bool(sequences) and np.ndim(sequences[0].get("advantages", 0.0)) == 1
    if token_advantages:
        out["advantages"] = np.zeros((n_rows, t), np.float32)
    scalars = [
        k for k in SCALARS if sequences and k in sequences[0] and not (token_advantages and k == "advantages")
    ]
    for k in scalars:
        out[k] = np.zeros((n_rows,), bool if k == "truncated" else np.float32)
    for row, i in enumerate(order):
        seq = sequences[i]
        n = min(len(seq["tokens"]), t)
        out["tokens"][row, :n] = seq["tokens"][:n]
        out["positions"][row, :n] = np.arange(n)
        out["loss_mask"][row, :n] = seq["loss_mask"][:n]
        if has_logprobs:
            out["sampler_logprobs"][row, :n] = seq["sampler_logprobs"][:n]
        if token_advantages:
            if np.ndim(seq["advantages"]) != 1:
                raise ValueError("advantages must be token-aligned in every sequence or in none")
            out["advantages"][row, :n] = seq["advantages"][:n]
        for k in scalars:
            out[k][row] = seq[k]
    m = n_rows // micro_batch
    return {k: v.reshape((m, micro_batch) + v.shape[1:]) for k, v in out.items()}
