"""The scripted expert: the shape of its conversations (reproduce, search, parallel reads, edit from what it
read, verify, finish) and its solve rate."""

import collections
import json
import re

import pytest

from env.chat import render_text
from env.expert import TEST_COMMAND, _replacement, solve
from env.tasks import FAMILIES, generate_task, split_seed
from env.tools import TOOL_NAMES


def _shown_text(tool_text: str) -> str:
    """The file text a grep result shows (`path:line:text` matches and `path-line-text` context lines)."""
    return "".join(m.group(1) + "\n" for m in re.finditer(r"^[^\s:]+?[-:]\d+[-:](.*)$", tool_text, re.M))


def test_trajectory_shape(tmp_path):
    task = generate_task(split_seed("train", 3), 3, tmp_path, "train")  # a bug two calls below the entry
    trajectory = solve(task)
    assert trajectory.reward == 1.0 and trajectory.family == task.metadata["family"]
    messages = trajectory.messages
    assert [m.role for m in messages[:2]] == ["system", "user"]
    assert [s["function"]["name"] for s in messages[0].tools] == list(TOOL_NAMES)
    assert messages[1].content == task.problem_statement
    turns = [m for m in messages if m.role == "assistant"]
    assert trajectory.n_turns == len(turns)
    # Every turn but the last says something and calls tools; the last only speaks.
    assert all(m.content and m.tool_calls for m in turns[:-1])
    assert turns[-1].content and not turns[-1].tool_calls
    assert "pass" in turns[-1].content
    # After each assistant turn with calls come exactly its results, in order.
    i = 2
    while i < len(messages) - 1:
        calls = messages[i].tool_calls
        assert [m.role for m in messages[i + 1 : i + 1 + len(calls)]] == ["tool"] * len(calls)
        i += 1 + len(calls)
    names = [[c.name for c in m.tool_calls] for m in turns]
    assert names[0] == ["run_terminal_cmd"] and names[-2] == ["run_terminal_cmd"]
    assert turns[0].tool_calls[0].arguments == {"command": TEST_COMMAND, "is_background": False}
    assert names[1] == ["grep", "grep"]  # the definition and the failing test, in parallel
    assert all(c.arguments["-A"] >= 6 for c in turns[1].tool_calls)
    # Each grep's name is written in its turn's text as the pattern holds it (a method without its class),
    # so that the call copies it from the line just before.
    greps = [(m.content, c.arguments["pattern"]) for m in turns for c in m.tool_calls if c.name == "grep"]
    assert len(greps) >= 3 and any("." in step["function"] for step in task.metadata["bug"]["chain"])
    for text, pattern in greps:
        name = re.fullmatch(r"(?:def|class)[ .](\w+)(?:\\\(|\\b)", pattern).group(1)
        assert f"`{name}`" in text, (text, pattern)
    edit_turn = next(i for i, n in enumerate(names) if "search_replace" in n)
    assert any("grep" in n or "read_file" in n for n in names[:edit_turn])
    # The edit replaces text that a grep earlier in the conversation showed.
    edit = turns[edit_turn].tool_calls[0]
    shown = "".join(
        _shown_text(m.content) for m in messages[: messages.index(turns[edit_turn])] if m.role == "tool"
    )
    assert edit.arguments["old_string"] in shown
    assert edit.arguments["file_path"] == task.metadata["bug"]["file"]
    # The test run before the edit fails, the one after passes.
    results = [m.content for m in messages if m.role == "tool" and m.content.startswith("Exit code:")]
    assert results[0].startswith("Exit code: 1") and results[-1].startswith("Exit code: 0")
    assert trajectory.grade.components["searched_or_read_before_edit"] == 1.0
    assert trajectory.grade.components["edited_unrelated_files"] == 0.0
    assert trajectory.grade.components["tool_errors"] == 0.0
    text = render_text(messages[1:])  # (the system turn shows the call format once)
    assert text.count("<tool_call>") == sum(len(m.tool_calls) for m in turns)
    json.dumps([c.arguments for m in turns for c in m.tool_calls])  # calls are plain JSON


def test_replacement_widens_until_unique():
    text = "a = 1\nx = f(a)\nb = 2\nx = f(a)\nreturn x\n"
    body = [" b = 2\n", "-x = f(a)\n", "+x = f(b)\n", " return x\n"]
    old, new = _replacement(text, body)
    assert (old, new) == ("b = 2\nx = f(a)", "b = 2\nx = f(b)")
    assert text.count(old) == 1
    # An insertion is anchored on the line before it.
    old, new = _replacement("def f():\n    y = 2\n", [" def f():\n", "     y = 2\n", "+    return y\n"])
    assert (old, new) == ("    y = 2", "    y = 2\n    return y")


@pytest.mark.slow
def test_solve_rate(tmp_path):
    """At least 95% solved at each difficulty (here: every task), failures listed by family."""
    failures = collections.Counter()
    solved = collections.Counter()
    families = set()
    for difficulty in (1, 2, 3):
        for i in range(3):
            seed = split_seed("train", 20 + 3 * (difficulty - 1) + i)
            task = generate_task(seed, difficulty, tmp_path, "train")
            families.add(task.metadata["family"])
            if solve(task).reward == 1.0:
                solved[difficulty] += 1
            else:
                failures[(difficulty, task.metadata["family"])] += 1
    assert families == set(FAMILIES)
    assert not failures, f"unsolved (difficulty, family): {dict(failures)}"
    assert all(solved[d] / 3 >= 0.95 for d in (1, 2, 3))
