"""The modes of launch.py: one function each, dispatched by name."""

import os
from collections.abc import Callable
from pathlib import Path

import ml_collections
from absl import logging

MODE_HELP = (
    "train: the whole pipeline (tasks, tokenizer, SFT, eval, RL, eval, summary)",
    "info: build the model and print its parameter counts",
    "data: generate the task suite and tokenizer only",
    "sft: the supervised warm start only",
    "rl: the RL phase only",
    "eval: evaluate the latest checkpoint on held-out tasks (on any suite with --config.eval.tasks=DIR)",
    "plan: per-device memory of the run on config.plan.device, without weights or an accelerator",
)
MODES = tuple(h.split(":")[0] for h in MODE_HELP)


def info(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Builds the model (shapes only, no memory for weights) and prints its parameter counts."""
    del workdir
    from composer import model

    cfg = model.ModelConfig.from_config(config)
    total, active = model.param_counts(cfg)
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_experts} experts top-{cfg.top_k}")
    print(f"parameters: total {total:,}  active per token {active:,}")


def plan(config: ml_collections.ConfigDict) -> None:
    """Prints the memory plan (composer/memory_plan.py): a table, then one JSON line."""
    from composer import memory_plan

    print(memory_plan.report(memory_plan.plan(config), config.model.param_dtype), flush=True)


def _pipeline(only: str | None) -> Callable[[ml_collections.ConfigDict, Path], None]:
    def mode(config: ml_collections.ConfigDict, workdir: Path) -> None:
        if only == "eval" and config.eval.endpoint:
            # Any served model (an OpenAI-compatible endpoint) on a suite, graded as the suite EVAL grades.
            from composer.pipeline import endpoint_eval

            if not config.eval.tasks:
                raise ValueError("eval.endpoint needs eval.tasks: the suite directory to evaluate on")
            endpoint_eval.run(config, workdir)
            return
        if only == "eval" and config.eval.tasks:
            # Any suite: the latest checkpoint, init_from or the random init; pass@k; a JSON line last.
            from composer.pipeline import eval_suite

            eval_suite.run(config, workdir)
            return
        if only == "eval" and config.model.init_from:
            # A pretrained checkpoint as it is: no DATA / SFT phases needed.
            from composer.checkpoints.evaluate_pretrained import run_eval

            run_eval(config, workdir)
            return
        from composer.pipeline import phases

        phases.run_pipeline(config, workdir, only)

    return mode


_MODES: dict[str, Callable[[ml_collections.ConfigDict, Path], None]] = {
    "train": _pipeline(None),
    "info": info,
    "data": _pipeline("data"),
    "sft": _pipeline("sft"),
    "rl": _pipeline("rl"),
    "eval": _pipeline("eval"),
}


def compilation_cache(config: ml_collections.ConfigDict) -> str | None:
    """Turns on JAX's persistent compilation cache (before anything compiles) and returns its directory:
    JAX_COMPILATION_CACHE_DIR when set, else config.compilation_cache_dir; None when both are empty (off).

    Every program is cached, however fast it compiled: JAX's default keeps only those over a second, and
    the sampler's and learner's many small programs are most of a small run's start-up. The cache holds at
    most config.compilation_cache_max_gib, least recently used out first; with a limit JAX also reads and
    writes its entries under a file lock, so that runs sharing the directory never read a half-written
    one."""
    import jax

    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or config.compilation_cache_dir
    if not path:
        return None
    path = str(Path(path).expanduser())
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", int(config.compilation_cache_max_gib * 2**30))
    return path


def main(config: ml_collections.ConfigDict, workdir: str, mode: str) -> None:
    """Runs `mode` with `config`, writing into `workdir` (none for 'plan')."""
    if mode == "plan":
        plan(config)
        return
    from composer.checkpoints.hf_tokenizer import check_chat_template
    from composer.pipeline.data import task_families
    from env.tools import offered_tools

    # Values that would otherwise fail minutes in, or only once a task suite is generated.
    offered_tools(config.env.tools)
    task_families(config)
    check_chat_template(config.model.chat_template)
    for key in ("env.tasks", "eval.tasks"):
        section, name = key.split(".")
        where = config[section][name]
        if where and not Path(where).expanduser().is_dir():
            raise ValueError(f"{key}: {where} is not a directory (a suite: a directory of task directories)")
    if config.env.search_model:
        from env.tools.search_encoder import missing_files

        if missing := missing_files(config.env.search_model):
            raise ValueError(
                f"env.search_model: {config.env.search_model} is not a search model directory (no "
                f"{', '.join(missing)}; python -m composer.search_model train --out DIR writes one)"
            )
    if mode == "eval":
        from composer.pipeline import eval_suite

        eval_suite.check(config)
    # Absolute, so that no phase depends on the directory a subprocess or sandbox starts in.
    path = Path(workdir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    logging.info("mode %s, workdir %s, compilation cache %s", mode, path, compilation_cache(config))
    _MODES[mode](config, path)
