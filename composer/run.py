"""The modes of launch.py: one function each, dispatched by name."""

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
    "eval: evaluate the latest checkpoint on held-out tasks",
)
MODES = tuple(h.split(":")[0] for h in MODE_HELP)


class ModeNotAvailable(SystemExit):
    """Raised for a mode whose implementation has not landed yet."""


def _not_available(name: str) -> Callable[[ml_collections.ConfigDict, Path], None]:
    def mode(config: ml_collections.ConfigDict, workdir: Path) -> None:
        del config, workdir
        raise ModeNotAvailable(f"--mode={name} is not available yet: the end-to-end pipeline has not landed.")

    return mode


def info(config: ml_collections.ConfigDict, workdir: Path) -> None:
    """Builds the model (shapes only, no memory for weights) and prints its parameter counts."""
    del workdir
    from composer import model

    cfg = model.ModelConfig.from_config(config)
    total, active = model.param_counts(cfg)
    print(f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_experts} experts top-{cfg.top_k}")
    print(f"parameters: total {total:,}  active per token {active:,}")


_MODES: dict[str, Callable[[ml_collections.ConfigDict, Path], None]] = {
    "train": _not_available("train"),
    "info": info,
    "data": _not_available("data"),
    "sft": _not_available("sft"),
    "rl": _not_available("rl"),
    "eval": _not_available("eval"),
}


def main(config: ml_collections.ConfigDict, workdir: str, mode: str) -> None:
    """Runs `mode` with `config`, writing into `workdir`."""
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    logging.info("mode %s, workdir %s", mode, path)
    _MODES[mode](config, path)
