"""The held-out statistics of finished episodes, and the summary table built from them."""

from types import SimpleNamespace

from composer.pipeline import phases, rollouts


def _result(*, reward=0.0, searched=None, truncation=None, calls=2, errors=1, similarity=0.0):
    return SimpleNamespace(
        reward=reward, n_turns=3, n_tool_calls=calls, n_tool_errors=errors, n_parallel_turns=1,
        searched_before_edit=searched, truncated=truncation is not None, truncation=truncation,
        restarts=0, error=None, ids=[0] * 10, components={"patch_similarity": similarity},
    )  # fmt: skip


def test_edit_shares_and_truncation_reasons():
    results = [
        _result(reward=1.0, searched=True, similarity=1.0),
        _result(searched=False, truncation="tokens", similarity=0.6),
        _result(truncation="turns"),
        _result(truncation="turns"),
    ]
    stats = rollouts.episode_stats(results)
    assert stats["solve_rate"] == 0.25
    assert stats["patch_similarity"] == 0.4
    assert stats["edited_share"] == 0.5  # two episodes called an editing tool
    assert stats["searched_before_edit_share"] == 0.5  # one of those two searched first
    assert stats["truncated_share"] == 0.75
    assert (
        stats["truncated_turns_share"],
        stats["truncated_tokens_share"],
        stats["truncated_time_share"],
    ) == (
        0.5,
        0.25,
        0.0,
    )
    assert stats["tool_error_rate"] == 0.5


def test_no_edit_reads_as_none_edited_not_as_edits_without_search():
    stats = rollouts.episode_stats([_result(), _result()])
    assert stats["edited_share"] == 0.0 and stats["searched_before_edit_share"] == 0.0
    table = phases.summary_table(stats, stats)
    assert "episodes with an edit call" in table and "by the turn limit" in table
    # An eval written before these keys existed still renders (its rows are left out).
    old = {k: v for k, v in stats.items() if not k.startswith("truncated_t") and k != "edited_share"}
    assert "by the turn limit" not in phases.summary_table(old, old)


def test_summary_counts_tasks_each_model_alone_solved():
    """The summary names the tasks one model solved and the other did not, over the tasks both were scored
    on, with the exact sign test of those two counts."""
    before = {"episodes": 4, "rewards": {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0, "x": 1.0}}
    after = {"episodes": 4, "rewards": {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0, "y": 0.0}}
    assert phases.flips(before, after) == (1, 2)
    assert phases.compared_tasks(before, after) == ({"a", "b", "c", "d"}, set())
    table = phases.summary_table(before, after)
    row = next(line for line in table.splitlines() if "solved by this model only" in line)
    assert row.split()[-2:] == ["1", "2"]
    assert "sign test" in table
    # Evaluations written before per-task rewards were recorded: no such rows.
    assert phases.flips({"episodes": 4}, after) is None
    assert "solved by this model only" not in phases.summary_table({"episodes": 4}, {"episodes": 4})


def test_summary_leaves_out_tasks_cut_by_the_time_limit():
    """A task whose episode either evaluation cut at the wall-clock limit is not compared: that limit reads
    the machine's load, which can differ between the two evaluations."""
    before = {
        "episodes": 4, "rewards": {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0},
        "truncations": {"b": "time", "d": "tokens"},
    }  # fmt: skip
    after = {"episodes": 4, "rewards": {"a": 0.0, "b": 1.0, "c": 1.0, "d": 1.0}, "truncations": {"c": "time"}}
    assert phases.compared_tasks(before, after) == ({"a", "d"}, {"b", "c"})
    assert phases.flips(before, after) == (1, 1)  # a lost, d gained; b and c left out
    table = phases.summary_table(before, after)
    rows = {line[:32].strip(): line[32:].split() for line in table.splitlines()}
    assert rows["time-limit cuts, left out"] == ["2"]
    assert rows["solve rate on the other 2"] == ["50.0%", "50.0%"]
    assert rows["solved by this model only"] == ["1", "1"]
    # Without time cuts, no such rows.
    assert "time-limit cuts" not in phases.summary_table(
        before | {"truncations": {}}, after | {"truncations": {}}
    )


def test_grading_limits_use_the_eval_time_cap():
    from experiments.composer import get_config

    config = get_config()
    config.env.episode_timeout_s, config.eval.episode_timeout_s = 120.0, 900.0
    assert rollouts.limits(config).episode_timeout_s == 120.0
    graded = rollouts.limits(config, grading=True)
    assert graded.episode_timeout_s == 900.0
    assert (
        graded.max_turns == config.env.max_turns and graded.max_turn_tokens == config.sampling.max_turn_tokens
    )


def test_sign_test_against_the_binomial():
    # 1 against 15: 2 * (1 + 16) / 2**16.
    assert abs(phases.sign_test(1, 15) - 2 * 17 / 2**16) < 1e-12
    assert abs(phases.sign_test(15, 1) - phases.sign_test(1, 15)) < 1e-12
    assert phases.sign_test(0, 0) == 1.0
    assert phases.sign_test(3, 3) == 1.0  # capped: both tails together exceed 1
    assert abs(phases.sign_test(0, 5) - 2 / 32) < 1e-12
