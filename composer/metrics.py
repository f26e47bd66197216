"""Metrics: scalars to metrics.jsonl and TensorBoard event files, and PNG plots of the curves that matter.

Every record is one JSON line {"phase", "step", "time", <name>: <value>, ...}, so a run can be plotted with
nothing but the standard library, and `tensorboard --logdir <workdir>/tb` shows the same numbers.
"""

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def _scalar(value: object) -> float | None:
    try:
        x = float(np.asarray(value))
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


class MetricsWriter:
    """Appends scalar metrics of named phases ('sft', 'rl', 'eval', ...) to the workdir."""

    def __init__(self, workdir: Path, *, tensorboard: bool = True) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.workdir / "tb"), flush_secs=10)

    def write(self, phase: str, step: int, metrics: Mapping[str, object]) -> dict:
        """Writes the finite scalars of `metrics` at `step`; returns the record written."""
        record: dict = {"phase": phase, "step": int(step), "time": round(time.time(), 3)}
        for name, value in metrics.items():
            x = _scalar(value)
            if x is not None:
                record[name] = x
                if self._tb is not None:
                    self._tb.add_scalar(f"{phase}/{name}", x, int(step))
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: Path, phase: str | None = None) -> list[dict]:
    """The records of metrics.jsonl (of one phase if given), in write order; a torn last line is skipped."""
    path = Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if phase is None or record.get("phase") == phase:
            records.append(record)
    return records


def plot_curves(workdir: Path, curves: Mapping[str, tuple[str, str]], filename: str) -> Path | None:
    """Plots each curve {title: (phase, metric)} against step into one PNG; None if there is no data.

    A resumed run writes some steps twice; the last value of a step wins.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for title, (phase, name) in curves.items():
        points = {r["step"]: r[name] for r in read_metrics(workdir, phase) if name in r}
        if points:
            series[title] = sorted(points.items())
    if not series:
        return None
    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.5), squeeze=False)
    for ax, (title, points) in zip(axes[0], series.items()):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o" if len(points) < 30 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(workdir) / filename
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
