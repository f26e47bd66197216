"""Search turns: GRPO on an episode's first search turn alone, with a reward from running it.

The default model's most common held-out failure is its first search (the second turn): a grep for a name
mis-copied from the report or the test run (`def Wallet` for `Account.debit`), which finds nothing; from
there the episode rarely recovers. From the expert's state before that turn the SFT model writes the
search that finds the code in about 60% of samples, on train and held-out tasks alike, so groups of
samples of that one turn mostly carry signal, where whole episodes' rewards (one per ~2000 tokens, most
groups all solved or all failed) say little about it.

Each RL step, `rl.search_turn_tasks` train tasks' expert prefixes (up to the expert's first turn of reads)
are sampled `rl.search_turn_samples` times; each sampled turn's calls are run on a fresh copy of the task's
repository, and its reward is the share of the expert's results at that turn whose first line (the match:
`path:line:def name(`) the turn's results also show (`search_reward`). The turns join the step's batch as
one group each (GRPO advantages over the group), trained on the sampled turn alone.

Only reads run (READ_TOOLS; no sandbox is needed for them): a turn with any other call, or a malformed
one, gets reward 0 without running anything.
"""

import dataclasses
from pathlib import Path

import numpy as np

from composer.pipeline.expert_members import failed
from composer.rl import advantages as adv_lib
from env import chat
from env.sandbox.workspace import make_workspace, remove_workspace
from env.tokenizer import render_prompt
from env.tools import READ_TOOLS, ToolContext, execute_parallel


@dataclasses.dataclass(frozen=True)
class SearchState:
    """A task's state before the expert's first turn of reads: the conversation so far, the task's
    repository, and the first line of each of the expert's results at that turn."""

    task_id: str
    prefix: list[chat.Message]
    repo: Path
    targets: tuple[str, ...]


def search_state(task_id: str, messages: list[chat.Message], repo: Path) -> SearchState | None:
    """The state before the first assistant turn of `messages` whose calls are all reads and whose results
    are not errors (None when there is none)."""
    for i, m in enumerate(messages):
        if m.role != "assistant" or not m.tool_calls:
            continue
        if not all(c.name in READ_TOOLS for c in m.tool_calls):
            continue
        results = messages[i + 1 : i + 1 + len(m.tool_calls)]
        if len(results) != len(m.tool_calls) or any(r.role != "tool" for r in results):
            return None
        if any(failed(r) for r in results):
            return None
        targets = tuple(r.content.splitlines()[0] for r in results if r.content.strip())
        if not targets:
            return None
        return SearchState(task_id, list(messages[:i]), repo, targets)
    return None


def search_reward(state: SearchState, body: str, tools: tuple[str, ...] | None = None) -> float:
    """The share of `state.targets` that the turn `body` (its text and calls, as generated) shows when its
    calls run on a fresh copy of the task's repository; 0 for a turn with no calls, a malformed call, or a
    call that is not a read (which then does not run). `tools`: the tools on offer (None: all)."""
    calls = chat.parse_assistant(body).calls
    if not calls or not all(isinstance(c, chat.ToolCall) and c.name in READ_TOOLS for c in calls):
        return 0.0
    workspace = make_workspace(state.repo)
    try:
        results = execute_parallel(ToolContext(workspace, None, tools=tools), calls)
    finally:
        remove_workspace(workspace)
    shown = "\n".join(r.text for r in results if not r.is_error)
    return sum(t in shown for t in state.targets) / len(state.targets)


def choose(states: list[SearchState], n: int, seed: int, step: int) -> list[SearchState]:
    """`n` states drawn without replacement, seeded by (seed, step): the same ones on resume."""
    if n <= 0 or not states:
        return []
    rng = np.random.default_rng([seed, step, 7])
    return [states[i] for i in rng.choice(len(states), min(n, len(states)), replace=False)]


def search_sequences(
    states: list[SearchState],
    sampler,
    tokenizer,
    *,
    samples: int,
    max_new_tokens: int,
    algorithm: str,
    tools: tuple[str, ...] | None = None,
) -> tuple[list[dict], np.ndarray]:
    """Samples each state's search turn `samples` times with `sampler` (its temperature), scores every turn
    (`search_reward`), and returns the training sequences (the prompt, then the turn; loss on the turn;
    per-group advantages by `algorithm`) and the rewards [states, samples]."""
    if not states:
        return [], np.zeros((0, samples), np.float32)
    prompts = [list(render_prompt(s.prefix, tokenizer)) for s in states]
    outs = sampler.generate([p for p in prompts for _ in range(samples)], max_new_tokens)
    im_end = tokenizer.im_end_id
    seqs, rewards = [], np.zeros((len(states), samples), np.float32)
    for g, (state, prompt) in enumerate(zip(states, prompts, strict=True)):
        group = []
        for k in range(samples):
            out = outs[g * samples + k]
            ids, logprobs = [int(i) for i in out.token_ids], [float(x) for x in out.logprobs]
            closed = bool(ids) and ids[-1] == im_end
            body = tokenizer.decode(ids[:-1] if closed else ids)
            rewards[g, k] = search_reward(state, body, tools) if closed else 0.0
            mask = [0] * len(prompt) + [1] * len(ids) + ([] if closed else [0])
            group.append(
                {
                    "tokens": np.asarray(prompt + ids + ([] if closed else [im_end]), np.int32),
                    "loss_mask": np.asarray(mask, np.float32),
                    "sampler_logprobs": np.asarray(
                        [0.0] * len(prompt) + logprobs + ([] if closed else [0.0]), np.float32
                    ),
                    "rewards": float(rewards[g, k]),
                    "truncated": False,
                    "off_policy": 0.0,
                }
            )
        advantages = np.asarray(adv_lib.compute_advantages(algorithm, rewards[g : g + 1]).advantages)
        seqs.extend(dict(m, advantages=float(a)) for m, a in zip(group, advantages.reshape(-1)))
    return seqs, rewards
