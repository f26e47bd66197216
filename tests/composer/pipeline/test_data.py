"""DATA's trajectories: the same seed records the same conversations; the expert's on generated tasks,
the gold patch's on others."""

import dataclasses
import shutil

from composer.pipeline import data as data_lib
from env import chat
from env.tasks import generate_task, save_task, split_seed

TOOLS = ("run_terminal_cmd", "grep", "search_replace")


def test_pytest_wall_time_is_fixed_in_tool_results_only():
    result = (
        "Exit code: 1\n...\nFAILED tests/t.py::test_a - assert None == 5.02\n2 failed, 8 passed in 0.04s\n"
    )
    long = "===== 1 failed, 3 passed, 1 warning in 65.12s (0:01:05) ====="
    messages = [
        chat.Message("user", "2 failed, 8 passed in 0.04s"),  # not a tool's: left as it is
        chat.Message("tool", result),
        chat.Message("tool", long),
        chat.Message("tool", "3 files in 2.5s"),  # not pytest's line
    ]
    fixed = data_lib.fixed_test_times(messages)
    assert fixed[0] == messages[0]
    assert fixed[1].content == result.replace("in 0.04s", "in 0.05s")
    assert "assert None == 5.02" in fixed[1].content
    assert fixed[2].content == "===== 1 failed, 3 passed, 1 warning in 0.05s ====="
    assert fixed[3] == messages[3]


def test_two_expert_runs_on_a_task_record_the_same_trajectory(tmp_path):
    task = generate_task(split_seed("train", 6), 1, tmp_path, "train")
    first, second = (data_lib._solve(str(task.path), TOOLS, "auto") for _ in range(2))
    assert first[1:3] == ("expert", 1.0)
    assert any(" passed in 0.05s" in m["content"] for m in first[3] if m["role"] == "tool")
    assert first == second


def test_a_task_without_the_generator_s_metadata_records_the_gold_patch_s_trajectory(tmp_path):
    task = generate_task(split_seed("train", 6), 1, tmp_path / "generated", "train")
    stripped = dataclasses.replace(task, path=tmp_path / "stripped" / task.instance_id, metadata={})
    shutil.copytree(task.repo, stripped.repo)
    save_task(stripped)
    instance_id, source, reward, messages = data_lib._solve(str(stripped.path), TOOLS, "auto")
    assert (instance_id, source, reward) == (task.instance_id, "gold", 1.0)
    assert any(" passed in 0.05s" in m["content"] for m in messages if m["role"] == "tool")
    # Without search_replace among the offered tools there is none (and no error).
    assert data_lib._solve(str(stripped.path), ("run_terminal_cmd",), "auto")[1:] == (
        "none: tools search_replace not offered",
        0.0,
        [],
    )
