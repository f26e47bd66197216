"""SFT sequences: the loss on the expert's turns, with the edit turn weighted by sft.edit_weight and the
tokens that write its change by sft.change_weight."""

from types import SimpleNamespace

import numpy as np

from composer.pipeline import sft
from env import chat
from env import tokenizer as tk


def _trajectory(old: str = "a - b", new: str = "a + b") -> list[chat.Message]:
    grep = chat.ToolCall("grep", {"pattern": "def total\\("})
    edit = chat.ToolCall("search_replace", {"file_path": "m.py", "old_string": old, "new_string": new})
    return [
        chat.Message("system", "sys"),
        chat.Message("user", "Bug: wrong total"),
        chat.Message("assistant", "Searching.", [grep]),
        chat.Message("tool", "m.py:1:def total(a, b):"),
        chat.Message("assistant", "Fixing it.", [edit]),
        chat.Message("tool", "updated"),
        chat.Message("assistant", "Done."),
    ]


def test_turn_spans_are_the_runs_of_ones():
    assert sft.turn_spans(np.array([0, 1, 1, 0, 0, 1, 0, 1])) == [(1, 3), (5, 6), (7, 8)]
    assert sft.turn_spans(np.zeros(4)) == []


def _sequences(traj: list[chat.Message], corpus: tuple[str, ...] = (), vocab_size: int = 300, **weights):
    """(tokenizer, the sequence without extra weights, the sequence with `weights`) of one trajectory."""
    tok = tk.train_tokenizer([chat.render_text(traj)] * 10 + list(corpus), vocab_size=vocab_size)
    data = SimpleNamespace(trajectories=[traj], tokenizer=tok)
    return tok, sft.sequences(data)[0], sft.sequences(data, **weights)[0]


def test_the_edit_turn_weighs_edit_weight_times_the_others():
    traj = _trajectory()
    tok, plain, weighted = _sequences(traj, edit_weight=3.0)
    np.testing.assert_array_equal(plain["tokens"], weighted["tokens"])
    spans = sft.turn_spans(plain["loss_mask"])
    assert len(spans) == 3  # one per assistant turn
    edit_len = len(tok.encode(chat.assistant_body(traj[4]) + "<|im_end|>"))
    assert spans[1][1] - spans[1][0] == edit_len
    w = weighted["loss_mask"]
    for k, (s, e) in enumerate(spans):
        assert (w[s:e] == (3.0 if k == 1 else 1.0)).all()
    assert w.sum() == plain["loss_mask"].sum() + 2.0 * edit_len


def _changed_text(old: str, new: str, corpus: tuple[str, ...]) -> str:
    tok, plain, weighted = _sequences(_trajectory(old, new), corpus, 400, change_weight=5.0)
    idx = np.flatnonzero(weighted["loss_mask"] != plain["loss_mask"])
    np.testing.assert_array_equal(weighted["loss_mask"][idx], 5.0)
    return tok.decode([int(plain["tokens"][i]) for i in idx])


def test_change_weight_falls_on_the_tokens_that_write_the_change():
    corpus = ("x = a - b", "y = a + b", "return out", "    return out")
    text = _changed_text("a - b", "a + b", corpus)
    assert text.strip() == "+"  # the operator of new_string only: not old_string's '-', not the shared a, b
    # A longer change, in the middle: what new_string writes between the shared prefix and suffix.
    text = _changed_text("total(rate, months)", "total(months, rate)", corpus)
    assert "months" in text and "rate" in text and "total" not in text
    # A pure deletion (a dedent): the token right after the common prefix, where the copy must stop.
    text = _changed_text("        return out", "    return out", corpus)
    assert text and "out" not in text


def test_change_weight_leaves_turns_without_an_edit_alone():
    _, plain, weighted = _sequences(_trajectory(), change_weight=5.0)
    spans = sft.turn_spans(plain["loss_mask"])
    for k, (s, e) in enumerate(spans):
        if k != 1:
            np.testing.assert_array_equal(weighted["loss_mask"][s:e], plain["loss_mask"][s:e])
    assert (weighted["loss_mask"] > plain["loss_mask"]).sum() >= 1


def test_batch_indices_see_every_sequence_once_an_epoch_in_length_neighbours():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1500, 2200, 203)
    per_epoch = 203 // 2
    epochs = [[sft.batch_indices(lengths, 2, 7, step) for step in range(e * per_epoch, (e + 1) * per_epoch)]
              for e in range(2)]  # fmt: skip
    for batches in epochs:
        seen = np.concatenate(batches)
        assert len(set(seen.tolist())) == len(seen) == 2 * per_epoch  # no repeat within an epoch
    # Each epoch has its own order, and the step alone decides a batch (a resumed run draws the same).
    assert [b.tolist() for b in epochs[0]] != [b.tolist() for b in epochs[1]]
    np.testing.assert_array_equal(sft.batch_indices(lengths, 2, 7, per_epoch + 5), epochs[1][5])
    # Pairs of neighbours by length: far less padding than random pairs.
    spread = np.mean([np.ptp(lengths[b]) for b in epochs[0]])
    random_pairs = np.mean([np.ptp(lengths[rng.choice(203, 2, replace=False)]) for _ in range(1000)])
    assert spread < random_pairs / 5, (spread, random_pairs)
    # ... in a random order: batch lengths do not rise through the epoch.
    firsts = np.array([lengths[b].min() for b in epochs[0]])
    assert abs(np.corrcoef(np.arange(len(firsts)), firsts)[0, 1]) < 0.3
    # Fewer sequences than a batch: every batch repeats some.
    assert sorted(set(sft.batch_indices(lengths[:1], 2, 7, 3).tolist())) == [0]


def test_without_trajectories_sft_is_skipped_and_the_model_is_the_init(tmp_path):
    # A suite on which no trajectory was solved (DATA logs it): RL starts from the random init.
    import jax

    from composer.metrics import MetricsWriter
    from experiments import composer as composer_config

    config = composer_config.get_config("tiny")
    tok = tk.train_tokenizer([chat.render_text(_trajectory())] * 10 + ["assistant\n"] * 100, vocab_size=400)
    data = SimpleNamespace(trajectories=[], tokenizer=tok)
    writer = MetricsWriter(tmp_path)
    try:
        params, cfg = sft.run(config, tmp_path, data, writer)
    finally:
        writer.close()
    assert cfg.vocab_size == config.model.vocab_size and jax.tree.leaves(params)
    assert not (tmp_path / "checkpoints" / "sft").exists()  # nothing trained, nothing saved
