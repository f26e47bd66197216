"""The episode state machine and the drivers, against an in-process pool (no processes, no sandboxes).

The real pool (worker processes, sandboxes, grading) is tested in test_rollout_pool.py.
"""

import dataclasses
import types

import pytest

from env import chat
from env import tokenizer as tk
from env.chat import CallError, Message, ToolCall
from env.rollout import Event, RolloutLimits, RolloutPool, iter_groups, run_episodes, run_episodes_sync
from env.rollout.engines import ScriptedEngine, fake_logprob, turn_ids
from env.tools import first_edit_after_read

LIMITS = RolloutLimits(max_turns=8, max_episode_tokens=4096, max_turn_tokens=256, episode_timeout_s=1e9)
READ = ToolCall("read_file", {"target_file": "src/stats.py"})
GREP = ToolCall("grep", {"pattern": "def mean", "path": "src"})
EDIT = ToolCall("search_replace", {"file_path": "src/stats.py", "old_string": "a - b", "new_string": "a + b"})


@dataclasses.dataclass(frozen=True)
class Result:
    text: str
    is_error: bool = False
    found_nothing: bool = False


@dataclasses.dataclass(frozen=True)
class Grade:
    reward: float
    components: dict


class FakePool(RolloutPool):
    """Answers every call at the next poll: a result naming the call (an error result for a CallError), and a
    grade of 1. `on_calls(episode_id, n)` may return an event kind ('restart' | 'error') to send instead."""

    def __init__(self, result_text=None, on_calls=None, on_start=None):
        self.events: list[Event] = []
        self.result_text = result_text or (lambda call: f"result of {call.name}\n{call.arguments}")
        self.on_calls, self.on_start = on_calls, on_start
        self.calls: dict[str, list] = {}
        self.finished: dict[str, bool] = {}
        self.started: list[str] = []

    def start_episode(self, episode_id, task_dir):
        self.started.append(episode_id)
        kind = self.on_start(episode_id) if self.on_start else None
        self.events.append(Event(episode_id, kind or "started", {"reason": "fake"}))

    def submit_calls(self, episode_id, calls):
        self.calls.setdefault(episode_id, []).append(list(calls))
        kind = self.on_calls(episode_id, len(self.calls[episode_id])) if self.on_calls else None
        if kind:
            self.events.append(Event(episode_id, kind, {"reason": "fake"}))
            return
        results = [
            Result(f"Error: {c.message}", True) if isinstance(c, CallError) else Result(self.result_text(c))
            for c in calls
        ]
        self.events.append(Event(episode_id, "tool_results", {"results": results, "elapsed_s": 0.0}))

    def finish_episode(self, episode_id, *, grade):
        self.finished[episode_id] = grade
        self.events.append(Event(episode_id, "graded", {"grade": Grade(1.0, {"tool_errors": 0})}))

    def poll(self, timeout):
        events, self.events = self.events, []
        return events

    def metrics(self):
        return {}

    def close(self):
        pass


@pytest.fixture(scope="module")
def tok() -> tk.Tokenizer:
    texts = [
        chat.render_text(
            [
                Message("system", "Fix the bug."),
                Message("user", f"mean([{i}, 2]) returned {i - 2}, expected {i + 2}"),
                Message("assistant", "Looking at the code.", [READ, GREP]),
                Message("tool", "     1|def mean(a, b):\n     2|    return a - b\n" * 3),
                Message("assistant", "Fixing.", [EDIT]),
                Message("tool", "The file src/stats.py has been updated."),
                Message("assistant", "Done: mean adds now."),
            ]
        )
        for i in range(40)
    ]
    return tk.train_tokenizer(texts, vocab_size=400)


def _task(i: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        instance_id=f"task-{i}", path=f"/nonexistent/task-{i}", problem_statement=f"bug {i}"
    )


def _prompt(task) -> list[Message]:
    return [Message("system", "Fix the bug."), Message("user", task.problem_statement)]


def _turns_script(turns: list[Message], tok):
    """A script that plays `turns` in order, the turn number read off the prompt (two <|im_end|> a turn)."""
    ids = [turn_ids(m, tok) for m in turns]

    def script(request_id, prompt_ids):
        n = (list(prompt_ids).count(tok.im_end_id) - 2) // 2
        return ids[min(n, len(ids) - 1)]

    return script


def _run(tok, turns, pool=None, limits=LIMITS, n_tasks=1, group_size=1, **kw):
    engine = ScriptedEngine(_turns_script(turns, tok), slots=4, steps_per_call=4)
    pool = pool or FakePool()
    results = run_episodes(
        [_task(i) for i in range(n_tasks)],
        engine,
        pool,
        tokenizer=tok,
        group_size=group_size,
        limits=limits,
        prompt_fn=_prompt,
        **kw,
    )
    return results, engine, pool


SOLVE = [
    Message("assistant", "Looking at the code.", [READ, GREP]),
    Message("assistant", "Fixing.", [EDIT]),
    Message("assistant", "Done: mean adds now."),
]


def test_token_stream_equals_render_and_masks_generated_tokens(tok):
    (r,), engine, _ = _run(tok, SOLVE)
    assert r.n_turns == 3 and r.n_tool_calls == 3 and r.n_parallel_turns == 1 and not r.truncated
    assert [m.role for m in r.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ] + ["assistant"]
    assert r.messages[2].tool_calls == [READ, GREP]
    # The whole stream is the render of the conversation (which ends with the newline after <|im_end|>) ...
    ids, mask = tk.render(r.messages, tok)
    assert tok.decode(r.ids) + "\n" == chat.render_text(r.messages)
    assert r.ids == list(ids[:-1]) and r.loss_mask == list(mask[:-1])
    # ... the log-probs sit exactly on the generated tokens ...
    assert r.logprobs == [fake_logprob(t) if m else 0.0 for t, m in zip(r.ids, r.loss_mask)]
    # ... and each turn's prompt was the stream so far: the conversation so far plus the generation prompt.
    assistant_at = [i for i, m in enumerate(r.messages) if m.role == "assistant"]
    assert len(engine.prompts) == 3
    for k, prompt in enumerate(engine.prompts.values()):
        assert prompt == r.ids[: len(prompt)]
        assert tok.decode(prompt) == chat.render_text(
            r.messages[: assistant_at[k]], add_generation_prompt=True
        )
    assert r.reward == 1.0 and r.searched_before_edit is True and r.restarts == 0 and r.error is None
    assert r.error_spans == []  # no call failed


def test_generated_ids_are_kept_verbatim_not_retokenised(tok):
    # Spell "Done." one byte-token at a time: a re-tokenisation of the text would merge them.
    spelled = [i for ch in "Done." for i in tok.encode(ch)] + [tok.im_end_id]
    assert tok.encode("Done.") != spelled[:-1]
    engine = ScriptedEngine(lambda rid, p: spelled)
    (r,) = run_episodes(
        [_task(0)], engine, FakePool(), tokenizer=tok, group_size=1, limits=LIMITS, prompt_fn=_prompt
    )
    assert r.ids[-len(spelled) :] == spelled and r.messages[-1].content == "Done."


def test_turn_limit_truncates_and_the_last_calls_do_not_run(tok):
    limits = dataclasses.replace(LIMITS, max_turns=3)
    (r,), _, pool = _run(tok, [Message("assistant", "Again.", [READ])], limits=limits)
    assert r.truncated and r.truncation == "turns" and r.n_turns == 3
    assert sum(len(c) for c in pool.calls[r.episode_id]) == 2 == r.n_tool_calls
    assert r.reward == 1.0 and pool.finished[r.episode_id] is True  # truncated episodes are still graded


def test_token_limit_truncates_before_the_stream_outgrows_it(tok):
    limits = dataclasses.replace(LIMITS, max_episode_tokens=300)
    pool = FakePool(result_text=lambda call: "     1|def mean(a, b):\n" * 20)
    (r,), _, _ = _run(tok, [Message("assistant", "Again.", [READ])], pool=pool, limits=limits)
    assert r.truncated and r.truncation == "tokens" and len(r.ids) <= 300
    assert r.n_turns < limits.max_turns and r.ids[-1] == tok.im_end_id


def test_wall_time_limit_truncates(tok):
    clock = types.SimpleNamespace(t=0.0)

    class SlowEngine(ScriptedEngine):
        def step(self):
            clock.t += 10.0  # every engine call takes 10 s of the episode's clock
            return super().step()

    limits = dataclasses.replace(LIMITS, episode_timeout_s=25.0, max_turns=50)
    engine = SlowEngine(_turns_script([Message("assistant", "Again.", [READ])], tok), steps_per_call=64)
    (r,) = run_episodes(
        [_task(0)], engine, FakePool(), tokenizer=tok, group_size=1, limits=limits, prompt_fn=_prompt,
        clock=lambda: clock.t,
    )  # fmt: skip
    assert r.truncated and r.truncation == "time" and r.n_turns == 3 and r.reward == 1.0


def test_turn_cut_by_the_turn_token_limit_is_closed_and_counted(tok):
    limits = dataclasses.replace(LIMITS, max_turn_tokens=4)
    (r,), _, _ = _run(
        tok, [Message("assistant", "This answer is much longer than four tokens.")], limits=limits
    )
    assert r.n_cut_turns == 1 and r.n_turns == 1 and not r.truncated
    # 4 generated tokens with loss, then the appended <|im_end|> without loss or log-prob.
    assert r.loss_mask[-5:] == [1, 1, 1, 1, 0] and r.ids[-1] == tok.im_end_id and r.logprobs[-1] == 0.0


def test_cut_tool_call_is_an_error_result_and_the_episode_goes_on(tok):
    limits = dataclasses.replace(LIMITS, max_turn_tokens=12)
    turns = [Message("assistant", "Reading.", [READ]), Message("assistant", "Done.")]
    (r,), _, pool = _run(tok, turns, limits=limits)
    (calls,) = pool.calls[r.episode_id]
    assert isinstance(calls[0], CallError) and "unclosed" in calls[0].message
    assert (
        r.n_cut_turns == 1 and r.n_tool_errors == 1 and r.n_turns == 2 and r.messages[-1].content == "Done."
    )


def test_malformed_call_gets_an_error_result_and_the_episode_goes_on(tok):
    bad = tok.encode(
        'Reading.\n<tool_call>\n{"name": "read_file", "arguments": [1]}\n</tool_call>' + chat.IM_END
    )
    done = turn_ids(Message("assistant", "Done."), tok)
    engine = ScriptedEngine(lambda rid, p: bad if rid.endswith("@0") else done)
    pool = FakePool()
    (r,) = run_episodes(
        [_task(0)], engine, pool, tokenizer=tok, group_size=1, limits=LIMITS, prompt_fn=_prompt
    )
    assert r.n_tool_errors == 1 and r.n_turns == 2 and r.reward == 1.0
    assert r.messages[3].role == "tool" and "not a JSON object" in r.messages[3].content
    # The turn whose call failed is located in the stream: exactly its generated tokens.
    ((start, end),) = r.error_spans
    assert r.ids[start:end] == bad and all(r.loss_mask[start:end]) and not r.loss_mask[start - 1]
    # The malformed turn is shown as generated (it has no structured form), and still renders exactly.
    assert tok.decode(r.ids) + "\n" == chat.render_text(r.messages)


def test_a_turn_whose_search_found_nothing_is_located_in_the_stream(tok):
    class EmptyGreps(FakePool):
        def submit_calls(self, episode_id, calls):
            super().submit_calls(episode_id, calls)
            results = self.events[-1].payload["results"]
            self.events[-1].payload["results"] = [
                Result("No matches found", found_nothing=True) if c.name == "grep" else res
                for c, res in zip(calls, results, strict=True)
            ]

    (r,), _, _ = _run(tok, SOLVE, pool=EmptyGreps())
    # SOLVE's first turn reads and greps in parallel: one empty search, no error.
    ((start, end),) = r.empty_spans
    assert r.error_spans == [] and r.n_tool_errors == 0
    assert r.ids[start:end] == turn_ids(SOLVE[0], tok)
    assert all(r.loss_mask[start:end]) and not r.loss_mask[start - 1]


def _drivers_common(tok, n_tasks: int = 3) -> dict:
    """The arguments both drivers take: tasks, a fresh engine and pool, the episode settings."""
    return dict(
        tasks=[_task(i) for i in range(n_tasks)],
        engine=ScriptedEngine(_turns_script(SOLVE, tok), slots=2),
        pool=FakePool(),
        tokenizer=tok,
        group_size=2,
        limits=LIMITS,
        prompt_fn=_prompt,
    )


def test_groups_come_out_whole_and_both_drivers_agree(tok):
    groups = list(iter_groups(**_drivers_common(tok), max_active=3))
    assert sorted(g[0].group for g in groups) == [0, 1, 2]
    assert all([r.member for r in g] == [0, 1] and len({r.group for r in g}) == 1 for g in groups)
    sync = run_episodes_sync(**_drivers_common(tok), batch_size=4)
    flat = sorted((r for g in groups for r in g), key=lambda r: (r.group, r.member))
    assert [(r.task_id, r.ids, r.reward) for r in flat] == [(r.task_id, r.ids, r.reward) for r in sync]


class _LatePool(FakePool):
    """FakePool whose tool results and grades for member 0 of a group come 50 polls late, longer than a turn
    takes to generate; logs what the driver does (into `log`, shared with the engine) and the grades it
    receives."""

    def __init__(self, log: list):
        super().__init__()
        self.log, self.late = log, []

    def start_episode(self, episode_id, task_dir):
        self.log.append(("start", episode_id))
        super().start_episode(episode_id, task_dir)

    def submit_calls(self, episode_id, calls):
        super().submit_calls(episode_id, calls)
        self._hold(episode_id)

    def finish_episode(self, episode_id, *, grade):
        super().finish_episode(episode_id, grade=grade)
        self._hold(episode_id)

    def _hold(self, episode_id):
        if "/0#" in episode_id:
            self.late.append([50, self.events.pop()])

    def poll(self, timeout):
        for held in self.late:
            held[0] -= 1
        self.events += [ev for n, ev in self.late if n == 0]
        self.late = [held for held in self.late if held[0] > 0]
        events = super().poll(timeout)
        self.log += [("graded", ev.episode_id) for ev in events if ev.kind == "graded"]
        return events


@pytest.mark.parametrize("lockstep", [True, False])
def test_lockstep_turns_wait_for_the_whole_batch(tok, lockstep):
    """In lockstep (run_episodes_sync) a batch's turn k+1 goes to the engine only after every member's turn k
    is back from the tools, and a batch starts only once the one before it is graded; without it, member 1
    runs ahead of its slow partner."""
    log: list = []
    engine = ScriptedEngine(_turns_script(SOLVE, tok), slots=2)
    engine.add = lambda rid, ids, n, add=engine.add: (log.append(("turn", rid)), add(rid, ids, n))[1]
    common = {**_drivers_common(tok, n_tasks=2), "engine": engine, "pool": _LatePool(log)}
    results = list(iter_groups(**common, max_active=2, lockstep=lockstep))
    assert all(r.reward == 1.0 for g in results for r in g)
    for task in ("task-0/", "task-1/"):
        turns = [int(rid.rsplit("@", 1)[1]) for kind, rid in log if kind == "turn" and rid.startswith(task)]
        assert len(turns) == 6 and (turns == sorted(turns)) == lockstep, turns
    first_start_1 = log.index(("start", "task-1/1/0#0"))
    last_grade_0 = max(
        i for i, (kind, eid) in enumerate(log) if kind == "graded" and eid.startswith("task-0/")
    )
    assert (first_start_1 > last_grade_0) == lockstep


def test_restart_after_worker_death_is_counted_and_never_scored_zero(tok):
    pool = FakePool(on_calls=lambda eid, n: "restart" if eid.endswith("#0") and n == 2 else None)
    (r,), _, _ = _run(tok, SOLVE, pool=pool)
    assert r.restarts == 1 and r.episode_id.endswith("#1") and r.reward == 1.0
    assert pool.started == ["task-0/0/0#0", "task-0/0/0#1"]
    assert r.n_turns == 3 and tok.decode(r.ids) + "\n" == chat.render_text(r.messages)  # a fresh stream


def test_episode_that_keeps_failing_gives_up_without_a_reward(tok):
    pool = FakePool(on_start=lambda eid: "error")
    (r,), _, _ = _run(tok, SOLVE, pool=pool, max_restarts=2)
    assert r.reward is None and r.restarts == 3 and "gave up" in r.error
    assert len(pool.started) == 3


@pytest.mark.parametrize(
    "turns, expected",
    [
        ([["grep"], ["read_file", "read_file"], ["search_replace"]], True),
        ([["run_terminal_cmd"], ["read_file", "search_replace"]], False),  # same turn: parallel, not before
        ([["write"], ["read_file"]], False),
        ([["read_file"], ["run_terminal_cmd"]], None),  # no edit at all
    ],
)
def test_first_edit_after_read(turns, expected):
    assert first_edit_after_read(turns) is expected


def test_a_checkpoint_template_drives_the_stream(tok):
    """With Qwen3's own chat template the episode opens with the template's prompt, each turn is what the
    template writes for it (an empty think block, then text and calls), results follow in its layout, and
    the stream is what `render` gives for the conversation: what SFT trains on is what RL samples."""
    from pathlib import Path

    from env.chat_format import TemplateFormat

    template = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates" / "qwen3.jinja"
    qwen = tk.Tokenizer(tok.backend, TemplateFormat.load(template.read_text()))
    (r,), engine, _ = _run(qwen, SOLVE)
    assert r.n_turns == 3 and r.n_tool_calls == 3 and not r.truncated and r.reward == 1.0
    assert r.messages[2].tool_calls == [READ, GREP]
    ids, mask = tk.render(r.messages, qwen)
    assert r.ids == list(ids[: len(r.ids)]) and r.loss_mask == list(mask[: len(r.ids)])
    first = next(iter(engine.prompts.values()))
    assert qwen.decode(first) == qwen.chat_format.prompt_text(r.messages[:2])
    generated = [qwen.decode(r.ids[a:b]) for a, b in _spans(r.loss_mask)]
    assert generated == [qwen.chat_format.assistant_text(m) for m in SOLVE]
    assert all(g.startswith("<think>\n\n</think>\n\n") for g in generated)
    assert "<|im_start|>user\n<tool_response>\n" in qwen.decode(r.ids)


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
