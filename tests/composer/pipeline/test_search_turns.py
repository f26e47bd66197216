"""Search turns (composer/pipeline/search_turns.py): the state before the expert's first search, the reward
from running a sampled turn on a copy of the repository, and the groups they make."""

import dataclasses

import numpy as np
import pytest

from composer.pipeline import rl, search_turns
from env import chat
from env import tokenizer as tk
from experiments import composer as experiment

Message, ToolCall = chat.Message, chat.ToolCall
TEST_RUN = ToolCall("run_terminal_cmd", {"command": "python -m pytest -q tests"})
FIND = ToolCall("grep", {"pattern": r"def mean\(", "-A": 2})
FIND_TEST = ToolCall("grep", {"pattern": r"def test_mean\(", "-A": 2})
WRONG = ToolCall("grep", {"pattern": r"def average\(", "-A": 2})
EDIT = ToolCall("search_replace", {"file_path": "pkg/stats.py", "old_string": "a - b", "new_string": "a + b"})


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "stats.py").write_text("def mean(a, b):\n    return a - b\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_stats.py").write_text("def test_mean():\n    assert mean(1, 3) == 2\n")
    return tmp_path


def _expert() -> list[Message]:
    return [
        Message("system", "Fix the bug."),
        Message("user", "mean(1, 3) returned -2."),
        Message("assistant", "Running the tests.", [TEST_RUN]),
        Message("tool", "1 failed"),
        Message("assistant", "Let me find `mean` and its test.", [FIND, FIND_TEST]),
        Message("tool", "pkg/stats.py:1:def mean(a, b):\npkg/stats.py-2-    return a - b"),
        Message("tool", "tests/test_stats.py:1:def test_mean():\ntests/test_stats.py-2-    assert ..."),
        Message("assistant", "Fixing.", [EDIT]),
        Message("tool", "updated"),
        Message("assistant", "Done."),
    ]


def _body(text: str, calls: list[ToolCall]) -> str:
    return chat.assistant_body(Message("assistant", text, calls))


def test_the_state_is_before_the_first_search_and_targets_its_matches(repo):
    state = search_turns.search_state("t", _expert(), repo)
    assert [m.role for m in state.prefix] == ["system", "user", "assistant", "tool"]
    assert state.targets == ("pkg/stats.py:1:def mean(a, b):", "tests/test_stats.py:1:def test_mean():")
    # No such state without a search, or when the expert's search failed.
    assert search_turns.search_state("t", _expert()[:4], repo) is None
    failed = _expert()
    failed[5] = Message("tool", "No matches found")
    assert search_turns.search_state("t", failed, repo) is None


def test_the_reward_is_the_share_of_the_expert_matches_the_turn_shows(repo):
    state = search_turns.search_state("t", _expert(), repo)
    assert search_turns.search_reward(state, _body("Looking.", [FIND, FIND_TEST])) == 1.0
    assert search_turns.search_reward(state, _body("Looking.", [WRONG, FIND_TEST])) == 0.5
    assert search_turns.search_reward(state, _body("Looking.", [WRONG])) == 0.0
    assert search_turns.search_reward(state, "Done, no calls.") == 0.0
    assert (
        search_turns.search_reward(state, 'Looking.\n<tool_call>\n{"name": "grep", "arguments": {"pat\n')
        == 0.0
    )
    # A tool not on offer is answered as an error, so shows nothing.
    assert search_turns.search_reward(state, _body("Looking.", [FIND]), tools=("read_file",)) == 0.0


def test_a_turn_with_a_call_that_is_not_a_read_runs_nothing_and_scores_zero(repo):
    state = search_turns.search_state("t", _expert(), repo)
    before = (repo / "pkg" / "stats.py").read_text()
    assert search_turns.search_reward(state, _body("Fixing first.", [FIND, FIND_TEST, EDIT])) == 0.0
    assert (repo / "pkg" / "stats.py").read_text() == before
    # Reads run on a copy: the task's repository is never the workspace.
    assert search_turns.search_reward(state, _body("Looking.", [FIND, FIND_TEST])) == 1.0
    assert sorted(p.name for p in repo.rglob("*") if p.is_file()) == ["stats.py", "test_stats.py"]


def test_choose_is_seeded_by_step_and_bounded():
    states = list(range(10))
    a = search_turns.choose(states, 4, seed=0, step=3)
    assert len(set(a)) == 4 and a == search_turns.choose(states, 4, seed=0, step=3)
    assert a != search_turns.choose(states, 4, seed=0, step=4)
    assert sorted(search_turns.choose(states, 20, seed=0, step=0)) == states
    assert search_turns.choose(states, 0, seed=0, step=0) == [] and search_turns.choose([], 3, 0, 0) == []


@dataclasses.dataclass
class _Out:
    token_ids: list[int]
    logprobs: list[float]


class _ScriptedSampler:
    """Answers the k-th prompt with bodies[k % len(bodies)] (closed with <|im_end|> unless `cut`)."""

    def __init__(self, tok, bodies, cut=()):
        self.tok, self.bodies, self.cut, self.prompts = tok, bodies, set(cut), []

    def generate(self, prompts, max_new_tokens):
        self.prompts += prompts
        outs = []
        for k in range(len(prompts)):
            ids = self.tok.encode(self.bodies[k % len(self.bodies)])
            if k not in self.cut:
                ids.append(self.tok.im_end_id)
            outs.append(_Out(ids, [-0.5] * len(ids)))
        return outs


@pytest.fixture(scope="module")
def tok():
    return tk.train_tokenizer([chat.render_text(_expert())], 400)


def test_each_state_is_a_group_trained_on_its_sampled_turn_alone(repo, tok):
    state = search_turns.search_state("t", _expert(), repo)
    good, bad = _body("Looking.", [FIND, FIND_TEST]), _body("Looking.", [WRONG])
    sampler = _ScriptedSampler(tok, [good, bad, good, bad], cut={3})
    seqs, rewards = search_turns.search_sequences(
        [state], sampler, tok, samples=4, max_new_tokens=64, algorithm="grpo"
    )
    np.testing.assert_array_equal(rewards, [[1.0, 0.0, 1.0, 0.0]])  # the cut turn scores 0
    prompt = list(tk.render_prompt(state.prefix, tok))
    assert sampler.prompts == [prompt] * 4
    for seq, body, cut in zip(seqs, [good, bad, good, bad], [False, False, False, True], strict=True):
        turn = tok.encode(body) + [tok.im_end_id]
        np.testing.assert_array_equal(seq["tokens"], prompt + turn)
        # Loss and log-probs on the sampled tokens only (a cut turn's closing <|im_end|> has neither).
        np.testing.assert_array_equal(
            seq["loss_mask"], [0] * len(prompt) + [1] * (len(turn) - cut) + [0] * cut
        )
        assert (
            seq["sampler_logprobs"][len(prompt)] == -0.5 and not seq["sampler_logprobs"][: len(prompt)].any()
        )
        assert seq["off_policy"] == 0.0 and not seq["truncated"]
    advantages = [s["advantages"] for s in seqs]
    assert advantages[0] == advantages[2] > 0 > advantages[1] == advantages[3]
    # The tokens of a group render to the state's conversation then the turn: what the learner scores.
    assert tok.decode(seqs[0]["tokens"].tolist()).startswith(chat.render_text(state.prefix))


@pytest.mark.parametrize(
    "overrides", [{"search_turn_tasks": -1}, {"search_turn_samples": 1}, {"algorithm": "gae"}]
)
def test_search_turns_that_cannot_apply_fail_before_the_phase_starts(overrides, tmp_path):
    config = experiment.get_config()
    config.rl.search_turn_tasks = 4
    for k, v in overrides.items():
        setattr(config.rl, k, v)
    with pytest.raises(ValueError, match="rl.search_turn"):
        rl.run(config, tmp_path, None, None, None, None, None)
    assert not any(tmp_path.iterdir())
