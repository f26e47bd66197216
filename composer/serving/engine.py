"""The serving engine: one thread steps the continuous-batching sampler; requests come from any thread.

    engine = Engine(params, cfg, tokenizer, config)     # starts its thread
    handle = engine.submit(prompt_ids, max_new=64, temperature=0.7, top_p=1.0, seed=None)
    for event in handle:                                  # ('tokens', ids, logprobs) ... ('done', TurnOutput)
        ...

Requests that arrive while others generate join the same device calls (the sampler batches them), and a
conversation's later turns reuse its cached prefix (the sampler's prefix reuse). Each request draws at its
own temperature and top-p within the same batch: one KV cache (`sampling.decode_slots` slots, sized by the
memory plan) whatever settings clients send. A request's `seed` fixes its draws: two requests with the same
seed, prompt and settings get the same tokens.
"""

import itertools
import queue
import threading
from collections.abc import Iterator

import jax
import ml_collections

from composer import sampling
from composer.pipeline import learner as learner_lib
from composer.pipeline import rollouts
from composer.sampler import Sampler, TurnOutput

_IDLE_WAIT_S = 0.05


class Handle:
    """A submitted request's events, in order: ('tokens', new ids, their log-probs) as they are drawn, then
    ('done', TurnOutput), or ('error', message)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.events: queue.Queue = queue.Queue()
        self.sent = 0  # tokens already reported

    def __iter__(self) -> Iterator[tuple]:
        while True:
            event = self.events.get()
            yield event
            if event[0] in ("done", "error"):
                return

    def result(self) -> TurnOutput:
        """Waits for the turn; raises RuntimeError with the engine's message on an error."""
        for event in self:
            if event[0] == "done":
                return event[1]
            if event[0] == "error":
                raise RuntimeError(event[1])
        raise RuntimeError("the engine stopped")


class Engine:
    """One sampler over the model's weights, stepped by one thread (module docstring)."""

    def __init__(self, params, cfg, tokenizer, config: ml_collections.ConfigDict) -> None:
        self.cfg, self.tokenizer, self.config = cfg, tokenizer, config
        self.max_len = rollouts.max_len(config)
        self.sampler = Sampler(
            params, cfg, slots=rollouts.decode_slots(config, cfg), max_len=self.max_len,
            steps_per_call=config.sampling.steps_per_call, temperature=1.0, top_p=1.0,
            eos_id=tokenizer.im_end_id, key=jax.random.key(config.seed),
            max_rows=config.sampling.max_prefill_rows, line_tokens=learner_lib.line_tokens(cfg, tokenizer),
        )  # fmt: skip
        self.handles: dict[str, Handle] = {}
        self.inbox: queue.Queue = queue.Queue()
        self.ids = itertools.count()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self.thread.start()

    def submit(
        self,
        prompt_ids: list[int],
        max_new: int,
        *,
        temperature: float,
        top_p: float,
        seed: int | None = None,
    ) -> Handle:
        """Queues one generation; its events arrive on the returned handle."""
        request_id = f"r{next(self.ids)}"
        handle = Handle(request_id)
        self.inbox.put((handle, list(prompt_ids), int(max_new), float(temperature), float(top_p), seed))
        return handle

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)

    def _admit(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=_IDLE_WAIT_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            handle, prompt, max_new, temperature, top_p, seed = item
            try:
                self.sampler.add(handle.request_id, prompt, max_new, temperature, top_p)
                if seed is not None:  # the draws depend on the seed, not on the request's id
                    self.sampler.waiting[-1].seed = sampling.request_seed(f"seed-{seed}")
                self.handles[handle.request_id] = handle
            except Exception as e:  # a request the sampler refuses fails alone
                handle.events.put(("error", str(e)))
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _run(self) -> None:
        sampler = self.sampler
        while not self.stopping.is_set():
            self._admit(block=not sampler.pending())
            if not sampler.pending():
                continue
            try:
                finished = sampler.step()
            except Exception as e:  # the device call failed: every request in the sampler fails
                for req in [*sampler.waiting, *(r for r in sampler.slot_request if r is not None)]:
                    handle = self.handles.pop(req.request_id, None)
                    if handle is not None:
                        handle.events.put(("error", f"generation failed: {e}"))
                sampler.waiting.clear()
                sampler.slot_request = [None] * sampler.slots
                sampler.known.clear()
                continue
            for req in sampler.slot_request:  # stream what was drawn since the last call
                if req is not None and req.request_id in self.handles:
                    self._progress(self.handles[req.request_id], req.tokens, req.logprobs)
            for out in finished:
                handle = self.handles.pop(out.request_id, None)
                if handle is not None:
                    self._progress(handle, out.token_ids, out.logprobs)
                    handle.events.put(("done", out))

    @staticmethod
    def _progress(handle: Handle, tokens: list[int], logprobs: list[float]) -> None:
        if len(tokens) > handle.sent:
            handle.events.put(("tokens", list(tokens[handle.sent :]), list(logprobs[handle.sent :])))
            handle.sent = len(tokens)
