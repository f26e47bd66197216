"""A server in a thread and an engine that replays fixed turns, for the serving tests (test_serve.py,
test_agent.py, test_endpoint_eval.py)."""

import pytest

from composer.sampler import TurnOutput
from composer.serving import load
from composer.serving.engine import Handle
from env import chat
from env.sandbox import IsolationUnavailable, isolation


def require_bubblewrap(who: str) -> None:
    """Skips the test (saying why) where the sandbox cannot isolate: `who` runs the model's commands."""
    try:
        isolation.resolve_isolation("auto")
    except IsolationUnavailable as e:
        pytest.skip(f"{who} runs the model's commands, which needs bubblewrap: {e}")


Server = load.LocalServer  # `app` on a free local port, in a thread: .url, .close()


class Replay:
    """An engine that answers every request with the next of `turns` (text), as the sampler would."""

    def __init__(self, tokenizer, config, turns: list[str]) -> None:
        self.tokenizer, self.config, self.turns = tokenizer, config, list(turns)
        self.max_len, self.cfg = 1 << 20, type("Cfg", (), {"vocab_size": 1024})()
        self.prompts: list[list[int]] = []  # what each request gave the model

    def submit(self, prompt_ids, max_new, **kw) -> Handle:
        self.prompts.append(list(prompt_ids))
        handle = Handle("replay")
        ids = self.tokenizer.encode(self.turns.pop(0) + chat.IM_END)
        handle.events.put(("tokens", ids, [-0.5] * len(ids)))
        handle.events.put(("done", TurnOutput("replay", ids, [-0.5] * len(ids), "eos")))
        return handle
