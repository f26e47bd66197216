"""Rollouts with the model: a sampler engine and a tool pool running episodes, and their statistics."""

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence

import jax
import ml_collections
from absl import logging
from tqdm import tqdm

from composer import copy_head
from composer.sampler import Sampler
from composer.sampler_device import cache_bytes_per_slot
from env import chat
from env.rollout import RolloutLimits, iter_groups
from env.rollout.driver import INSTRUCTIONS
from env.rollout.pool import RolloutPool, make_pool
from env.tools import EDIT_TOOLS, offered_tools, tool_schemas


class VersionedEngine:
    """The sampler, remembering the oldest policy version that generated a turn of each episode.

    Request ids are '{episode_id}@{turn}' (env/rollout/driver.py), so the episode is the part before '@'.
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.oldest: dict[str, int] = {}

    def add(self, request_id: str, prompt_ids, max_new_tokens: int) -> None:
        episode = request_id.rsplit("@", 1)[0]
        self.oldest.setdefault(episode, self.sampler.version)
        self.sampler.add(request_id, prompt_ids, max_new_tokens)

    def step(self):
        return self.sampler.step()

    def pending(self) -> int:
        return self.sampler.pending()


def compact_schema(schema: dict) -> dict:
    """A tool schema reduced to its name, argument types and required arguments (no descriptions)."""
    fn = schema["function"]
    params = fn["parameters"]
    args = {k: v.get("type", "string") for k, v in params.get("properties", {}).items()}
    return {"name": fn["name"], "parameters": args, "required": params.get("required", [])}


def system_prompt(config: ml_collections.ConfigDict) -> chat.Message:
    """The system turn of every episode (and of the SFT trajectories), per env.tools and env.tool_schemas."""
    schemas = tool_schemas(offered_tools(config.env.tools))
    if config.env.tool_schemas == "compact":
        schemas = [compact_schema(s) for s in schemas]
    elif config.env.tool_schemas != "full":
        raise ValueError(f"env.tool_schemas must be 'full' or 'compact', got {config.env.tool_schemas!r}")
    return chat.system_message(schemas, INSTRUCTIONS)


def prompt_fn(
    config: ml_collections.ConfigDict, starts: Mapping[str, list[chat.Message]] | None = None
) -> Callable[[object], list[chat.Message]]:
    """The opening messages of an episode on a task: the system turn, then the bug report; or, for a task
    whose instance id is in `starts`, those messages (a conversation to continue)."""
    system = system_prompt(config)
    starts = starts or {}

    def fn(task) -> list[chat.Message]:
        if task.instance_id in starts:
            return list(starts[task.instance_id])
        return [system, chat.Message("user", task.problem_statement)]

    return fn


def before_first_edit(messages: Sequence[chat.Message]) -> list[chat.Message] | None:
    """The messages before the first assistant turn that calls an editing tool (None if none does). The
    turns before it only read, so the conversation holds for the task's unchanged workspace."""
    for i, m in enumerate(messages):
        if m.role == "assistant" and any(c.name in EDIT_TOOLS for c in m.tool_calls):
            return list(messages[:i])
    return None


def make_sampler(
    config: ml_collections.ConfigDict,
    params,
    cfg,
    eos_id: int,
    *,
    line_tokens: copy_head.LineTokens | None,
    temperature: float,
    key: jax.Array,
) -> Sampler:
    """The sampler of `config.sampling` over `params`; line_tokens: the copy head's
    (composer/pipeline/learner.line_tokens), None for a model without line keys."""
    return Sampler(
        params,
        cfg,
        slots=decode_slots(config, cfg),
        max_len=max_len(config),
        steps_per_call=config.sampling.steps_per_call,
        temperature=temperature,
        top_p=config.sampling.top_p,
        eos_id=eos_id,
        key=key,
        max_rows=config.sampling.max_prefill_rows,
        line_tokens=line_tokens,
    )


def max_len(config: ml_collections.ConfigDict) -> int:
    """The tokens a decode slot holds: an episode's and one more turn's."""
    return config.env.max_episode_tokens + config.sampling.max_turn_tokens


def decode_slots(config: ml_collections.ConfigDict, cfg) -> int:
    """sampling.decode_slots, or fewer where sampling.kv_cache_gib (> 0) holds fewer: turns beyond the
    slots wait in the sampler's queue for a free one."""
    slots, budget = config.sampling.decode_slots, config.sampling.kv_cache_gib
    if budget <= 0:
        return slots
    per_slot = cache_bytes_per_slot(cfg, max_len(config))
    fit = int(budget * 2**30 // per_slot)
    if fit < 1:
        raise ValueError(
            f"sampling.kv_cache_gib={budget} holds no decode slot: one slot of {max_len(config)} tokens "
            f"takes {per_slot / 2**30:.2f} GiB"
        )
    if fit < slots:
        logging.info(
            "sampler: %d of sampling.decode_slots=%d fit sampling.kv_cache_gib=%s", fit, slots, budget
        )
    return min(slots, fit)


@contextlib.contextmanager
def pool(config: ml_collections.ConfigDict) -> Iterator[RolloutPool]:
    """The pool of env.rollout_backend ('local' processes or 'ray'), closed on exit."""
    with make_pool(config) as p:
        yield p


def max_active(config: ml_collections.ConfigDict) -> int:
    """Episodes alive at once (sampling.max_active; 0 means one per decode slot)."""
    return config.sampling.max_active or config.sampling.decode_slots


def limits(config: ml_collections.ConfigDict, *, grading: bool = False) -> RolloutLimits:
    """The episode limits. With `grading` (EVAL, which scores a policy and does not train), the
    wall-clock limit is eval.episode_timeout_s: there it is only a safety cap, so that machine load, which
    slows every episode, does not turn into failed tasks and a model is scored on what it does."""
    out = RolloutLimits.from_config(config)
    if grading:
        out = dataclasses.replace(out, episode_timeout_s=config.eval.episode_timeout_s)
    return out


def one_episode_each(
    config: ml_collections.ConfigDict, sampler: Sampler, tokenizer, tasks: list, *, desc: str,
    postfix: Callable[[list], dict] | None = None, samples: int = 1,
) -> list:  # fmt: skip
    """One graded episode (or `samples` of them) of `sampler`'s policy on each task (EpisodeResult list, in
    finishing order), from its bug report, under the grading limits (`limits(config, grading=True)`):
    EVAL's loop. `postfix(results so far)` is shown on the progress bar."""
    results = []
    with pool(config) as p, tqdm(total=len(tasks) * samples, desc=desc, unit="episode") as bar:
        groups = iter_groups(
            tasks, sampler, p, tokenizer=tokenizer, group_size=samples, limits=limits(config, grading=True),
            max_active=max_active(config), prompt_fn=prompt_fn(config),
        )  # fmt: skip
        for group in groups:
            results.extend(group)
            bar.update(len(group))
            if postfix is not None:
                bar.set_postfix(postfix(results))
    return results


TRUNCATIONS = ("turns", "tokens", "time")  # the limits that can cut an episode (env/rollout/episode.py)


def episode_stats(results: list) -> dict[str, float]:
    """Held-out style statistics of finished episodes (EpisodeResult list). `searched_before_edit_share`
    is over the episodes that made an edit call (`edited_share` of them)."""
    graded = [r for r in results if r.reward is not None]
    turns = sum(r.n_turns for r in results)
    calls = sum(r.n_tool_calls for r in results)
    edited = [r for r in results if r.searched_before_edit is not None]
    return {
        "episodes": len(results),
        "solve_rate": sum(r.reward for r in graded) / max(len(graded), 1),
        "mean_turns": turns / max(len(results), 1),
        "tool_calls_per_episode": calls / max(len(results), 1),
        "tool_error_rate": sum(r.n_tool_errors for r in results) / max(calls, 1),
        "parallel_turn_share": sum(r.n_parallel_turns for r in results) / max(turns, 1),
        "edited_share": len(edited) / max(len(results), 1),
        "searched_before_edit_share": sum(bool(r.searched_before_edit) for r in edited) / max(len(edited), 1),
        "truncated_share": sum(r.truncated for r in results) / max(len(results), 1),
        # A dense companion of solve_rate: how close the episodes' edits came to the gold patches.
        "patch_similarity": statistics.fmean(r.components.get("patch_similarity", 0.0) for r in graded)
        if graded
        else 0.0,
        **{
            f"truncated_{limit}_share": sum(r.truncation == limit for r in results) / max(len(results), 1)
            for limit in TRUNCATIONS
        },
        "restarts": sum(r.restarts for r in results),
        "errors": sum(r.error is not None for r in results),
        "mean_tokens": statistics.fmean(len(r.ids) for r in results) if results else 0.0,
    }
