"""Next-call accuracy: from the expert's prefix of a held-out episode, does the policy make its calls?

An episode is solved only when every turn is right, so a solve rate of 0 says nothing about which turn
fails. This scores each turn on its own: for assistant turn k of an expert trajectory, the prompt is the
trajectory up to that turn (system, report, the expert's earlier turns and their real tool results), and
the turn counts as right when the calls the policy generates equal the expert's, in order, name and
arguments (its free text is not scored: the expert's wording varies by design). Turn 1 (run the tests) is
a constant; turn 2 copies names from the report into a grep; later turns copy paths, line numbers and the
buggy line out of tool results, which is where small models fail first.
"""

from collections.abc import Sequence

from env import chat
from env.tokenizer import Tokenizer, render_prompt

TURN_KEY = "next_call_turn_"  # + the 1-based turn number: the share of those turns right


def prefixes(
    trajectories: Sequence[list[chat.Message]], max_turns: int
) -> list[tuple[int, list[chat.Message], list[chat.ToolCall]]]:
    """(turn index k, messages before assistant turn k, that turn's calls) for the first `max_turns`
    assistant turns with calls of each trajectory (a final answer without calls is not scored)."""
    out = []
    for messages in trajectories:
        turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for k, i in enumerate(turns[:max_turns]):
            if messages[i].tool_calls:
                out.append((k, messages[:i], list(messages[i].tool_calls)))
    return out


def same_calls(got: Sequence[chat.ToolCall | chat.CallError], want: Sequence[chat.ToolCall]) -> bool:
    """Whether the parsed calls of a turn are exactly `want`: same count, order, names and arguments."""
    return len(got) == len(want) and all(
        isinstance(g, chat.ToolCall) and g.name == w.name and g.arguments == w.arguments
        for g, w in zip(got, want)
    )


def next_call_accuracy(
    sampler, tokenizer: Tokenizer, trajectories: Sequence[list[chat.Message]], *, max_turns: int,
    max_prompt_tokens: int, max_new_tokens: int,
) -> dict:  # fmt: skip
    """Generates every scored turn with `sampler` (its temperature; 0 is greedy) and returns
    {'next_call_accuracy': share of turns right, 'next_call_turns': turns scored, and per turn k (1-based)
    'next_call_turn_{k}': the share of k-th turns right}. A prefix longer than `max_prompt_tokens` is not
    scored: an episode that long has ended, truncated, before that turn."""
    cases, prompts = [], []
    for case in prefixes(trajectories, max_turns):
        prompt = render_prompt(case[1], tokenizer)
        if len(prompt) <= max_prompt_tokens:
            cases.append(case)
            prompts.append(prompt)
    if not cases:
        return {"next_call_accuracy": 0.0, "next_call_turns": 0}
    outs = sampler.generate(prompts, max_new_tokens)
    n_turns = max(k for k, _, _ in cases) + 1
    right, count = [0] * n_turns, [0] * n_turns
    for (k, _, want), out in zip(cases, outs, strict=True):
        got = tokenizer.chat_format.parse_assistant(tokenizer.decode(out.token_ids)).calls
        right[k] += same_calls(got, want)
        count[k] += 1
    by_turn = {f"{TURN_KEY}{k + 1}": r / c for k, (r, c) in enumerate(zip(right, count)) if c}
    return {"next_call_accuracy": sum(right) / len(cases), "next_call_turns": len(cases), **by_turn}
