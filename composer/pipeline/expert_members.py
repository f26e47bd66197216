"""Expert members of a group: off-policy sequences built from the expert's trajectory of the same task,
reward 1, that join a group of the policy's episodes before its advantages are computed.

- `guide_sequence`: the expert's own continuation from the group's start (rl.expert_guidance);
- `correction_sequence`: the expert's edit turn at an unsolved episode's own state (rl.expert_corrections);
- `recovery_sequence`: the expert's turn after an unsolved episode's first failed step off its path
  (rl.expert_recoveries);
- `group_corrections`: one builder over a group's episodes, each state once.
"""

import numpy as np

from composer.pipeline import rollouts
from env import chat
from env.expert import TEST_COMMAND
from env.tokenizer import render
from env.tools import READ_TOOLS


def guide_sequence(messages: list, prefix: list | None, tokenizer) -> dict:
    """The expert's trajectory `messages` as one more member of a group whose episodes start from `prefix`
    (its conversation before the edit; None: the report, i.e. everything before its first turn): reward 1
    (only solved trajectories are kept), loss on the expert's turns after the prefix only, and flagged
    off-policy (the sampler never drew it; see train._policy_loss)."""
    if prefix is None:
        prefix = messages[: next(i for i, m in enumerate(messages) if m.role == "assistant")]
    ids, mask = render(messages, tokenizer)
    n_prefix = len(render(prefix, tokenizer)[0])
    mask = mask.astype(np.float32)
    mask[:n_prefix] = 0.0
    return {
        "tokens": ids.astype(np.int32),
        "loss_mask": mask,
        "sampler_logprobs": np.zeros(len(ids), np.float32),
        "rewards": 1.0,
        "truncated": False,
        "off_policy": 1.0,
    }


def correction_prefix(messages: list, edit: chat.Message) -> list | None:
    """Where the expert would make `edit` (its edit turn) in an episode's conversation `messages`: the
    messages before the first assistant turn that follows a read whose results showed every line of the
    edit's old_string. None when there is no such turn, or when an earlier turn could have changed the
    workspace (any call but a read or the test command), so that the expert's edit might not apply."""
    need = [
        line.strip()
        for call in edit.tool_calls
        for line in str(call.arguments.get("old_string", "")).splitlines()
        if line.strip()
    ]
    if not need:
        return None
    shown, reading = "", False
    for i, m in enumerate(messages):
        if m.role == "assistant":
            if all(line in shown for line in need):
                return list(messages[:i])
            if not all(_harmless(c) for c in m.tool_calls):
                return None
            reading = bool(m.tool_calls) and all(c.name in READ_TOOLS for c in m.tool_calls)
        elif m.role == "tool" and reading:
            shown += m.content + "\n"
    return None


def _harmless(call) -> bool:
    """A call that leaves the workspace as it was: a read, or the task's test command."""
    if call.name in READ_TOOLS:
        return True
    return call.name == "run_terminal_cmd" and call.arguments.get("command") == TEST_COMMAND


def correction_sequence(episode_messages: list, expert: list, tokenizer, max_len: int) -> dict | None:
    """The expert's edit turn at an episode's own state, as one more member of its group (DAgger-style
    relabelling): the episode's conversation up to where the expert would edit (`correction_prefix`), then
    the expert's edit turn, trained on that turn alone; reward 1, off-policy. The edit is the one the expert
    made on the same task from the same unchanged workspace in a trajectory that solved it.

    Why: the episodes' edits fail after the policy's own reads (its greps, in its words), where the expert's
    trajectories never were; the guide (`guide_sequence`) teaches the edit only after the expert's reads.
    Beside the episode's own edit at the same state, with its negative advantage, the update contrasts the
    two at the token where they part (for the default model, mostly the changed token the copy head copies
    from the old line). None when there is no such state (see correction_prefix), when the episode's own
    turn there already is the expert's, or when the sequence would be longer than `max_len` tokens."""
    before = rollouts.before_first_edit(expert)
    if before is None:
        return None
    edit = expert[len(before)]
    prefix = correction_prefix(episode_messages, edit)
    if prefix is None:
        return None
    own = episode_messages[len(prefix)] if len(prefix) < len(episode_messages) else None
    if own is not None and own.tool_calls == edit.tool_calls:
        return None
    seq = guide_sequence([*prefix, edit], prefix, tokenizer)
    return seq if len(seq["tokens"]) <= max_len else None


def _turns(messages: list) -> list[tuple[chat.Message, list[chat.Message], int]]:
    """The assistant turns, each with the tool results that followed it and the index in `messages` just
    past them."""
    out = []
    for i, m in enumerate(messages):
        if m.role == "assistant":
            out.append((m, [], i + 1))
        elif m.role == "tool" and out:
            out[-1] = (out[-1][0], [*out[-1][1], m], i + 1)
    return out


def _error(result: chat.Message) -> bool:
    """A tool result that is an error (malformed call, unknown tool, an edit that could not apply, ...:
    env/tools/dispatch.py words them all 'Error: ...'); the call changed nothing."""
    return result.content.startswith("Error:")


def failed(result: chat.Message) -> bool:
    """A tool result that did nothing useful: an error, or a search that found nothing."""
    return _error(result) or result.content.startswith("No matches found")


def recovery_prefix(messages: list, expert: list) -> tuple[list, chat.Message] | None:
    """Where an episode first left the expert's path with a turn that failed, and the expert's turn there.

    Walks the episode's turns beside the expert's: while they make the same calls the two conversations
    are the same. The first turn that differs, when any of its results failed (`failed`) and none of its
    calls that ran could have changed the workspace (a read, the test command, or a call whose result was an
    error), left the workspace as the expert had it: the expert's next turn still applies there, after the
    failed turn and its results. Returns (the messages up to and including those results, the expert's
    turn); None when the episode never left the expert's path, left it with a turn that did not fail (a
    different path, not a mistake), or with one that may have changed the workspace."""
    mine, theirs = _turns(messages), _turns(expert)
    for k, (turn, results, end) in enumerate(mine):
        if k >= len(theirs) or not theirs[k][0].tool_calls:
            return None  # past the expert's last call: nothing left to show
        if turn.tool_calls and turn.tool_calls == theirs[k][0].tool_calls:
            continue
        if not results or not any(failed(r) for r in results):
            return None
        calls = chat.parse_assistant(chat.assistant_body(turn)).calls
        for call, result in zip(calls, results, strict=False):
            if isinstance(call, chat.ToolCall) and not _error(result) and not _harmless(call):
                return None
        return list(messages[:end]), theirs[k][0]
    return None


def recovery_sequence(episode_messages: list, expert: list, tokenizer, max_len: int) -> dict | None:
    """The expert's turn after an episode's first failed step (`recovery_prefix`), as one more member of its
    group: the episode's conversation through that step's results, then the expert's turn, trained on that
    turn alone; reward 1, off-policy (DAgger-style relabelling, like correction_sequence).

    Why: the expert's trajectories never hold an error, so the SFT model never saw what follows one. After
    a malformed call or a search that found nothing its turns degrade (the same broken call again, calls
    spliced from earlier text) until a limit ends the episode, and its own samples there almost never
    recover, so the reward alone has nothing to reinforce. This member is the recovery: the call the
    expert would have made, from the state the policy's mistake left. None when there is no such state or
    the sequence would be longer than `max_len` tokens."""
    found = recovery_prefix(episode_messages, expert)
    if found is None:
        return None
    prefix, turn = found
    seq = guide_sequence([*prefix, turn], prefix, tokenizer)
    return seq if len(seq["tokens"]) <= max_len else None


def group_corrections(
    group: list, expert: list | None, members: list[dict], tokenizer, max_len: int, make=None
) -> list[dict]:
    """What `make` (correction_sequence, the default, or recovery_sequence) builds for a group's unsolved
    episodes, each state once, and none that only repeats the start of a member's tokens (`members`: the
    group's other extra members; an episode that started from the expert's reads and failed there gets
    the guide's own edit, which the guide already trains)."""
    make = make or correction_sequence
    out = []
    for r in group if expert is not None else ():
        if r.reward != 0.0:
            continue
        x = make(r.messages, expert, tokenizer, max_len)
        if x is not None and not any(_starts_with(m["tokens"], x["tokens"]) for m in [*members, *out]):
            out.append(x)
    return out


def _starts_with(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    return len(prefix) <= len(tokens) and bool((tokens[: len(prefix)] == prefix).all())
