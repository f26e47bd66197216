"""The debugging notebook runs top to bottom (executed with nbclient, as CI does)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_debug_notebook_executes(monkeypatch, tmp_path):
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # one CPU device, as a user's kernel
    cache = tmp_path / "jax-cache"  # the kernel inherits it: nothing written to the home directory
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(cache))
    nb = nbformat.read(ROOT / "notebooks" / "debug_small.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "reward: 1.0" in text  # the expert solved its task
    assert "held-out solve rate" in text  # the pipeline printed its summary
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert f"compilation cache: {cache}" in text
    assert any(cache.iterdir())  # the notebook's programs were cached, as launch.py's are
