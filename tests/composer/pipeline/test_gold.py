"""Gold-patch trajectories: SFT data for tasks the scripted expert cannot plan."""

import dataclasses

import pytest

from composer.pipeline import gold
from env.tasks import generate_task, split_seed

TOOLS = ("run_terminal_cmd", "grep", "search_replace")  # the default config's offered tools


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A generated task stripped of the generator's metadata, as a task from elsewhere comes."""
    generated = generate_task(split_seed("train", 6), 1, tmp_path_factory.mktemp("tasks"), "train")
    return dataclasses.replace(generated, metadata={})


def test_hunk_strings_widen_until_the_old_side_is_unique():
    text = "a = 1\nx = 0\nb = 2\nx = 0\n"
    body = [" a = 1\n", "-x = 0\n", "+x = 1\n", " b = 2\n"]
    assert gold.hunk_strings(text, body) == ("a = 1\nx = 0", "a = 1\nx = 1")
    assert gold.hunk_strings("y = 0\n", ["-y = 0\n", "+y = 1\n"]) == ("y = 0", "y = 1")


def test_patches_that_add_or_remove_files_and_missing_tools_have_no_gold_trajectory(task):
    assert gold.applicable(task, TOOLS) is None
    assert gold.applicable(task, None) is None
    assert "search_replace" in gold.applicable(task, ("run_terminal_cmd", "grep"))
    new_file = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1 @@\n+x = 1\n"
    assert "creates" in gold.applicable(dataclasses.replace(task, patch=new_file), TOOLS)


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_the_gold_trajectory_solves_the_task_with_the_offered_tools(task, tools):
    traj = gold.solve(task, tools=tools)
    assert traj.reward == 1.0
    calls = [c for m in traj.messages if m.role == "assistant" for c in m.tool_calls]
    names = [c.name for c in calls]
    # Run the tests, read the hunk (grep without read_file), one edit per hunk, run the tests again.
    read = "read_file" if tools is None else "grep"
    hunks = sum(len(f.hunks) for f in gold.parse_patch(task.patch))
    assert names == ["run_terminal_cmd", read, *["search_replace"] * hunks, "run_terminal_cmd"]
    assert task.FAIL_TO_PASS[0] in calls[0].arguments["command"]
    tool_results = [m.content for m in traj.messages if m.role == "tool"]
    assert "failed" in tool_results[0] and "passed" in tool_results[-1] and "failed" not in tool_results[-1]
    # The read showed the lines the edit replaces.
    old = [x[1:].strip() for f in gold.parse_patch(task.patch) for _, h in f.hunks for x in h if x[0] in " -"]
    assert all(line in tool_results[1] for line in old)
    assert traj.messages[-1].role == "assistant" and not traj.messages[-1].tool_calls
