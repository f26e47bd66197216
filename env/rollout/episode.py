"""One episode as a state machine over its exact token stream (plain host Python, no JAX).

    GENERATE --turn with calls--> TOOLS --results--> GENERATE ... --final turn / limit--> GRADING --> DONE

The episode owns the token stream the policy saw and produced: `ids` [t], `loss_mask` [t] (1 exactly on
tokens the policy generated), `logprobs` [t] (the sampler's log-prob of each generated token, 0 elsewhere).
The prompt of the next turn IS this stream: generated ids are appended verbatim and never re-tokenised from
their text, so the learner trains on exactly the tokens that were sampled. Tool results are appended as one
tokenised segment,

    \\n<|im_start|>user\\n<tool_response>\\n{r1}\\n</tool_response>\\n<tool_response>...<|im_end|>\\n
    <|im_start|>assistant\\n

which is what `chat.render_text` writes for the same conversation (the tokenizer's chat format's
`continuation`: a checkpoint's template writes its own); `messages` keeps that conversation for display, so
with composer's own format `decode(ids) == render_text(messages, add_generation_prompt=True)` while
generating.

Limits: `max_turns` generated turns, `max_episode_tokens` in the whole stream, `episode_timeout_s` of wall
time. An episode that hits one stops where it is, is marked truncated with the limit's name, and is still
graded.
"""

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

from env import chat
from env.chat import CallError, Message, ToolCall
from env.tokenizer import render_prompt

# Tools that look at the code without changing it, and tools that change it: for the "searched or read
# before the first edit" statistic and the grader's shaping term.


class State(enum.Enum):
    GENERATE = "generate"  # waiting for (or holding) a decode request in the engine
    TOOLS = "tools"  # its calls run in the pool
    GRADING = "grading"  # finished; the pool grades the workspace
    DONE = "done"


@dataclasses.dataclass(frozen=True)
class RolloutLimits:
    """Per-episode limits. max_turn_tokens caps one generated turn; the others end the episode."""

    max_turns: int
    max_episode_tokens: int
    max_turn_tokens: int
    episode_timeout_s: float

    @classmethod
    def from_config(cls, config: Any) -> "RolloutLimits":
        """From the experiment config (`env.max_turns`, `env.max_episode_tokens`, `sampling.max_turn_tokens`,
        `env.episode_timeout_s`)."""
        return cls(
            max_turns=config.env.max_turns,
            max_episode_tokens=config.env.max_episode_tokens,
            max_turn_tokens=config.sampling.max_turn_tokens,
            episode_timeout_s=config.env.episode_timeout_s,
        )


@dataclasses.dataclass(frozen=True)
class TurnOutput:
    """One finished turn from the engine: the generated ids (the last is `<|im_end|>` when stop is 'eos'),
    their log-probs, and why it stopped ('eos' | 'length')."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    stop: str


@dataclasses.dataclass
class Episode:
    """The mutable state of one attempt at one task. Built by `Episode.create`; advanced by the driver."""

    episode_id: str
    group: int  # index of the task in the driver's task list
    member: int  # index within the group
    attempt: int  # 0 for the first try; restarts after a worker death count up
    task_id: str
    ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[Message]
    started_at: float
    state: State = State.GENERATE
    n_turns: int = 0
    n_cut_turns: int = 0  # turns cut by max_turn_tokens (closed with an appended <|im_end|>)
    turn_calls: list[list[str]] = dataclasses.field(default_factory=list)  # tool names of each turn's calls
    # [start, end) in `ids` of each generated turn whose calls ran, with how many of its results were errors
    turn_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    turn_errors: list[int] = dataclasses.field(default_factory=list)
    # ... and how many were searches that found nothing (ToolResult.found_nothing)
    turn_empty: list[int] = dataclasses.field(default_factory=list)
    truncated: bool = False
    truncation: str | None = None  # 'turns' | 'tokens' | 'time'
    n_prompt_tokens: int = 0

    @classmethod
    def create(
        cls,
        episode_id: str,
        *,
        group: int,
        member: int,
        attempt: int,
        task_id: str,
        prompt: list[Message],
        prompt_ids: Sequence[int],
        now: float,
    ) -> "Episode":
        """A new episode whose stream is `prompt_ids`: `prompt` rendered with the generation prompt
        (`render_prompt_ids`; the driver renders each task's prompt once for all its episodes)."""
        ids = list(prompt_ids)
        return cls(
            episode_id=episode_id,
            group=group,
            member=member,
            attempt=attempt,
            task_id=task_id,
            ids=ids,
            loss_mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            messages=list(prompt),
            started_at=now,
            n_prompt_tokens=len(ids),
        )

    @property
    def n_tool_calls(self) -> int:
        """Calls made over the episode."""
        return sum(len(names) for names in self.turn_calls)

    @property
    def n_parallel_turns(self) -> int:
        """Turns with more than one call."""
        return sum(len(names) > 1 for names in self.turn_calls)

    @property
    def n_tool_errors(self) -> int:
        """Calls whose result was an error, over the episode."""
        return sum(self.turn_errors)

    def next_turn_budget(self, limits: RolloutLimits, now: float) -> int | None:
        """max_new_tokens for the next turn, or None when a limit ends the episode (state -> GRADING).

        One id of the episode budget is kept back for the `<|im_end|>` appended to a turn cut by length.
        """
        assert self.state is State.GENERATE, self.state
        budget = min(limits.max_turn_tokens, limits.max_episode_tokens - len(self.ids) - 1)
        if self.n_turns >= limits.max_turns:
            self._truncate("turns")
        elif now - self.started_at > limits.episode_timeout_s:
            self._truncate("time")
        elif budget < 1:
            self._truncate("tokens")
        else:
            return budget
        return None

    def on_turn(
        self, out: TurnOutput, tokenizer: Any, limits: RolloutLimits, now: float
    ) -> list[ToolCall | CallError]:
        """Appends a generated turn verbatim; returns the calls to run (state -> TOOLS) or [] (-> GRADING).

        A turn without calls is the final answer. A turn that did not end in `<|im_end|>` (cut by the token
        limit) is closed with one, which carries no loss and log-prob 0. A turn with calls that is the last
        allowed one, or that ends after the wall-time limit, truncates the episode and its calls do not run.
        """
        assert self.state is State.GENERATE, self.state
        if len(out.token_ids) != len(out.logprobs):
            raise ValueError(f"{len(out.token_ids)} token ids but {len(out.logprobs)} log-probs")
        im_end = tokenizer.im_end_id
        generated = [int(i) for i in out.token_ids]
        start = len(self.ids)
        self.ids += generated
        self.loss_mask += [1] * len(generated)
        self.logprobs += [float(p) for p in out.logprobs]
        if not generated or generated[-1] != im_end:
            self.ids.append(im_end)
            self.loss_mask.append(0)
            self.logprobs.append(0.0)
            self.n_cut_turns += 1
            body = tokenizer.decode(generated)
        else:
            body = tokenizer.decode(generated[:-1])
        self.n_turns += 1
        parsed = tokenizer.chat_format.parse_assistant(body)
        self.messages.append(_assistant_message(body, parsed, tokenizer.chat_format))
        calls = list(parsed.calls)
        if not calls:
            self.state = State.GRADING
        elif self.n_turns >= limits.max_turns:
            self._truncate("turns")
        elif now - self.started_at > limits.episode_timeout_s:
            self._truncate("time")
        else:
            self.state = State.TOOLS
            self.turn_calls.append([c.name if isinstance(c, ToolCall) else "" for c in calls])
            self.turn_spans.append((start, start + len(generated)))
            self.turn_errors.append(0)
            self.turn_empty.append(0)
            return calls
        return []

    def on_results(self, results: Sequence[Any], tokenizer: Any, limits: RolloutLimits, now: float) -> None:
        """Appends the results of the turn's calls (ToolResult-like: .text, .is_error, .found_nothing), in
        call order, and the next generation prompt (state -> GENERATE); or truncates when the stream would
        outgrow max_episode_tokens or the wall time is up (state -> GRADING, results not appended)."""
        assert self.state is State.TOOLS, self.state
        self.turn_errors[-1] = sum(bool(r.is_error) for r in results)
        self.turn_empty[-1] = sum(bool(r.found_nothing) for r in results)
        tool_messages = [Message("tool", r.text) for r in results]
        # The newline that follows the assistant's <|im_end|>, then the user turn of results, then the header
        # of the next assistant turn: the text the chat format puts between the two assistant turns.
        segment = tokenizer.encode(tokenizer.chat_format.continuation(tool_messages))
        if now - self.started_at > limits.episode_timeout_s:
            self._truncate("time")
        elif len(self.ids) + len(segment) + 1 >= limits.max_episode_tokens:
            self._truncate("tokens")
        else:
            self.ids += segment
            self.loss_mask += [0] * len(segment)
            self.logprobs += [0.0] * len(segment)
            self.messages += tool_messages
            self.state = State.GENERATE

    def _truncate(self, reason: str) -> None:
        self.truncated = True
        self.truncation = reason
        self.state = State.GRADING


def render_prompt_ids(messages: list[Message], tokenizer: Any) -> list[int]:
    """The ids of `messages` followed by `<|im_start|>assistant\\n`: the opening of an episode's stream."""
    return render_prompt(messages, tokenizer).tolist()


def _assistant_message(body: str, parsed: chat.ParsedTurn, chat_format: Any) -> Message:
    """The display message of a generated turn: structured (text + calls) when that renders back to exactly
    the generated text, else the raw text (malformed calls, odd spacing), so rendering never lies."""
    calls = [c for c in parsed.calls if isinstance(c, ToolCall)]
    structured = Message("assistant", parsed.text, calls)
    if len(calls) == len(parsed.calls) and chat_format.assistant_text(structured) == body + chat.IM_END:
        return structured
    return Message("assistant", body)
