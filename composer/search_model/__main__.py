"""python -m composer.search_model train --out DIR [--config=experiments/search_model.py[:tiny]]
                                        [--config.steps=600 ...]

Trains the code-search encoder and writes the model directory that codebase_search loads
(`env.search_model=DIR` in a run config, `python -m env.tools call --search-model DIR ...`).
"""

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from composer import xla_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "search_model.py")
_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Config file[:variant].", lock_config=True
)
_OUT = flags.DEFINE_string("out", None, "The model directory to write.")
flags.mark_flag_as_required("out")


def main(argv: list[str]) -> None:
    if argv[1:] != ["train"]:
        raise app.UsageError("usage: python -m composer.search_model train --out DIR")
    from composer.search_model import train

    logging.set_verbosity(logging.INFO)
    summary = train.train(_CONFIG.value, _OUT.value)
    summary.pop("history")
    print(json.dumps(summary))


if __name__ == "__main__":
    xla_flags.apply()
    sys.exit(app.run(main))
