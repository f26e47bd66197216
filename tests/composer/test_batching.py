"""Host batching: buckets, padding, sorting into micro-batches."""

import numpy as np
import pytest

from composer import batching
from composer.pipeline import learner
from experiments import composer as experiment


def test_bucket_length():
    assert batching.bucket_length(1) == 64
    assert batching.bucket_length(64) == 64
    assert batching.bucket_length(65) == 128
    assert batching.bucket_length(300) == 320  # from 4 * 64 up, four buckets an octave
    assert batching.bucket_length(257) == 320 and batching.bucket_length(256) == 256
    assert batching.bucket_length(1700) == 1792 and batching.bucket_length(1793) == 2048
    assert batching.bucket_length(129) == 256  # below 4 * 64, powers of two only
    assert batching.bucket_length(500, max_len=480) == 480


def test_pack_sequences_pads_sorts_and_keeps_every_token():
    rng = np.random.default_rng(0)
    seqs = []
    for n in (5, 70, 12, 33, 3):
        seqs.append(
            {
                "tokens": rng.integers(1, 100, n),
                "loss_mask": rng.integers(0, 2, n),
                "sampler_logprobs": -rng.random(n),
                "advantages": float(n),
                "truncated": n == 12,
            }
        )
    batch = batching.pack_sequences(seqs, micro_batch=2, multiple=16)
    assert batch["tokens"].shape == (3, 2, 80)  # 70 tokens: the bucket 1.25 * 64
    flat = {k: v.reshape((6,) + v.shape[2:]) for k, v in batch.items()}
    lengths = (flat["positions"] >= 0).sum(-1)
    assert list(lengths) == [3, 5, 12, 33, 70, 0]  # sorted; one empty row pads the last micro-batch
    for row, n in enumerate(lengths[:5]):
        seq = next(s for s in seqs if len(s["tokens"]) == n)
        np.testing.assert_array_equal(flat["tokens"][row, :n], seq["tokens"])
        np.testing.assert_array_equal(flat["loss_mask"][row, :n], seq["loss_mask"])
        np.testing.assert_allclose(flat["sampler_logprobs"][row, :n], seq["sampler_logprobs"], rtol=1e-6)
        assert flat["advantages"][row] == n and flat["truncated"][row] == (n == 12)
        assert flat["loss_mask"][row, n:].sum() == 0 and (flat["positions"][row, n:] == -1).all()
    assert flat["loss_mask"][5].sum() == 0


def test_token_aligned_advantages_are_packed_per_token_in_every_sequence_or_none():
    seqs = [
        {"tokens": np.arange(1, n + 1), "loss_mask": np.ones(n), "advantages": np.linspace(-1, 1, n)}
        for n in (4, 9)
    ]
    batch = batching.pack_sequences(seqs, micro_batch=1, multiple=16)
    assert batch["advantages"].shape == batch["tokens"].shape == (2, 1, 16)
    for row, seq in enumerate(seqs):
        n = len(seq["tokens"])
        np.testing.assert_allclose(batch["advantages"][row, 0, :n], seq["advantages"], rtol=1e-6)
        assert (batch["advantages"][row, 0, n:] == 0).all()
    seqs[1]["advantages"] = 0.5
    with pytest.raises(ValueError, match="token-aligned in every sequence"):
        batching.pack_sequences(seqs, micro_batch=1, multiple=16)


def test_the_learner_splits_a_large_batch_into_more_micro_batches_not_larger_ones():
    config = experiment.get_config()
    config.optim.micro_batches, config.optim.micro_batch_rows = 4, 8
    seqs = [{"tokens": np.arange(1, 11), "loss_mask": np.ones(10)} for _ in range(80)]
    assert learner.pack(seqs[:20], config, 20)["tokens"].shape[:2] == (4, 5)  # within the bound
    assert learner.pack(seqs, config, 80)["tokens"].shape[:2] == (10, 8)  # 20 a micro-batch without it
    config.optim.micro_batch_rows = 0
    assert learner.pack(seqs, config, 80)["tokens"].shape[:2] == (4, 20)


def test_micro_batches_are_bounded_by_their_padded_tokens_too():
    config = experiment.get_config()
    config.optim.update(micro_batches=1, micro_batch_rows=0, micro_batch_tokens=1024)
    short = [{"tokens": np.arange(1, 101), "loss_mask": np.ones(100)} for _ in range(16)]  # padded to 128
    assert learner.pack(short, config, 16)["tokens"].shape == (2, 8, 128)
    long = [{"tokens": np.arange(1, 1501), "loss_mask": np.ones(1500)} for _ in range(3)]  # 1536 > the bound
    assert learner.pack(long, config, 3)["tokens"].shape == (3, 1, 1536)  # at least one row each
    config.optim.micro_batch_tokens = 0
    assert learner.pack(short, config, 16)["tokens"].shape == (1, 16, 128)
