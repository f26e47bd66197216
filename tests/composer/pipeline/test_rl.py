"""The RL phase: skipping updates that carry no policy signal, and episodes that start from the expert's
conversation."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from composer.pipeline import data as data_lib
from composer.pipeline import expert_members, rl, rollouts, screen
from env import chat
from experiments import composer as experiment


def _groups(
    rewards: list[list[float]], similarity: list[list[float]] | None = None
) -> list[list[SimpleNamespace]]:
    def episode(reward, sim):
        return SimpleNamespace(ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], reward=reward,
                               truncated=False, components={"patch_similarity": sim})  # fmt: skip

    similarity = similarity or [[0.0] * len(g) for g in rewards]
    return [
        [episode(r, x) for r, x in zip(g, xs, strict=True)] for g, xs in zip(rewards, similarity, strict=True)
    ]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_all_equal_groups_carry_no_signal_and_mixed_ones_do(algorithm):
    config = experiment.get_config()
    config.rl.algorithm = algorithm
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [1, 1, 1, 1]]), algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [0, 1, 0, 0]]), algorithm)
    assert rl.has_policy_signal(seqs, config.rl)


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_similarity_shaping_ranks_failed_episodes_below_every_solve(algorithm):
    (solved, near, far, unknown), *_ = _groups([[1, 0, 0, 0]], [[0.2, 0.9, 0.3, 0.0]])
    del unknown.components["patch_similarity"]
    assert [rl.shaped_reward(r, 0.5) for r in (solved, near, far, unknown)] == [1.0, 0.45, 0.15, 0.0]
    assert [rl.shaped_reward(r, 0.0) for r in (solved, near, far)] == [1.0, 0.0, 0.0]
    config = experiment.get_config()
    failed = _groups([[0, 0, 0]], [[0.9, 0.3, 0.3]])
    seqs, rewards = rl._sequences(failed, algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)  # unshaped: three failures are alike
    seqs, rewards = rl._sequences(failed, algorithm, similarity_reward=0.5)
    assert rl.has_policy_signal(seqs, config.rl)
    advantages = [s["advantages"] for s in seqs]
    assert advantages[0] > 0 > advantages[1] == advantages[2]
    assert [s["rewards"] for s in seqs] == pytest.approx([0.45, 0.15, 0.15])
    assert rewards.tolist() == [[0.0, 0.0, 0.0]]  # the episodes' own rewards, as logged


@pytest.mark.parametrize("value", [-0.1, 1.0, 2.0])
def test_similarity_reward_outside_its_range_fails_before_the_phase_starts(value, tmp_path):
    config = experiment.get_config()
    config.rl.similarity_reward = value
    with pytest.raises(ValueError, match="rl.similarity_reward"):
        rl.run(config, tmp_path, None, None, None, None, None)
    assert not any(tmp_path.iterdir())  # nothing was written


def test_error_turns_get_a_negative_advantage_of_their_own_whatever_the_outcome():
    ids = list(range(12))
    mask = [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1]  # three generated turns: [2, 5), [7, 9), [10, 12)
    seq = {"tokens": np.asarray(ids), "loss_mask": np.asarray(mask, np.float32), "advantages": 0.75,
           "truncated": False}  # fmt: skip
    out = rl.error_turn_advantages(seq, [(7, 9)], 0.5, mask_truncated=True)
    expected = np.full(12, 0.75, np.float32)
    expected[7:9] = 0.25
    np.testing.assert_allclose(out["advantages"], expected)
    np.testing.assert_array_equal(out["loss_mask"], mask)
    # A truncated episode's reward says little (masked), its error turns are trained all the same.
    out = rl.error_turn_advantages(dict(seq, truncated=True), [(2, 5), (7, 9)], 0.5, mask_truncated=True)
    assert not out["truncated"]
    np.testing.assert_array_equal(out["loss_mask"], [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0])
    np.testing.assert_allclose(out["advantages"][out["loss_mask"] > 0], -0.5)
    # Without masking, it keeps its sequence advantage too.
    out = rl.error_turn_advantages(dict(seq, truncated=True), [(2, 5)], 0.5, mask_truncated=False)
    np.testing.assert_allclose(out["advantages"][2:5], 0.25)
    np.testing.assert_allclose(out["advantages"][10:], 0.75)


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_an_all_failed_group_with_error_turns_has_signal_and_packs_per_token(algorithm):
    config = experiment.get_config()
    groups = _groups([[0, 0, 0]])
    groups[0][1].error_spans = [(1, 3)]
    for r in (groups[0][0], groups[0][2]):
        r.error_spans = []
    seqs, _ = rl._sequences(groups, algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)  # three failures are alike
    seqs, _ = rl._sequences(groups, algorithm, error_turn_penalty=0.5)
    assert rl.has_policy_signal(seqs, config.rl)
    assert [s["advantages"].tolist() for s in seqs] == [[0, 0, 0], [0, -0.5, -0.5], [0, 0, 0]]
    # A guide (an extra member) has no error turns: per token, its sequence advantage everywhere.
    guide = dict(seqs[0], advantages=0.0, rewards=1.0, off_policy=1.0)
    guide = {k: v for k, v in guide.items() if k != "advantages"}
    seqs, _ = rl._sequences(groups, algorithm, [[guide]], error_turn_penalty=0.5)
    assert len(set(seqs[3]["advantages"].tolist())) == 1 and seqs[3]["advantages"][0] > 0
    batch = rl.learner_lib.pack(seqs, config, len(seqs))
    assert batch["advantages"].shape == batch["tokens"].shape


def test_empty_searches_are_penalised_like_errors_only_when_asked():
    groups = _groups([[0, 0, 0]])
    for r in groups[0]:
        r.error_spans, r.empty_spans = [], []
    groups[0][0].error_spans = [(1, 2)]
    groups[0][1].empty_spans = [(1, 3)]
    groups[0][2].error_spans = groups[0][2].empty_spans = [(1, 3)]  # an error and an empty search: once
    seqs, _ = rl._sequences(groups, "grpo", error_turn_penalty=0.5)
    assert [s["advantages"].tolist() for s in seqs] == [[0, -0.5, 0], [0, 0, 0], [0, -0.5, -0.5]]
    seqs, _ = rl._sequences(groups, "grpo", error_turn_penalty=0.5, empty_searches=True)
    assert [s["advantages"].tolist() for s in seqs] == [[0, -0.5, 0], [0, -0.5, -0.5], [0, -0.5, -0.5]]
    rl_config = experiment.get_config().rl
    rl_config.error_turn_penalty = 0.5
    alike = groups[0][1:2] * 2  # two failures whose only fault is an empty search
    assert not rl.group_has_signal(alike, rl_config, guided=False)
    rl_config.penalize_empty_searches = True
    assert rl.group_has_signal(alike, rl_config, guided=False)


def test_penalising_empty_searches_without_a_penalty_fails_before_the_phase_starts(tmp_path):
    config = experiment.get_config()
    config.rl.penalize_empty_searches = True
    with pytest.raises(ValueError, match="rl.penalize_empty_searches"):
        rl.run(config, tmp_path, None, None, None, None, None)
    assert not any(tmp_path.iterdir())


def test_dynamic_sampling_keeps_groups_whose_advantages_are_not_all_zero():
    rl_config = experiment.get_config().rl
    failed, mixed, solved = (g[0] for g in (_groups([[0, 0]]), _groups([[1, 0]]), _groups([[1, 1]])))
    for r in [*failed, *mixed, *solved]:
        r.error_spans = []
    assert rl.group_has_signal(mixed, rl_config, guided=False)
    assert not rl.group_has_signal(failed, rl_config, guided=False)
    assert rl.group_has_signal(failed, rl_config, guided=True)  # the guide's 1 beside the 0s
    assert not rl.group_has_signal(solved, rl_config, guided=True)
    failed[1].error_spans = [(1, 2)]
    assert not rl.group_has_signal(failed, rl_config, guided=False)  # not penalised: alike
    rl_config.error_turn_penalty = 0.5
    assert rl.group_has_signal(failed, rl_config, guided=False)


@pytest.mark.parametrize("override", [("error_turn_penalty", -0.5), ("algorithm", "gae")])
def test_an_error_turn_penalty_that_cannot_apply_fails_before_the_phase_starts(override, tmp_path):
    config = experiment.get_config()
    config.rl.error_turn_penalty = 0.5
    setattr(config.rl, *override)
    with pytest.raises(ValueError, match="rl.error_turn_penalty"):
        rl.run(config, tmp_path, None, None, None, None, None)
    assert not any(tmp_path.iterdir())


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
    from env import tokenizer as tk

    return tk.train_tokenizer([chat.render_text(messages)] * 10, vocab_size=300)


def test_the_expert_guide_trains_only_its_turns_after_the_prefix():
    from env.tokenizer import render, render_prompt

    messages = _conversation(edit=True)
    prefix = rollouts.before_first_edit(messages)
    tok = _tokenizer(messages)
    guide = expert_members.guide_sequence(messages, prefix, tok)
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
    seqs, rewards = rl._sequences(_groups([[0, 0, 0], [0, 0, 0]]), algorithm, [[guide], []])
    assert rewards.shape == (2, 3) and not rewards.any()  # the episodes' rewards only
    assert len(seqs) == 7
    adv = [s["advantages"] for s in seqs]
    assert adv[3] > 0 and all(a < 0 for a in adv[:3]) and adv[4:] == [0.0, 0.0, 0.0]
    assert [s["off_policy"] for s in seqs] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert rl.has_policy_signal(seqs, experiment.get_config().rl)


def test_a_guide_from_the_report_trains_every_expert_turn():
    from env.tokenizer import render

    messages = _conversation(edit=True)
    tok = _tokenizer(messages)
    guide = expert_members.guide_sequence(messages, None, tok)
    np.testing.assert_array_equal(guide["loss_mask"], render(messages, tok)[1])


def _expert_and_episode():
    """The expert's trajectory on a task, and an episode on it whose own reads show the buggy line and whose
    edit changes nothing (old_string copied into new_string)."""
    from env.expert import TEST_COMMAND

    test = chat.ToolCall("run_terminal_cmd", {"command": TEST_COMMAND, "is_background": False})
    grep = chat.ToolCall("grep", {"pattern": r"def total\(", "-A": 12})
    fix = {"file_path": "pkg/mod.py", "old_string": "    return a - b", "new_string": "    return a + b"}
    code = "pkg/mod.py:1:def total(a, b):\npkg/mod.py-2-    return a - b"
    edit = chat.ToolCall("search_replace", fix)
    expert = [
        chat.Message("system", "sys"),
        chat.Message("user", "Bug: wrong total"),
        chat.Message("assistant", "I'll start by running the test suite.", [test]),
        chat.Message("tool", "1 failed"),
        chat.Message("assistant", "Let me find `total`.", [grep]),
        chat.Message("tool", code),
        chat.Message("assistant", "Found the bug in `total`. Let me fix it.", [edit]),
        chat.Message("tool", "updated"),
        chat.Message("assistant", "Done."),
    ]
    noop = dict(fix, new_string=fix["old_string"])
    episode = [
        *expert[:4],
        chat.Message("assistant", "Let me look for it.", [chat.ToolCall("grep", {"pattern": "total"})]),
        chat.Message("tool", "tests/test_mod.py:3:    assert total(1, 2) == 3"),
        chat.Message("assistant", "And its definition.", [grep]),
        chat.Message("tool", code),
        chat.Message("assistant", "Fixing it.", [chat.ToolCall("search_replace", noop)]),
        chat.Message("tool", "Error: new_string is the same as old_string"),
        chat.Message("assistant", "Done."),
    ]
    return expert, episode


def _assert_trains_the_turn_alone(seq: dict, prefix: list, turn: chat.Message, tok) -> int:
    """`seq` is `prefix` then the expert's `turn`, with the loss on that turn's tokens alone, reward 1,
    off-policy; returns its length."""
    from env.tokenizer import render

    ids, _ = render([*prefix, turn], tok)
    np.testing.assert_array_equal(seq["tokens"], ids)
    want = len(tok.encode(chat.assistant_body(turn) + "<|im_end|>"))
    n_prefix = len(render(prefix, tok)[0])
    assert seq["loss_mask"].sum() == want and not seq["loss_mask"][:n_prefix].any()
    assert seq["rewards"] == 1.0 and seq["off_policy"] == 1.0 and not seq["truncated"]
    return len(ids)


def test_a_correction_puts_the_expert_edit_where_the_episode_saw_the_code():

    expert, episode = _expert_and_episode()
    tok = _tokenizer(expert + episode)
    # The first turn after the read that showed `return a - b` (not after the grep that missed it).
    assert expert_members.correction_prefix(episode, expert[6]) == episode[:8]
    seq = expert_members.correction_sequence(episode, expert, tok, max_len=4096)
    n = _assert_trains_the_turn_alone(seq, episode[:8], expert[6], tok)
    # Too long for the learner: none.
    assert expert_members.correction_sequence(episode, expert, tok, max_len=n - 1) is None


def test_no_correction_without_the_code_shown_or_after_a_change_to_the_workspace():
    expert, episode = _expert_and_episode()
    tok = _tokenizer(expert + episode)
    # The episode never read the buggy line.
    assert expert_members.correction_sequence(episode[:6] + episode[-1:], expert, tok, 4096) is None
    # The code only in the test run's output (a traceback), not in a read: not yet where the expert edits.
    shown_by_tests = [*episode[:3], chat.Message("tool", "pkg/mod.py:2: return a - b"), episode[-1]]
    assert expert_members.correction_prefix(shown_by_tests, expert[6]) is None
    # A terminal command other than the tests may have changed the files.
    sed = chat.ToolCall("run_terminal_cmd", {"command": "sed -i s/-/+/ pkg/mod.py"})
    changed = [*episode[:2], chat.Message("assistant", "Patching.", [sed]), *episode[3:]]
    assert expert_members.correction_prefix(changed, expert[6]) is None
    # The episode's own turn there already is the expert's edit: nothing to add.
    same = [*episode[:8], expert[6], *episode[9:]]
    assert expert_members.correction_sequence(same, expert, tok, 4096) is None


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_corrections_join_the_guide_in_the_group(algorithm):
    member = {"tokens": np.array([1, 2, 3, 4], np.int32), "loss_mask": np.array([0, 0, 1, 1], np.float32),
              "sampler_logprobs": np.zeros(4, np.float32), "rewards": 1.0, "truncated": False,
              "off_policy": 1.0}  # fmt: skip
    seqs, rewards = rl._sequences(_groups([[0, 0, 0, 0]]), algorithm, [[member, member, member]])
    assert rewards.shape == (1, 4) and len(seqs) == 7
    adv = np.array([s["advantages"] for s in seqs])
    assert (adv[:4] < 0).all() and (adv[4:] > 0).all()
    np.testing.assert_allclose(adv[4:], adv[4])


def _result(messages, reward=0.0):
    """An episode's result as group_corrections reads it."""
    return SimpleNamespace(messages=messages, reward=reward)


def test_a_group_gets_each_correction_once_and_none_the_guide_holds():
    expert, episode = _expert_and_episode()
    tok = _tokenizer(expert + episode)
    # Two unsolved episodes at the same state, one solved: one correction.
    group = [_result(episode), _result(episode), _result(episode, reward=1.0)]
    fixes = expert_members.group_corrections(group, expert, [], tok, 4096)
    assert len(fixes) == 1
    np.testing.assert_array_equal(
        fixes[0]["tokens"], expert_members.correction_sequence(episode, expert, tok, 4096)["tokens"]
    )
    # An episode that failed from the expert's reads: its correction is the start of the guide's sequence.
    from_start = [
        *expert[:6],
        chat.Message("assistant", "Fixing.", [chat.ToolCall("grep", {"pattern": "x"})]),
    ]
    guide = expert_members.guide_sequence(expert, rollouts.before_first_edit(expert), tok)
    assert expert_members.group_corrections([_result(from_start)], expert, [], tok, 4096)
    assert expert_members.group_corrections([_result(from_start)], expert, [guide], tok, 4096) == []
    # No expert trajectory for the task: none.
    assert expert_members.group_corrections(group, None, [], tok, 4096) == []


def _failed_grep_episode():
    """The expert's trajectory (_expert_and_episode), and an episode that ran the tests as the expert did,
    then wrote its search as invalid JSON, got an error, and went on with a broken call."""
    expert, _ = _expert_and_episode()
    call = '{"name": "grep", "arguments": {"pattern": "grep", "x"}}'
    malformed = f"Let me find `total`.\n<tool_call>\n{call}\n</tool_call>"
    episode = [
        *expert[:4],
        chat.Message("assistant", malformed),
        chat.Message("tool", "Error: malformed tool call: invalid JSON: Expecting ':' delimiter"),
        chat.Message("assistant", '<tool_call>\n{"name": "run_terminal_cmd"}}\n</tool_call>'),
        chat.Message("tool", "Error: malformed tool call: invalid JSON: Extra data"),
    ]
    return expert, episode


def test_a_recovery_puts_the_expert_turn_after_the_first_failed_step():

    expert, episode = _failed_grep_episode()
    tok = _tokenizer(expert + episode)
    # After the malformed search and its error, the expert's search (not after the second broken call).
    assert expert_members.recovery_prefix(episode, expert) == (episode[:6], expert[4])
    seq = expert_members.recovery_sequence(episode, expert, tok, max_len=4096)
    n = _assert_trains_the_turn_alone(seq, episode[:6], expert[4], tok)
    assert expert_members.recovery_sequence(episode, expert, tok, max_len=n - 1) is None
    # A well-formed search for the wrong name, which found nothing, is a failed step too.
    missed = chat.Message("assistant", "Let me find it.", [chat.ToolCall("grep", {"pattern": "def totl"})])
    empty = [*expert[:4], missed, chat.Message("tool", "No matches found"), expert[-1]]
    assert expert_members.recovery_prefix(empty, expert) == (empty[:6], expert[4])


def test_no_recovery_on_the_expert_path_off_it_without_a_failure_or_after_a_change():
    expert, other_path = _expert_and_episode()
    # Every turn the expert's: nothing to recover from.
    assert expert_members.recovery_prefix(expert, expert) is None
    # A different search that found something: another path, not a mistake (its no-op edit comes later).
    assert expert_members.recovery_prefix(other_path, expert) is None
    # A failed search beside an edit that applied: the expert's next turn may not hold for the files.
    edit = chat.ToolCall("search_replace", {"file_path": "pkg/mod.py", "old_string": "a", "new_string": "b"})
    miss = chat.ToolCall("grep", {"pattern": "def totl"})
    changed = [
        *expert[:4],
        chat.Message("assistant", "Trying.", [edit, miss]),
        chat.Message("tool", "The file pkg/mod.py has been updated."),
        chat.Message("tool", "No matches found"),
    ]
    assert expert_members.recovery_prefix(changed, expert) is None
    # The same in a turn kept as raw text (one of its calls malformed): the edit still ran.
    raw = (
        chat.assistant_body(chat.Message("assistant", "Trying.", [edit]))
        + '\n<tool_call>\n{"name"\n</tool_call>'
    )
    changed_raw = [
        *expert[:4],
        chat.Message("assistant", raw),
        chat.Message("tool", "The file pkg/mod.py has been updated."),
        chat.Message("tool", "Error: malformed tool call: invalid JSON"),
    ]
    assert expert_members.recovery_prefix(changed_raw, expert) is None
    # An edit that could not apply changed nothing: the expert's search still holds after it.
    refused = [*changed_raw[:5], chat.Message("tool", "Error: old_string not found"), changed_raw[6]]
    assert expert_members.recovery_prefix(refused, expert) == (refused, expert[4])
    # Past the expert's last call (its final answer): nothing to show.
    after = [
        *expert[:-1],
        chat.Message("assistant", "More.", [miss]),
        chat.Message("tool", "No matches found"),
    ]
    assert expert_members.recovery_prefix(after, expert) is None


def test_a_group_gets_each_recovery_once_beside_its_edit_corrections():
    expert, episode = _expert_and_episode()
    _, failed = _failed_grep_episode()
    tok = _tokenizer(expert + episode + failed)
    group = [_result(failed), _result(failed), _result(episode), _result(failed, reward=1.0)]
    recoveries = expert_members.group_corrections(
        group, expert, [], tok, 4096, expert_members.recovery_sequence
    )
    assert len(recoveries) == 1
    np.testing.assert_array_equal(
        recoveries[0]["tokens"], expert_members.recovery_sequence(failed, expert, tok, 4096)["tokens"]
    )
    # The other-path episode gets an edit correction, the failed one none (it never read the code).
    edits = expert_members.group_corrections(group, expert, recoveries, tok, 4096)
    np.testing.assert_array_equal(
        [e["tokens"] for e in edits],
        [expert_members.correction_sequence(episode, expert, tok, 4096)["tokens"]],
    )
    # One already among the members is not added again.
    assert (
        expert_members.group_corrections(
            group, expert, recoveries, tok, 4096, expert_members.recovery_sequence
        )
        == []
    )


def _tasks(n: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(instance_id=f"t{i}") for i in range(n)]


def test_the_screen_keeps_the_failed_tasks_in_order_and_drops_ungraded_ones():
    tasks = _tasks(5)
    rewards = {"t0": 1.0, "t1": 0.0, "t2": None, "t4": 0.0}  # t3 not screened
    assert [t.instance_id for t in screen.failed_tasks(tasks, rewards)] == ["t1", "t4"]


def _screen_config(n: int):
    config = experiment.get_config()
    config.rl.screen_tasks = n
    return config


def test_rl_draws_from_the_screened_tasks_the_model_failed(monkeypatch, tmp_path):
    data = SimpleNamespace(rl_tasks=_tasks(20))
    seen = []

    def fake_screen(config, workdir, params, cfg, tokenizer, tasks, prompt_fn):
        seen.append([t.instance_id for t in tasks])
        return {t.instance_id: float(i % 3 != 0) for i, t in enumerate(tasks)}

    monkeypatch.setattr(screen, "screen", fake_screen)
    failed = rl.screened_tasks(_screen_config(7), tmp_path, data, None, None, None, {})
    (sample,) = seen
    # A seeded sample of 7 distinct train tasks, the same on every call (a resumed run draws the same).
    assert len(set(sample)) == 7 and set(sample) <= {t.instance_id for t in data.rl_tasks}
    assert [t.instance_id for t in failed] == sample[::3]
    rl.screened_tasks(_screen_config(7), tmp_path, data, None, None, None, {})
    assert seen[1] == sample
    # Off, or a model that failed none of them: RL draws from every task it may.
    assert rl.screened_tasks(_screen_config(0), tmp_path, data, None, None, None, {}) is data.rl_tasks
    monkeypatch.setattr(screen, "screen", lambda *a: {t.instance_id: 1.0 for t in a[5]})
    assert rl.screened_tasks(_screen_config(7), tmp_path, data, None, None, None, {}) is data.rl_tasks
    with pytest.raises(ValueError, match="rl.screen_tasks"):
        rl.screened_tasks(_screen_config(-1), tmp_path, data, None, None, None, {})


def test_a_saved_screen_is_read_back_only_for_the_same_tasks(tmp_path):
    tasks = _tasks(3)
    saved = {"tasks": ["t0", "t1", "t2"], "rewards": {"t0": 1.0, "t1": 0.0, "t2": 1.0}}
    (tmp_path / screen.SCREEN_FILE).write_text(json.dumps(saved))
    config = _screen_config(3)
    assert screen.screen(config, tmp_path, None, None, None, tasks, None) == saved["rewards"]
    # Other tasks (a changed config): it screens again, which needs a model (none here).
    with pytest.raises(AttributeError):
        screen.screen(config, tmp_path, None, None, None, tasks[:2], None)


def test_a_generated_suite_comes_in_the_order_a_rerun_loads_it(tmp_path):
    # RL's task stream and the screen index the train list: a resumed run, which loads the suite from the
    # workdir, must see the tasks in the order the first run generated them.
    config = experiment.get_config("tiny")
    config.env.n_train_tasks = 12
    fresh = data_lib.task_suite(config, tmp_path / "a", "train")
    loaded = data_lib.task_suite(config, tmp_path / "a", "train")
    assert [t.instance_id for t in loaded] == [t.instance_id for t in fresh] and len(fresh) == 12
    # In seed order, which directory names are not: so a larger suite begins with the smaller one's tasks
    # (SFT's first sft.n_trajectories stay the same when env.n_train_tasks grows for rl.unseen_tasks).
    seeds = [t.metadata["seed"] for t in loaded]
    assert seeds == sorted(seeds) and [t.path.name for t in loaded] != sorted(t.path.name for t in loaded)
    config.env.n_train_tasks = 16
    larger = data_lib.task_suite(config, tmp_path / "b", "train")
    assert [t.instance_id for t in larger[:12]] == [t.instance_id for t in fresh]


def test_unseen_tasks_need_train_tasks_past_sfts(tmp_path):
    config = experiment.get_config("tiny")
    config.rl.unseen_tasks = True
    config.env.n_train_tasks = config.sft.n_trajectories
    with pytest.raises(ValueError, match=r"rl.unseen_tasks: .*n_train_tasks \(8\) must exceed"):
        data_lib.prepare(config, tmp_path)
    assert not any(tmp_path.iterdir())  # it failed before generating anything


def test_the_task_stream_resumes_at_its_position_and_needs_tasks():
    tasks = _tasks(5)
    whole = rl._task_stream(tasks, 0, 0, 12)
    # Every task once per epoch, and a stream resumed at position 7 continues the same sequence.
    assert sorted(t.instance_id for t in whole[:5]) == [t.instance_id for t in tasks]
    assert rl._task_stream(tasks, 0, 7, 5) == whole[7:]
    with pytest.raises(ValueError, match="no train tasks"):
        rl._task_stream([], 0, 0, 4)  # (an empty list would cycle forever)
