"""Next-call accuracy from expert prefixes: which turns are scored, and how a generated turn is judged."""

import json

from composer.pipeline import next_call
from composer.sampler import TurnOutput
from env import chat
from env import tokenizer as tk
from env.chat import Message, ToolCall

TESTS = ToolCall("run_terminal_cmd", {"command": "python -m pytest -q tests", "is_background": False})
GREP = ToolCall("grep", {"pattern": "def median\\(", "path": "bankbook"})
READS = [ToolCall("read_file", {"target_file": "bankbook/stats.py", "offset": 9, "limit": 3}),
         ToolCall("read_file", {"target_file": "tests/test_stats.py", "offset": 4, "limit": 3})]  # fmt: skip


def _trajectory() -> list[Message]:
    return [
        chat.system_message([{"name": "grep", "parameters": {}}], "Fix the bug."),
        Message("user", "median([1, 2, 3]) is 1, expected 2"),
        Message("assistant", "Running the tests.", [TESTS]),
        Message("tool", "1 failed"),
        Message("assistant", "Finding `median`.", [GREP]),
        Message("tool", "bankbook/stats.py:9:def median(xs):"),
        Message("assistant", "Reading both.", READS),
        Message("tool", "     9|def median(xs):"),
        Message("tool", "     4|def test_median():"),
        Message("assistant", "Fixed."),
    ]


class _Scripted:
    """A sampler stand-in that answers prompt i with texts[i] (scoring is what is under test here)."""

    def __init__(self, tok: tk.Tokenizer, texts: list[str]):
        self.tok, self.texts, self.prompts = tok, texts, []

    def generate(self, prompts, max_new_tokens):
        self.prompts.extend(prompts)
        return [TurnOutput(f"r{i}", self.tok.encode(t), [0.0], "eos") for i, t in enumerate(self.texts)]


def _body(text: str, calls: list[ToolCall]) -> str:
    return chat.assistant_body(Message("assistant", text, calls)) + chat.IM_END


def test_prefixes_score_each_turn_with_calls_on_the_expert_prefix():
    traj = _trajectory()
    cases = next_call.prefixes([traj, traj[:4]], max_turns=8)
    # Three turns with calls in the full trajectory (the final answer has none), one in the cut one.
    assert [k for k, _, _ in cases] == [0, 1, 2, 0]
    assert [calls for _, _, calls in cases] == [[TESTS], [GREP], READS, [TESTS]]
    # The prompt of turn k is everything before it: the expert's earlier turns and their tool results.
    assert cases[2][1] == traj[:6]
    assert [k for k, _, _ in next_call.prefixes([traj], max_turns=2)] == [0, 1]


def test_same_calls_needs_every_call_in_order_with_equal_arguments():
    assert next_call.same_calls(READS, READS)
    assert not next_call.same_calls(READS[::-1], READS)
    assert not next_call.same_calls(READS[:1], READS)
    wrong_path = ToolCall("grep", {"pattern": "def median\\(", "path": "ledgerly"})
    assert not next_call.same_calls([wrong_path], [GREP])
    assert not next_call.same_calls([chat.CallError("invalid JSON", "{")], [GREP])


def test_next_call_accuracy_judges_the_calls_not_the_text():
    traj = _trajectory()
    tok = tk.train_tokenizer([chat.render_text(traj)] * 20, vocab_size=400)
    texts = [
        _body("Other words, same call.", [TESTS]),  # right: the free text is not scored
        _body("Finding it.", [ToolCall("grep", {"pattern": "def median\\(", "path": "ledgerly"})]),  # wrong
        _body("", READS),  # right
        _body("Running them.", [TESTS]) + " trailing text after the end is ignored",  # right
    ]
    sampler = _Scripted(tok, texts)
    out = next_call.next_call_accuracy(
        sampler, tok, [traj, traj[:4]], max_turns=8, max_prompt_tokens=4096, max_new_tokens=64
    )
    assert out == {
        "next_call_accuracy": 3 / 4,
        "next_call_turns": 4,
        "next_call_turn_1": 1.0,
        "next_call_turn_2": 0.0,
        "next_call_turn_3": 1.0,
    }
    # Each prompt is the rendered prefix with the assistant header the policy continues from.
    assert [p.tolist() for p in sampler.prompts] == [
        tk.render_prompt(p, tok).tolist() for _, p, _ in next_call.prefixes([traj, traj[:4]], 8)
    ]
    assert tok.decode(sampler.prompts[1]).endswith("<|im_start|>assistant\n")
    empty = next_call.next_call_accuracy(
        sampler, tok, [traj[:2]], max_turns=8, max_prompt_tokens=4096, max_new_tokens=64
    )
    assert empty == {"next_call_accuracy": 0.0, "next_call_turns": 0}
    json.dumps(out)  # plain numbers: written to eval_*.json and metrics.jsonl as they are
    # A prefix longer than an episode may be (it would have ended truncated before that turn) is skipped.
    limit = len(tk.render_prompt(traj[:4], tok))
    sampler = _Scripted(tok, texts[:2])
    short = next_call.next_call_accuracy(
        sampler, tok, [traj], max_turns=8, max_prompt_tokens=limit, max_new_tokens=64
    )
    assert short == {
        "next_call_accuracy": 0.5,
        "next_call_turns": 2,
        "next_call_turn_1": 1.0,
        "next_call_turn_2": 0.0,
    }
    assert len(sampler.prompts) == 2
