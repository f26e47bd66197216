"""The held-out curve's subset, schedule and points read off a full EVAL."""

import types

from composer.pipeline import curve
from experiments.composer import get_config


def _tasks(n: int) -> list:
    return [types.SimpleNamespace(instance_id=f"t{i}") for i in range(n)]


def _config(**eval_values):
    config = get_config()
    config.eval.update(eval_values)
    return config


def test_subset_is_the_first_heldout_tasks_within_those_eval_scores():
    heldout = _tasks(10)
    assert [t.instance_id for t in curve.tasks(_config(curve_tasks=3), heldout)] == ["t0", "t1", "t2"]
    # Never past the tasks EVAL scores: the curve's ends are read off EVAL's results.
    assert len(curve.tasks(_config(curve_tasks=8, n_tasks=5), heldout)) == 5
    assert curve.tasks(_config(curve_tasks=0), heldout) == []


def test_points_every_few_steps_but_not_at_the_last():
    config = _config(every_steps=5, curve_tasks=4)
    config.rl.steps = 20
    assert [s for s in range(1, 21) if curve.due(config, s)] == [5, 10, 15]
    assert not any(curve.due(_config(every_steps=0, curve_tasks=4), s) for s in range(1, 21))
    assert not any(curve.due(_config(every_steps=5, curve_tasks=0), s) for s in range(1, 21))


def test_point_from_a_full_eval_counts_the_subset_only():
    subset = _tasks(4)
    rewards = {"t0": 1.0, "t1": 0.0, "t2": None, "t3": 1.0, "t4": 1.0, "t5": 1.0}
    # t2 was not graded: unsolved. t4 and t5 are outside the subset.
    assert curve.from_eval({"rewards": rewards}, subset) == {curve.KEY: 0.5, "curve_tasks": 4}
    assert curve.from_eval({"solve_rate": 1.0}, subset) == {}  # a result without per-task rewards
    assert curve.from_eval({"rewards": rewards}, []) == {}
