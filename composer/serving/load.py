"""The served model: a run's latest checkpoint (or config.model.init_from), its engine and its API app."""

from pathlib import Path

from absl import logging


def build(config, workdir: str | None, model_name: str):
    """The FastAPI app and its engine for the model of `workdir`: the run's latest checkpoint (RL's, else
    SFT's), else config.model.init_from, else the random init over the run's tokenizer."""
    from composer.pipeline import eval_suite
    from composer.serving.engine import Engine
    from composer.serving.openai_api import make_app

    path = Path(workdir).resolve() if workdir else None
    if not config.model.init_from and (path is None or not (path / "tokenizer.json").exists()):
        raise ValueError(
            "serve needs --workdir of a run (with its tokenizer.json) or --config.model.init_from"
        )
    scratch = path or Path(".")
    params, cfg, tokenizer, name = eval_suite.load_model(config, path or Path("/nonexistent"), [], scratch)
    logging.info("serve: the model is %s", name)
    engine = Engine(params, cfg, tokenizer, config)
    return make_app(engine, model_name), engine
