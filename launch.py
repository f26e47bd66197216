"""composer's entry point.

    python launch.py --config=experiments/composer.py[:tiny|:gpu] [--workdir=DIR] [--mode=MODE]
                     [--config.rl.learning_rate=3e-6 ...]

The config dict is locked: an override of a key that does not exist fails here, naming the key, before any
work starts. Everything else lives in the package (composer/run.py).
"""

import sys
import time

from absl import app, flags
from ml_collections import config_flags

from composer import distributed, run, xla_flags
from composer.pipeline.isolation import IsolationMismatch
from env.sandbox import IsolationUnavailable
from env.tasks.environments import EnvironmentMissing

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file[:variant].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default runs/<experiment>-<timestamp>).")
_MODE = flags.DEFINE_enum("mode", "train", run.MODES, "What to run: " + "; ".join(run.MODE_HELP))
# Multi-host (composer/distributed.py): unset here and in JAX_COORDINATOR_ADDRESS etc. = one process.
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.mark_flag_as_required("config")


def _parse(argv: list[str]) -> list[str]:
    """Parses flags; an override of a config key that does not exist is a usage error naming the key."""
    try:
        return flags.FLAGS(argv)
    except (AttributeError, KeyError) as e:
        keys = [a.split("=")[0].removeprefix("--config.") for a in argv if a.startswith("--config.")]
        bad = [k for k in keys if repr(k.split(".")[-1]) in str(e)] or keys
        sys.exit(f"FATAL: unknown config key: {', '.join(bad)} ({e})")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if _MODE.value == "plan":
        from composer import memory_plan

        memory_plan.use_cpu_devices(memory_plan.mesh_devices(config.mesh))  # before JAX starts a backend
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    workdir = _WORKDIR.value or f"runs/{config.experiment}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        run.main(config, workdir, _MODE.value)
    except (IsolationUnavailable, IsolationMismatch, EnvironmentMissing) as e:
        sys.exit(f"FATAL: {e}")  # what to install, build or pass: no traceback to read through


if __name__ == "__main__":
    xla_flags.apply()  # before anything starts JAX's backend
    app.run(main, flags_parser=_parse)
