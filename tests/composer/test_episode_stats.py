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
