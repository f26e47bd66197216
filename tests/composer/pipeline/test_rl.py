"""The RL phase: its filter and advantages, skipping updates that carry no policy signal, and the extras
that plug into it (episodes that start from the expert's conversation, the expert's guide member)."""

import collections
from types import SimpleNamespace

import numpy as np
import pytest

from composer.pipeline import data as data_lib
from composer.pipeline import expert_members, expert_starts, rl, rollouts
from composer.pipeline.rl_extras import EpisodeStarts, Extras, GroupAugmenter
from env import chat
from experiments import composer as experiment


def _groups(rewards: list[list[float | None]]) -> list[list[SimpleNamespace]]:
    """Groups of episode results as the loop reads them: group g holds the episodes of task t<g>."""

    def episode(g, i, reward):
        return SimpleNamespace(ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -1.0, -2.0], reward=reward,
                               truncated=False, task_id=f"t{g}", group=g, episode_id=f"t{g}-{i}")  # fmt: skip

    return [[episode(g, i, r) for i, r in enumerate(rs)] for g, rs in enumerate(rewards)]


@pytest.mark.parametrize("algorithm", ["grpo", "drgrpo", "rloo"])
def test_all_equal_groups_carry_no_signal_and_mixed_ones_do(algorithm):
    config = experiment.get_config()
    config.rl.algorithm = algorithm
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [1, 1, 1, 1]]), algorithm)
    assert not rl.has_policy_signal(seqs, config.rl)
    assert rl._update(None, seqs, config, None) == {"update_skipped": 1.0}  # the learner is not called
    seqs, _ = rl._sequences(_groups([[0, 0, 0, 0], [0, 1, 0, 0]]), algorithm)
    assert rl.has_policy_signal(seqs, config.rl)


def test_dynamic_sampling_keeps_groups_whose_advantages_are_not_all_zero():
    failed, mixed, solved = (g[0] for g in (_groups([[0, 0]]), _groups([[1, 0]]), _groups([[1, 1]])))
    guide = {"rewards": 1.0}
    assert rl.group_has_signal(mixed, [])
    assert not rl.group_has_signal(failed, [])
    assert rl.group_has_signal(failed, [guide])  # the guide's 1 beside the 0s
    assert not rl.group_has_signal(solved, [guide])


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
    assert expert_starts.expert_starts(config, data).by_task == {}
    config.rl.expert_start_share = 1.0
    everything = expert_starts.expert_starts(config, data).by_task
    assert sorted(everything) == sorted(f"pkg__d1-{i}" for i in range(1, 200))  # task 0 never edits
    assert all(len(p) == 4 for p in everything.values())
    config.rl.expert_start_share = 0.5
    half = expert_starts.expert_starts(config, data).by_task
    assert 70 < len(half) < 130 and set(half) < set(everything)
    assert expert_starts.expert_starts(config, data).by_task.keys() == half.keys()  # the same tasks on resume
    config.seed = 1
    assert expert_starts.expert_starts(config, data).by_task.keys() != half.keys()
    config.rl.expert_start_share = 1.5
    with pytest.raises(ValueError, match="expert_start_share"):
        expert_starts.expert_starts(config, data)


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


def test_the_guide_augmenter_adds_the_expert_member_and_gives_a_failed_group_signal():
    messages = _conversation(edit=True)
    tok = _tokenizer(messages)
    prefix = rollouts.before_first_edit(messages)
    data = SimpleNamespace(expert_by_task={"t0": messages})  # task t1 has no trajectory
    augmenter = expert_members.guide_augmenter(data, {"t0": prefix}, tok)
    failed, other = _groups([[0, 0, 0], [0, 0, 0]])
    (guide,) = augmenter.members(failed)
    want = expert_members.guide_sequence(messages, prefix, tok)
    np.testing.assert_array_equal(guide["tokens"], want["tokens"])
    np.testing.assert_array_equal(guide["loss_mask"], want["loss_mask"])
    assert augmenter.members(other) == []
    assert rl.group_has_signal(failed, [guide]) and not rl.group_has_signal(other, [])
    seqs, rewards = rl._sequences([failed, other], "grpo", [[guide], []])
    assert seqs[3]["off_policy"] == 1.0 and seqs[3]["advantages"] > 0 > seqs[0]["advantages"]
    assert rewards.tolist() == [[0, 0, 0], [0, 0, 0]]  # the episodes' rewards only


def test_extras_add_each_augmenters_members_in_order_and_count_the_groups_it_added_to():
    def augmenter(name):
        return GroupAugmenter(
            name, lambda g: [] if g[0].task_id == "t1" else [{"from": name, "rewards": 1.0}]
        )

    extras = Extras(EpisodeStarts("none", {}), (augmenter("a"), augmenter("b")))
    batch = _groups([[0, 0], [0, 0], [1, 0]])
    counts = collections.Counter()
    members = extras.augment(batch, counts)
    assert [[m["from"] for m in x] for x in members] == [["a", "b"], [], ["a", "b"]]
    assert counts == {"a_groups": 2, "b_groups": 2}
    assert extras.members(batch[0]) == members[0]


def test_the_config_turns_the_guide_on_and_off():
    config = experiment.get_config()
    extras = rl.build_extras(config, _data(4), None)
    assert [a.name for a in extras.augmenters] == ["guided"] and extras.starts.name == "expert_start"
    config.rl.expert_guidance = False
    assert rl.build_extras(config, _data(4), None).augmenters == ()


def test_the_filter_drops_broken_stale_and_signal_less_groups_up_to_a_budget_a_step():
    config = experiment.get_config()
    config.rl.tasks_per_step = 2  # the no-signal budget: dynamic_sampling_budget (1) x 2 groups a step
    groups = _groups([[1, 0], [0, None], [0, 1], [1, 1], [0, 1], [0, 0], [0, 0], [1, 1], [0, 0]])
    engine = SimpleNamespace(oldest={"t2-0": -2})  # an episode of group 2 began 2 policy versions ago
    guide = GroupAugmenter("guided", lambda g: [{"rewards": 1.0}] if g[0].task_id == "t5" else [])
    extras = Extras(EpisodeStarts("expert_start", {"t0": []}), (guide,))
    progress = rl._Progress()
    batches = rl._collect(groups, engine, progress, config.rl, extras, start=10)
    assert [g[0].task_id for g in next(batches)] == ["t0", "t4"]
    assert dict(progress.counts) == {
        "groups": 5, "groups_dropped_error": 1, "groups_dropped_stale": 1, "groups_dropped_no_signal": 1,
        "episodes": 6, "solved": 4, "episodes_expert_start": 2, "solved_expert_start": 1,
    }  # fmt: skip
    assert progress.stream_position == 15 and not engine.oldest
    progress.next_step()
    # The guided group has signal; the budget starts afresh, and past it a group without signal is kept.
    assert [g[0].task_id for g in next(batches)] == ["t5", "t8"]
    assert dict(progress.counts) == {
        "groups": 4, "groups_dropped_error": 1, "groups_dropped_stale": 1, "groups_dropped_no_signal": 3,
        "groups_kept_no_signal": 1, "episodes": 8, "solved": 2,
    }  # fmt: skip
    assert next(batches, None) is None


def test_a_generated_suite_comes_in_the_order_a_rerun_loads_it(tmp_path):
    # RL's task stream and SFT index the train list: a resumed run, which loads the suite from the
    # workdir, must see the tasks in the order the first run generated them.
    config = experiment.get_config("tiny")
    config.env.n_train_tasks = 12
    fresh = data_lib.task_suite(config, tmp_path / "a", "train")
    loaded = data_lib.task_suite(config, tmp_path / "a", "train")
    assert [t.instance_id for t in loaded] == [t.instance_id for t in fresh] and len(fresh) == 12
    # In seed order, which directory names are not: so a larger suite begins with the smaller one's tasks
    # (SFT's first sft.n_trajectories stay the same when env.n_train_tasks grows).
    seeds = [t.metadata["seed"] for t in loaded]
    assert seeds == sorted(seeds) and [t.path.name for t in loaded] != sorted(t.path.name for t in loaded)
    config.env.n_train_tasks = 16
    larger = data_lib.task_suite(config, tmp_path / "b", "train")
    assert [t.instance_id for t in larger[:12]] == [t.instance_id for t in fresh]


def test_the_task_stream_resumes_at_its_position_and_needs_tasks():
    tasks = [SimpleNamespace(instance_id=f"t{i}") for i in range(5)]
    whole = rl._task_stream(tasks, 0, 0, 12)
    # Every task once per epoch, and a stream resumed at position 7 continues the same sequence.
    assert sorted(t.instance_id for t in whole[:5]) == [t.instance_id for t in tasks]
    assert rl._task_stream(tasks, 0, 7, 5) == whole[7:]
    with pytest.raises(ValueError, match="no train tasks"):
        rl._task_stream([], 0, 0, 4)  # (an empty list would cycle forever)


_NO_EXTRAS = Extras(EpisodeStarts("expert_start", {}), ())


@pytest.mark.parametrize("max_staleness, kept", [(0, ["t1"]), (1, ["t0", "t1"]), (2, ["t0", "t1"])])
def test_the_staleness_bound_drops_groups_from_a_policy_older_than_it(max_staleness, kept):
    config = experiment.get_config()
    config.rl.update(tasks_per_step=1, max_staleness=max_staleness, dynamic_sampling=False)
    progress = rl._Progress(version=3)
    engine = SimpleNamespace(oldest={"t0-1": 2})  # one episode of group 0 began one version ago
    batches = rl._collect(_groups([[1, 0], [0, 1]]), engine, progress, config.rl, _NO_EXTRAS, start=0)
    assert [b[0][0].task_id for b in batches] == kept
    assert progress.counts["groups_dropped_stale"] == 2 - len(kept)
