"""The sandbox isolation of a run: resolved once at start-up, recorded in the workdir, the same on resume.

Commands see the workspace at /workspace under bwrap and unshare, but at its host path under 'none', and
the levels differ in what else a command can see; trajectories recorded at one level and episodes run at
another can differ in the very tokens a model copies (an SFT model trained on host paths and evaluated on
/workspace solved 0 of 200 held-out tasks). A run therefore keeps the level its DATA phase recorded
(workdir/isolation.json), and a rerun under another level stops with an error that names both.
"""

import json
from pathlib import Path

import ml_collections
from absl import logging

from env import sandbox

RECORD = "isolation.json"


class IsolationMismatch(RuntimeError):
    """A workdir's recorded isolation level differs from the one this run resolved."""


def settle(config: ml_collections.ConfigDict, workdir: Path) -> str:
    """Resolves env.isolation (env.sandbox.resolve_isolation: 'auto' fails closed without bubblewrap, a
    forced weaker level warns), checks it against workdir/isolation.json (written here when absent) and
    sets config.env.isolation to the resolved level, so that every sandbox of the run uses it without
    probing again. Returns the level."""
    requested = config.env.isolation
    level = sandbox.resolve_isolation(requested)
    path = workdir / RECORD
    if path.exists():
        recorded = json.loads(path.read_text())["level"]
        if recorded != level:
            raise IsolationMismatch(
                f"{workdir} was recorded under sandbox isolation {recorded!r}, but this run resolved "
                f"{level!r} (--config.env.isolation={requested}): tool results differ between levels, so a "
                f"model trained at one is not comparable at the other. Rerun with "
                f"--config.env.isolation={recorded}, or start a new --workdir."
            )
    else:
        path.write_text(json.dumps({"level": level, "requested": requested}) + "\n")
    logging.info("sandbox isolation: %s (env.isolation=%s, recorded in %s)", level, requested, path)
    config.env.isolation = level
    return level
