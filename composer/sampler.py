"""The continuous-batching sampler: jitted prefill and multi-step decode over a slot KV cache.

    s = Sampler(params, cfg, slots=16, max_len=2048, steps_per_call=8, temperature=1.0, top_p=1.0,
                eos_id=tok.im_end_id, key=jax.random.key(0), line_tokens=learner.line_tokens(cfg, tok))
    s.add("episode-3@0", prompt_ids, max_new_tokens=256)
    outputs = s.step()          # list[TurnOutput]: the turns that finished during this call

This is the engine of the rollout driver (env/rollout/driver.py: add / step / pending).

Slots. The cache holds `slots` rows of `max_len` positions (one buffer per layer). A request holds one
slot while its turn generates; when the turn ends (it drew `eos_id`, or `max_new_tokens` tokens) it
leaves and a waiting request takes the slot at the next `step()`. An episode that comes back with tool
results is a new request whose prompt is its whole token stream. Prefix reuse: a free slot remembers the
tokens whose keys and values it still holds (the finished turn's prompt and tokens), and a request whose
prompt extends them takes that slot and computes only the new tokens (EXTEND below); otherwise the prompt
is prefilled again, from the end of the last whole message it shares with the slot it is given (a new
episode's system message), or from scratch. Episodes waiting on tools reserve nothing: a slot
they left is given to a new request when no free slot is blank, least recently used first. New params
(`update_params`) forget every remembered prefix. `stats()` counts the reused tokens and
`prefill_share` is the share of wall time spent on prompts.

One `step()`:
  PREFILL  waiting requests (up to the free slots), grouped by prompt-length bucket, one padded call per
           bucket (or per `max_rows` of its requests; rows padded to a power of two, lengths to
           `prefill_buckets`, by default 32, 48, 64, 96, ...: at most 1.5x padding, few shapes to
           compile).
           Each call prefills into a small cache, writes its rows into their slots of the slot cache
           (donated, written in place) and returns the logits at each row's last prompt position; a
           small separate call (`draw`) samples each request's first token from them.
  SHARED   a request whose prompt a slot holds (a turn with that prompt was prefilled there and the
           slot has not been given to another prompt since), or that an earlier request of the same
           step brings, is not computed again (the members of an RL group): it gets a copy of that
           slot's row (`copy_rows`; none when it takes that slot itself) and draws its first token, with
           its own key, from the logits stored with the prompt (`stats()['shared_prompts']`).
  EXTEND   the same for requests that reuse a slot's prefix: only the new tokens run, at their positions,
           attending to the slot's cached keys and values (`extend`).
  DECODE   `steps_per_call` decode steps in ONE device call (lax.while_loop, no host round trip per
           token; it exits early once every slot is idle). Each step feeds every active slot its last
           token and draws the next. A slot whose turn ends mid-call idles until the call returns (its
           position is -1: padding, which the model neither writes nor attends); idle slot-steps are
           what `occupancy` (kept tokens / slot-steps) measures. Attention runs over a window of the
           cache (a bucket of `length_buckets`) that covers every active slot for the whole call, not
           over all of max_len: the model's per-step cache work grows with the length it is given.

Keys and log-probs: see composer/sampling.py (a token's key depends only on its request id and its index
in the turn, so batching never changes what is drawn; the log-prob recorded is that of the distribution
the token was drawn from, which equals the learner's at the same temperature when top_p is 1).

The device calls (PREFILL, EXTEND, DECODE), the per-layer cache and the dropless expert capacity live
in composer/sampler_device.py. `line_tokens` (copy_head.LineTokens) are the chat tokens a copy head with
line keys needs, the tokenizer's (composer/pipeline/learner.line_tokens); a model without them takes None.

Params: `update_params` swaps the weights used from the next device call on. A turn that is generating
across the swap continues with the new weights over a cache written by the old ones (the learner's
truncated importance-sampling correction covers the difference).
"""

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from composer import copy_head, sampling
from composer.model_config import ModelConfig
from composer.sampler_device import (
    SlotState,
    copy_rows,
    decode,
    draw,
    extend,
    init_layer_caches,
    per_expert_buffers,
    prefill,
    sampling_config,
    unstack_layers,
)
from env.rollout.episode import TurnOutput

__all__ = ["Sampler", "TurnOutput", "default_buckets", "sampling_config"]

# The smallest attention window of a decode call; windows are length_buckets(_MIN_WINDOW, max_len).
_MIN_WINDOW = 64


def length_buckets(low: int, max_len: int) -> tuple[int, ...]:
    """low * 2^i and 1.5 * low * 2^i below max_len, then max_len: a length rounds up by at most 1.5x,
    and a cache of max_len has about 2 log2(max_len / low) shapes to compile."""
    buckets, n = [], low
    while n < max_len:
        buckets += [n, n * 3 // 2]
        n *= 2
    return (*sorted(b for b in buckets if b < max_len), max_len)


def default_buckets(max_len: int) -> tuple[int, ...]:
    """Prefill length buckets: 32, 48, 64, 96, ... capped by (and always including) max_len."""
    return length_buckets(32, max_len)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclasses.dataclass
class _Request:
    request_id: str
    prompt: list[int]
    max_new: int
    seed: int
    temperature: float
    top_p: float
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)


def _check_settings(temperature: float, top_p: float) -> None:
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")


class Sampler:
    """Continuous-batching sampler with the engine protocol add / step / pending (module docstring)."""

    def __init__(
        self,
        params: Any,
        cfg: ModelConfig,
        *,
        slots: int,
        max_len: int,
        steps_per_call: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        eos_id: int | None,
        key: jax.Array,
        prefill_buckets: Sequence[int] | None = None,
        reuse_prefix: bool = True,
        max_rows: int = 0,
        line_tokens: copy_head.LineTokens | None = None,
    ):
        _check_settings(temperature, top_p)
        self.cfg = sampling_config(cfg)
        # Checked here, not at the first prefill; None where unused, so no ids mean no extra compiles.
        self.line_tokens = copy_head.active_line_tokens(cfg, line_tokens)
        self.n_moe_layers = cfg.n_moe_layers
        self.params, self.version = unstack_layers(params, per_expert_buffers(cfg)), 0
        self.slots, self.max_len, self.steps_per_call = slots, max_len, steps_per_call
        # The defaults of `add`. Per slot and traced, not static: greedy EVAL, sampled RL rollouts and
        # served requests with settings of their own share every compiled program and the one KV cache.
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.slot_temperature = np.full(slots, temperature, np.float32)
        self.slot_top_p = np.full(slots, top_p, np.float32)
        self.eos_id = -1 if eos_id is None else int(eos_id)
        self.key = key
        self.buckets = tuple(sorted(set(prefill_buckets or default_buckets(max_len))))
        if self.buckets[-1] < max_len:
            self.buckets = (*self.buckets, max_len)
        self.windows = length_buckets(_MIN_WINDOW, max_len)
        self.cache = init_layer_caches(self.cfg, slots, max_len)
        self.state = SlotState(*(np.zeros(slots, np.int32) for _ in SlotState._fields))  # host, numpy
        self.state.position_b[:] = -1
        self.slot_request: list[_Request | None] = [None] * slots
        # For a free slot: the tokens at positions [0, n) of its cache (None: nothing worth keeping), and
        # when it was left (least recently used goes first to a request that reuses nothing).
        self.slot_prefix: list[list[int] | None] = [None] * slots
        self.slot_left: list[int] = [0] * slots
        # The prompt whose keys and values a slot holds at [0, len) and its next-token logits, from the
        # turn prefilled there (generating or done since) until the slot is given to another prompt.
        self.slot_prompt: list[tuple[tuple[int, ...], np.ndarray] | None] = [None] * slots
        self.reuse_prefix = reuse_prefix  # False: every prompt is prefilled from scratch (for comparison)
        # Rows of one PREFILL / EXTEND call at most (0: slots); a larger group takes several calls. Each
        # (rows, width) pair is its own compiled program, so fewer row counts compile fewer programs.
        self.max_rows = min(max_rows, slots) if max_rows > 0 else slots
        self._clock = 0
        self.waiting: deque[_Request] = deque()
        self.known: set[str] = set()
        self._generate_calls = 0
        self.counters = dict.fromkeys(
            (
                "tokens_generated", "decode_tokens", "decode_slot_steps", "decode_steps", "decode_calls",
                "prefill_tokens", "prefill_padded_tokens", "prefill_calls", "turns",
                "reused_tokens", "extend_calls", "shared_prompts",
                "moe_passes", "moe_redone",
            ),
            0,
        )  # fmt: skip
        self.times = {"prefill_s": 0.0, "decode_s": 0.0}

    # ---- the engine protocol

    def add(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> None:
        """Queues one turn. It generates at most max_new_tokens, and at most max_len - len(prompt) + 1
        (the last token drawn is never fed back, so it needs no cache entry); a cut turn stops 'length'.
        temperature / top_p: this turn's own (default: the sampler's)."""
        temperature = self.temperature if temperature is None else float(temperature)
        top_p = self.top_p if top_p is None else float(top_p)
        _check_settings(temperature, top_p)
        prompt = [int(i) for i in prompt_ids]
        if not 0 < len(prompt) <= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens: need 1..max_len={self.max_len}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if request_id in self.known:
            raise ValueError(f"request {request_id!r} is already queued or generating")
        max_new = min(max_new_tokens, self.max_len - len(prompt) + 1)
        self.known.add(request_id)
        seed = sampling.request_seed(request_id)
        self.waiting.append(_Request(request_id, prompt, max_new, seed, temperature, top_p))

    def step(self) -> list[TurnOutput]:
        """PREFILL waiting requests into free slots, then up to steps_per_call DECODE steps in one call.
        Returns the turns that finished."""
        finished: list[TurnOutput] = []
        free = [s for s in range(self.slots) if self.slot_request[s] is None]
        take = [self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))]
        leaders, held, followers = self._split_shared(take)
        assigned = self._assign(free, leaders)
        used = {slot for slot, _, _ in assigned}
        spare = self._blank_then_lru([s for s in free if s not in used])
        if held:  # before any prefill of this step writes a slot they copy from
            placed = []
            for req, source, entry in held:  # a free source slot is taken by the request itself
                slot = source if source in spare else spare[0]
                spare.remove(slot)
                placed.append((slot, req, source, entry))
            finished += self._share(placed)
        groups: dict[tuple[int, bool], list[tuple[int, _Request, int]]] = {}
        for slot, req, offset in assigned:
            key = (self._bucket(len(req.prompt) - offset), offset > 0)
            groups.setdefault(key, []).append((slot, req, offset))
        for (width, _), group in sorted(groups.items()):
            for i in range(0, len(group), self.max_rows):
                finished += self._prefill(width, group[i : i + self.max_rows])
        if followers:
            by_id = {req.request_id: slot for slot, req, _ in assigned}
            finished += self._share(
                [(spare.pop(0), req, by_id[lead], self.slot_prompt[by_id[lead]]) for req, lead in followers]
            )
        if any(r is not None for r in self.slot_request):
            finished += self._decode()
        return finished

    def pending(self) -> int:
        """Requests queued or generating."""
        return len(self.waiting) + sum(r is not None for r in self.slot_request)

    # ---- the rest of the interface

    def update_params(self, params: Any, version: int) -> None:
        """Uses `params` (policy version `version`) from the next device call on; remembered prefixes were
        computed by the old ones, so they are forgotten."""
        self.params, self.version = unstack_layers(params, per_expert_buffers(self.cfg)), int(version)
        self.slot_prefix = [None] * self.slots
        self.slot_prompt = [None] * self.slots

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, request_ids: Sequence[str] | None = None
    ) -> list[TurnOutput]:
        """Adds every prompt and steps until all are done; the outputs in prompt order. Without request_ids
        each call uses fresh ids ('g{call}-{i}'), so repeated calls draw different tokens."""
        if request_ids is None:
            request_ids = [f"g{self._generate_calls}-{i}" for i in range(len(prompts))]
        self._generate_calls += 1
        for rid, prompt in zip(request_ids, prompts, strict=True):
            self.add(rid, prompt, max_new_tokens)
        done: dict[str, TurnOutput] = {}
        wanted = set(request_ids)
        while not wanted <= done.keys():
            for out in self.step():
                done[out.request_id] = out
        return [done[rid] for rid in request_ids]

    def stats(self) -> dict[str, float]:
        """Counters since construction: tokens generated (prefill's first tokens included), decode tokens
        and slot-steps (occupancy = decode tokens kept / decode slot-steps), prefill tokens (real and
        padded), calls, MoE layer passes (and the share redone with full expert capacity), wall times and
        the prefill share of them, tokens/s, the policy version."""
        c, t = self.counters, self.times
        wall = t["prefill_s"] + t["decode_s"]
        return {
            **c,
            **t,
            "occupancy": c["decode_tokens"] / max(1, c["decode_slot_steps"]),
            "prefill_share": t["prefill_s"] / wall if wall else 0.0,
            "moe_redo_rate": c["moe_redone"] / max(1, c["moe_passes"]),
            "tokens_per_s": c["tokens_generated"] / wall if wall else 0.0,
            "version": self.version,
        }

    # ---- internals

    def _bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _split_shared(
        self, take: list[_Request]
    ) -> tuple[list[_Request], list[tuple], list[tuple[_Request, str]]]:
        """(leaders, held, followers) of `take`. A request whose prompt some slot holds (`slot_prompt`: a
        turn with that prompt was prefilled there, generating or done since) is held: (request, that
        slot, its slot_prompt entry). One whose prompt equals an earlier leader's in `take` follows it:
        (request, leader id). Both copy a row and draw from stored logits instead of computing the prompt
        again (the members of an RL group). All are leaders when prefix reuse is off."""
        if not self.reuse_prefix:
            return take, [], []
        holder = {entry[0]: s for s, entry in enumerate(self.slot_prompt) if entry is not None}
        leaders, held, followers, first = [], [], [], {}
        for req in take:
            key = tuple(req.prompt)
            if key in holder:
                held.append((req, holder[key], self.slot_prompt[holder[key]]))
            elif key in first:
                followers.append((req, first[key]))
            else:
                first[key] = req.request_id
                leaders.append(req)
        return leaders, held, followers

    def _assign(self, free: list[int], take: list[_Request]) -> list[tuple[int, _Request, int]]:
        """(slot, request, offset) for each request: a free slot whose remembered prefix the prompt extends
        (offset = the prefix's length), else a blank slot, else the least recently left one (offset 0)."""
        out, rest = [], []
        free = set(free)
        for req in take:
            n = len(req.prompt)
            match = next(
                (
                    s
                    for s in free
                    if (p := self.slot_prefix[s]) is not None and len(p) < n and req.prompt[: len(p)] == p
                ),
                None,
            )
            if match is None:
                rest.append(req)
                continue
            free.discard(match)
            out.append((match, req, len(self.slot_prefix[match])))
        order = self._blank_then_lru(free)
        out += [(slot, req, self._shared_messages(slot, req.prompt)) for slot, req in zip(order, rest)]
        for slot, _, _ in out:
            self.slot_prefix[slot] = self.slot_prompt[slot] = None
        return out

    def _blank_then_lru(self, slots) -> list[int]:
        """`slots` in the order a request that reuses nothing takes them: blank ones (no remembered prefix)
        first, then the least recently left."""
        return sorted(slots, key=lambda s: (self.slot_prefix[s] is not None, self.slot_left[s]))

    def _shared_messages(self, slot: int, prompt: list[int]) -> int:
        """How many leading tokens of `prompt` the slot already holds as whole messages: the longest prefix
        it shares with the slot's remembered one, cut after its last `eos_id` (0: none, or no eos_id).

        A new episode's prompt shares the system message with whatever conversation the slot held, so it
        extends from there instead of being prefilled whole (on the CPU default, ~150 of ~590 tokens).
        The cut at a message's end keeps this exact for the copy head: a cached key's line term looks
        ahead to the end of its line, which lies inside its own (finished) message.
        """
        held = self.slot_prefix[slot]
        if held is None or self.eos_id < 0:
            return 0
        m = min(len(held), len(prompt) - 1)  # at least one token of the prompt runs
        a, b = np.asarray(held[:m]), np.asarray(prompt[:m])
        differ = np.flatnonzero(a != b)
        shared = b[: differ[0] if len(differ) else m]
        ends = np.flatnonzero(shared == self.eos_id)
        return int(ends[-1]) + 1 if len(ends) else 0

    def _finish(self, slot: int | None, req: _Request) -> TurnOutput:
        if slot is not None:
            self.slot_request[slot] = None
            # An idle slot keeps the defaults: a batch whose active turns are all greedy stays greedy.
            self.slot_temperature[slot], self.slot_top_p[slot] = self.temperature, self.top_p
            # The cache holds the prompt and every drawn token but the last (never fed back).
            self.slot_prefix[slot] = req.prompt + req.tokens[:-1] if self.reuse_prefix else None
            self._clock += 1
            self.slot_left[slot] = self._clock
        self.known.discard(req.request_id)
        self.counters["turns"] += 1
        stop = "eos" if req.tokens[-1] == self.eos_id else "length"
        return TurnOutput(req.request_id, req.tokens, req.logprobs, stop)

    def _prefill(self, width: int, group: list[tuple[int, _Request, int]]) -> list[TurnOutput]:
        """PREFILL (every offset 0) or EXTEND (every offset > 0) of one group of (slot, request, offset),
        then each request's first token (`draw`). Each slot remembers the prompt it now holds and its
        next-token logits (`slot_prompt`), for requests with the same prompt (`_share`)."""
        start = time.perf_counter()
        rows = min(_pow2_at_least(len(group)), self.max_rows)
        tokens = np.zeros((rows, width), np.int32)
        offsets = np.zeros(rows, np.int32)
        lengths = np.zeros(rows, np.int32)
        slots = np.full(rows, self.slots, np.int32)  # out of range: padding rows are not written
        seeds = np.zeros(rows, np.int32)
        for i, (slot, req, offset) in enumerate(group):
            suffix = req.prompt[offset:]
            tokens[i, : len(suffix)] = suffix
            offsets[i], lengths[i], slots[i], seeds[i] = offset, len(suffix), slot, req.seed
        if group[0][2] > 0:
            self.cache, logits_rv, redone = extend(
                self.params,
                self.cache,
                tokens,
                offsets,
                lengths,
                slots,
                cfg=self.cfg,
                line_tokens=self.line_tokens,
            )
            self.counters["extend_calls"] += 1
            self.counters["reused_tokens"] += int(offsets.sum())
        else:
            self.cache, logits_rv, redone = prefill(
                self.params,
                self.cache,
                tokens,
                lengths,
                slots,
                cfg=self.cfg,
                line_tokens=self.line_tokens,
            )
        first, logp = draw(
            self.key, seeds, logits_rv, *self._row_settings([req for _, req, _ in group], rows)
        )
        first, logp, redone, logits_rv = jax.device_get((first, logp, redone, logits_rv))
        for i, (slot, req, _) in enumerate(group):
            self.slot_prompt[slot] = (tuple(req.prompt), logits_rv[i])
        finished = self._start([(slot, req) for slot, req, _ in group], first, logp)
        c = self.counters
        c["prefill_calls"] += 1
        c["moe_passes"] += self.n_moe_layers
        c["moe_redone"] += int(redone)
        c["prefill_tokens"] += int(lengths.sum())
        c["prefill_padded_tokens"] += rows * width
        self.times["prefill_s"] += time.perf_counter() - start
        return finished

    def _share(self, placed: list[tuple[int, _Request, int, tuple]]) -> list[TurnOutput]:
        """(slot, request, source slot, the source's slot_prompt entry): each slot gets a copy of the
        source's row, which holds the request's prompt, and each request its first token drawn from the
        logits stored with it, with its own key: what a prefill of its own would give, for the price of a
        copy (none when the source is the slot itself)."""
        start = time.perf_counter()
        n = len(placed)
        rows = _pow2_at_least(n)
        src = np.zeros(rows, np.int32)
        dst = np.full(rows, self.slots, np.int32)  # out of range: padding rows are dropped
        lengths = np.zeros(rows, np.int32)
        seeds = np.zeros(rows, np.int32)
        logits_rv = np.zeros((rows, self.cfg.vocab_size), np.float32)
        for i, (slot, req, source, entry) in enumerate(placed):
            src[i], dst[i], lengths[i], seeds[i] = source, slot, len(req.prompt), req.seed
            logits_rv[i] = entry[1]
        self.cache = copy_rows(self.cache, src, dst, lengths)
        settings = self._row_settings([req for _, req, _, _ in placed], rows)
        first, logp = jax.device_get(draw(self.key, seeds, logits_rv, *settings))
        for slot, _, _, entry in placed:
            self.slot_prefix[slot], self.slot_prompt[slot] = None, entry
        finished = self._start([(slot, req) for slot, req, _, _ in placed], first, logp)
        self.counters["shared_prompts"] += n
        self.counters["reused_tokens"] += int(lengths.sum())
        self.times["prefill_s"] += time.perf_counter() - start
        return finished

    def _row_settings(self, requests: list[_Request], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(temperature [rows], top_p [rows]) of a call's rows: each request's own, the defaults after."""
        temperature = np.full(rows, self.temperature, np.float32)
        top_p = np.full(rows, self.top_p, np.float32)
        for i, req in enumerate(requests):
            temperature[i], top_p[i] = req.temperature, req.top_p
        return temperature, top_p

    def _start(
        self, placed: list[tuple[int, _Request]], first: np.ndarray, logp: np.ndarray
    ) -> list[TurnOutput]:
        """Records each placed request's first token; one that is already done (eos, or one token asked)
        finishes, the others take their slots for DECODE. Returns the finished turns."""
        finished = []
        st = self.state
        for i, (slot, req) in enumerate(placed):
            req.tokens.append(int(first[i]))
            req.logprobs.append(float(logp[i]))
            if req.tokens[-1] == self.eos_id or req.max_new == 1:
                finished.append(self._finish(None, req))
                continue
            self.slot_request[slot] = req
            self.slot_temperature[slot], self.slot_top_p[slot] = req.temperature, req.top_p
            st.token_b[slot], st.position_b[slot], st.index_b[slot] = first[i], len(req.prompt), 1
            st.max_new_b[slot], st.seed_b[slot] = req.max_new, req.seed
        self.counters["tokens_generated"] += len(placed)
        return finished

    def _decode(self) -> list[TurnOutput]:
        start = time.perf_counter()
        n = self.steps_per_call
        top = int(self.state.position_b.max()) + n
        window = next(w for w in self.windows if w >= min(top, self.max_len))
        self.cache, state, out = decode(
            self.params, self.cache, self.state, self.key, np.int32(self.eos_id), cfg=self.cfg, n_steps=n,
            window=window, line_tokens=self.line_tokens, temperature=self.slot_temperature,
            top_p=self.slot_top_p,
        )  # fmt: skip
        state, out = jax.device_get((state, out))
        self.state = SlotState(*(np.array(x) for x in state))  # writable host copies
        finished = []
        for slot, req in enumerate(self.slot_request):
            if req is None:
                continue
            kept = out.kept_nb[:, slot]
            req.tokens += out.tokens_nb[kept, slot].tolist()
            req.logprobs += out.logprobs_nb[kept, slot].tolist()
            if self.state.position_b[slot] < 0:
                finished.append(self._finish(slot, req))
        kept_total = int(out.kept_nb.sum())
        c = self.counters
        c["decode_calls"] += 1
        c["decode_steps"] += int(out.steps)
        c["decode_slot_steps"] += int(out.steps) * self.slots
        c["decode_tokens"] += kept_total
        c["moe_passes"] += int(out.steps) * self.n_moe_layers
        c["moe_redone"] += int(out.moe_redone)
        c["tokens_generated"] += kept_total
        self.times["decode_s"] += time.perf_counter() - start
        return finished
