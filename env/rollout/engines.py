"""ScriptedEngine: a stand-in for the sampler with the same protocol, for tests and the rollout benchmark.

It simulates a continuous-batching decoder: `slots` decode slots, each decode step emits one token for every
occupied slot and costs `step_s` seconds of (simulated, slept) device time whatever the occupancy, which is
how a batched decode step behaves on an accelerator; `steps_per_call` steps per `step()` call, as the real
sampler runs several steps per device call. Requests wait in a queue for a free slot. The tokens of a turn
come from a script, a function of (request_id, prompt_ids), so a turn can depend on the conversation so far
the way a model's would. Prefill is not simulated.

`expert_script` builds a script that replays scripted turns (e.g. the expert's assistant turns) keyed by the
episode's opening prompt, the turn number read off the prompt itself.
"""

import collections
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from env import chat
from env.chat import Message
from env.rollout.episode import TurnOutput

Script = Callable[[str, Sequence[int]], Sequence[int]]


def fake_logprob(token_id: int) -> float:
    """A deterministic stand-in log-prob for a scripted token (negative, varies with the token)."""
    return -0.05 * (1 + token_id % 13)


@dataclasses.dataclass
class _Request:
    request_id: str
    tokens: list[int]
    stop: str
    emitted: int = 0


class ScriptedEngine:
    """A simulated decode engine (see the module docstring). Counts decode steps and slot occupancy."""

    def __init__(self, script: Script, *, slots: int = 8, steps_per_call: int = 8, step_s: float = 0.0):
        self.script, self.slots, self.steps_per_call, self.step_s = script, slots, steps_per_call, step_s
        self.queue: collections.deque[_Request] = collections.deque()
        self.active: list[_Request] = []
        self.decode_steps = 0
        self.tokens_emitted = 0
        self.prompts: dict[str, list[int]] = {}  # request id -> the prompt it was given (for tests)

    def add(self, request_id: str, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        turn = [int(t) for t in self.script(request_id, prompt_ids)]
        stop = "eos" if len(turn) <= max_new_tokens else "length"
        self.prompts[request_id] = list(prompt_ids)
        self.queue.append(_Request(request_id, turn[:max_new_tokens], stop))

    def step(self) -> list[TurnOutput]:
        done: list[TurnOutput] = []
        steps = 0
        for _ in range(self.steps_per_call):
            while self.queue and len(self.active) < self.slots:
                self.active.append(self.queue.popleft())
            if not self.active:
                break
            steps += 1
            self.decode_steps += 1
            for r in self.active:
                r.emitted += 1
            self.tokens_emitted += len(self.active)
            finished = [r for r in self.active if r.emitted >= len(r.tokens)]
            self.active = [r for r in self.active if r.emitted < len(r.tokens)]
            for r in finished:
                logprobs = [fake_logprob(t) for t in r.tokens]
                done.append(TurnOutput(r.request_id, r.tokens, logprobs, r.stop))
        if steps and self.step_s:
            # One sleep for the whole call, as one device call runs all its steps: a sleep per step would
            # add the scheduler's wake-up delay to every step on a busy machine.
            time.sleep(steps * self.step_s)
        return done

    def pending(self) -> int:
        return len(self.queue) + len(self.active)

    def occupancy(self) -> float:
        """Fraction of slot-steps that produced a token."""
        return self.tokens_emitted / max(1, self.decode_steps * self.slots)


def turn_ids(message: Message, tokenizer: Any) -> list[int]:
    """The ids a policy generates for an assistant message: its body, then `<|im_end|>`."""
    return tokenizer.encode(tokenizer.chat_format.assistant_text(message))


def expert_script(
    openings: Sequence[Sequence[int]], turns: Sequence[Sequence[Sequence[int]]], tokenizer: Any
) -> Script:
    """A script that replays `turns[i]` (a list of turns' ids) for the episode whose prompt starts with
    `openings[i]`; the turn number is read off the prompt (each turn adds two `<|im_end|>`: the assistant's
    and the tool results'), so a restarted episode replays from its first turn. Past the last scripted turn
    it answers "Done." with no call."""
    keyed = [(list(o), [list(t) for t in ts]) for o, ts in zip(openings, turns)]
    im_end = tokenizer.im_end_id
    final = tokenizer.encode("Done." + chat.IM_END)

    def script(request_id: str, prompt_ids: Sequence[int]) -> Sequence[int]:
        del request_id
        prompt = list(prompt_ids)
        for opening, ts in keyed:
            if prompt[: len(opening)] == opening:
                n = prompt[len(opening) :].count(im_end) // 2
                return ts[n] if n < len(ts) else final
        raise KeyError("no script for this prompt")

    return script
