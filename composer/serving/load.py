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


class LocalServer:
    """`app` served by uvicorn on a free local port, in a thread of this process: `url` is its /v1 base."""

    def __init__(self, app) -> None:
        import socket
        import threading
        import time

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
