"""The run's sandbox isolation: resolved once, recorded in the workdir, the same on every rerun."""

import json

import pytest

from composer.pipeline import isolation
from env import sandbox
from experiments import composer as composer_config


def _resolving(monkeypatch, level: str) -> list[str]:
    """env.sandbox.resolve_isolation answering `level`; returns the levels it was asked for."""
    asked = []

    def resolve(requested: str) -> str:
        asked.append(requested)
        return level

    monkeypatch.setattr(sandbox, "resolve_isolation", resolve, raising=False)
    return asked


def test_the_resolved_level_is_recorded_and_used_by_the_run(monkeypatch, tmp_path):
    asked = _resolving(monkeypatch, "bwrap")
    config = composer_config.get_config("tiny")
    assert isolation.settle(config, tmp_path) == "bwrap"
    assert asked == ["auto"]
    assert json.loads((tmp_path / isolation.RECORD).read_text()) == {"level": "bwrap", "requested": "auto"}
    # Every sandbox of the run gets the resolved level (no second probe, no other level).
    assert config.env.isolation == "bwrap"
    # A rerun at the same level continues.
    assert isolation.settle(composer_config.get_config("tiny"), tmp_path) == "bwrap"


def test_a_run_recorded_at_one_level_is_refused_at_another(monkeypatch, tmp_path):
    _resolving(monkeypatch, "bwrap")
    isolation.settle(composer_config.get_config("tiny"), tmp_path)
    _resolving(monkeypatch, "unshare")
    config = composer_config.get_config("tiny")
    config.env.isolation = "unshare"
    with pytest.raises(isolation.IsolationMismatch) as e:
        isolation.settle(config, tmp_path)
    message = str(e.value)
    assert "'bwrap'" in message and "'unshare'" in message and "--config.env.isolation=bwrap" in message
    # The record stays the first run's.
    assert json.loads((tmp_path / isolation.RECORD).read_text())["level"] == "bwrap"


def test_a_failed_resolution_records_nothing(monkeypatch, tmp_path):
    def resolve(requested: str) -> str:
        raise RuntimeError("bubblewrap does not work here: apt-get install -y bubblewrap")

    monkeypatch.setattr(sandbox, "resolve_isolation", resolve, raising=False)
    with pytest.raises(RuntimeError, match="apt-get install -y bubblewrap"):
        isolation.settle(composer_config.get_config("tiny"), tmp_path)
    assert not (tmp_path / isolation.RECORD).exists()
