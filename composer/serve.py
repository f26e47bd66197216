"""Serve a model over an OpenAI-compatible HTTP API.

    python -m composer.serve --config=experiments/composer.py --workdir=RUN [--port=8000]
    python -m composer.serve --config=experiments/composer.py:gpu --config.model.init_from=HF_DIR

The model is the run's latest checkpoint in --workdir (RL's, else SFT's), else config.model.init_from, else
the random init over the run's tokenizer (a workdir whose DATA phase ran). The API, its endpoints and
fields: composer/serving/openai_api.py. Point any OpenAI client at http://HOST:PORT/v1.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from composer import xla_flags
from composer.serving import load

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file[:variant].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "A run's directory: its latest checkpoint and tokenizer.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_NAME = flags.DEFINE_string("served_model_name", "composer", "The model's name in the API.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import uvicorn

    if _CONFIG.value is None:
        sys.exit("FATAL: --config is required, e.g. --config=experiments/composer.py")
    try:
        api, engine = load.build(_CONFIG.value, _WORKDIR.value, _NAME.value)
    except ValueError as e:
        sys.exit(f"FATAL: {e}")
    try:
        uvicorn.run(api, host=_HOST.value, port=_PORT.value, log_level="info")
    finally:
        engine.close()


if __name__ == "__main__":
    xla_flags.apply()
    app.run(main)
