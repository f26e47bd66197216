"""The RL phase: skipping updates that carry no policy signal, and episodes that start from the expert's
conversation."""

from types import SimpleNamespace

import numpy as np
import pytest

from composer import chat
from composer.pipeline import data as data_lib
from composer.pipeline import rl, rollouts
from experiments import composer as experiment


def _groups(rewards: list[list[float]]) -> list[list[SimpleNamespace]]:
    def episode(reward):
        return SimpleNamespace(ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], reward=reward,
                               truncated=False)  # fmt: skip

    return [[episode(r) for r in g] for g in rewards]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_all_equal_groups_carry_no_signal_and_mixed_ones_do(algorithm):
    config = experiment.get_config()
    config.rl.algorithm = algorithm
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [1, 1, 1, 1]]), algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [0, 1, 0, 0]]), algorithm)
    assert rl.has_policy_signal(seqs, config.rl)


@pytest.mark.parametrize(
    "override", [("skip_no_signal_updates", False), ("algorithm", "gae"), ("kl_coef", 0.1)]
)
def test_updates_without_advantages_still_run_when_something_else_trains(override):
    config = experiment.get_config()
    setattr(config.rl, *override)
    seqs, _ = rl._sequences(_groups([[0, 0], [0, 0]]), config.rl.algorithm)
    assert rl.has_policy_signal(seqs, config.rl)


def _conversation(edit: bool) -> list[chat.Message]:
    read = chat.ToolCall("read_file", {"target_file": "pkg/mod.py"})
    msgs = [
        chat.Message("system", "sys"),
        chat.Message("user", "Bug: wrong total"),
        chat.Message("assistant", "Reading it.", [read]),
        chat.Message("tool", "     1|def total(xs):"),
    ]
    if edit:
        change = chat.ToolCall(
            "search_replace", {"file_path": "pkg/mod.py", "old_string": "a", "new_string": "b"}
        )
        msgs += [chat.Message("assistant", "Fixing it.", [change]), chat.Message("tool", "updated")]
    return msgs + [chat.Message("assistant", "Done.")]


def test_before_first_edit_keeps_the_read_only_turns():
    prefix = rollouts.before_first_edit(_conversation(edit=True))
    assert [m.role for m in prefix] == ["system", "user", "assistant", "tool"]
    assert prefix[-1].content == "     1|def total(xs):"
    assert rollouts.before_first_edit(_conversation(edit=False)) is None


def _data(n: int) -> SimpleNamespace:
    return SimpleNamespace(expert_by_task={f"pkg__d1-{i}": _conversation(edit=i != 0) for i in range(n)})


def test_expert_starts_take_a_seeded_share_of_the_tasks_with_an_edit():
    config = experiment.get_config()
    data = _data(200)
    config.rl.expert_start_share = 0.0
    assert rl.expert_starts(config, data) == {}
    config.rl.expert_start_share = 1.0
    everything = rl.expert_starts(config, data)
    assert sorted(everything) == sorted(f"pkg__d1-{i}" for i in range(1, 200))  # task 0 never edits
    assert all(len(p) == 4 for p in everything.values())
    config.rl.expert_start_share = 0.5
    half = rl.expert_starts(config, data)
    assert 70 < len(half) < 130 and set(half) < set(everything)
    assert rl.expert_starts(config, data).keys() == half.keys()  # the same tasks on resume
    config.seed = 1
    assert rl.expert_starts(config, data).keys() != half.keys()
    config.rl.expert_start_share = 1.5
    with pytest.raises(ValueError, match="expert_start_share"):
        rl.expert_starts(config, data)


def test_prompt_fn_continues_the_expert_conversation_for_started_tasks():
    config = experiment.get_config()
    prefix = rollouts.before_first_edit(_conversation(edit=True))
    fn = rollouts.prompt_fn(config, {"a": prefix})
    started = fn(SimpleNamespace(instance_id="a", problem_statement="Bug: wrong total"))
    assert started == prefix and started is not prefix  # a copy: the driver may extend it
    fresh = fn(SimpleNamespace(instance_id="b", problem_statement="Bug: other"))
    assert [m.role for m in fresh] == ["system", "user"] and fresh[1].content == "Bug: other"
    assert fresh[0] == rollouts.system_prompt(config)


def test_trajectories_are_matched_to_their_tasks():
    tasks = [SimpleNamespace(instance_id=f"t{i}", problem_statement=s) for i, s in enumerate("ABBC")]

    def conv(report):
        return [chat.Message("system", "s"), chat.Message("user", report)]

    solved = [("t0", conv("A")), (None, conv("C")), (None, conv("B")), ("t2", conv("B"))]
    finals = [m + [chat.Message("assistant", str(i))] for i, (_, m) in enumerate(solved)]
    by_task = data_lib._by_task(solved, finals, tasks)
    # Recorded ids win; older records without one are matched by their report when it is unique ("B" is
    # the report of two tasks, so that record is left out).
    assert by_task == {"t0": finals[0], "t3": finals[1], "t2": finals[3]}


def _tokenizer(messages):
    from composer import tokenizer as tk

    return tk.train_tokenizer([chat.render_text(messages)] * 10, vocab_size=300)


def test_the_expert_guide_trains_only_its_turns_after_the_prefix():
    from composer.tokenizer import render, render_prompt

    messages = _conversation(edit=True)
    prefix = rollouts.before_first_edit(messages)
    tok = _tokenizer(messages)
    guide = rl.guide_sequence(messages, prefix, tok)
    ids, mask = render(messages, tok)
    np.testing.assert_array_equal(guide["tokens"], ids)
    # The policy's episodes from that start see exactly these tokens first.
    n = len(render_prompt(prefix, tok)) - len(tok.encode("<|im_start|>assistant\n"))
    assert not guide["loss_mask"][:n].any()
    after = [m for m in messages[len(prefix) :] if m.role == "assistant"]
    want = sum(len(tok.encode(chat.assistant_body(m) + "<|im_end|>")) for m in after)
    assert guide["loss_mask"].sum() == want == mask[n:].sum()
    assert guide["rewards"] == 1.0 and guide["off_policy"] == 1.0 and not guide["truncated"]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_a_guide_gives_an_unsolved_group_signal(algorithm):
    guide = {"tokens": np.array([1, 2, 3, 4], np.int32), "loss_mask": np.array([0, 0, 1, 1], np.float32),
             "sampler_logprobs": np.zeros(4, np.float32), "rewards": 1.0, "truncated": False,
             "off_policy": 1.0}  # fmt: skip
    seqs, rewards = rl._sequences(_groups([[0, 0, 0], [0, 0, 0]]), algorithm, [guide, None])
    assert rewards.shape == (2, 3) and not rewards.any()  # the episodes' rewards only
    assert len(seqs) == 7
    adv = [s["advantages"] for s in seqs]
    assert adv[3] > 0 and all(a < 0 for a in adv[:3]) and adv[4:] == [0.0, 0.0, 0.0]
    assert [s["off_policy"] for s in seqs] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert rl.has_policy_signal(seqs, experiment.get_config().rl)


def test_a_guide_from_the_report_trains_every_expert_turn():
    from composer.tokenizer import render

    messages = _conversation(edit=True)
    tok = _tokenizer(messages)
    guide = rl.guide_sequence(messages, None, tok)
    np.testing.assert_array_equal(guide["loss_mask"], render(messages, tok)[1])
