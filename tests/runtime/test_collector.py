"""The garbage collector as ``streamrag run`` and ``serve`` set it (``ingest.gc_young``)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamrag.cli import app
from streamrag.config import IngestSettings
from streamrag.runtime.collector import tune_collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_young_threshold_is_set_and_what_is_held_is_frozen() -> None:
    gc.set_threshold(700, 10, 10)
    garbage = _Node()
    gone = weakref.ref(garbage)
    del garbage
    tune_collector(IngestSettings(gc_young=12_345))
    assert gc.get_threshold() == (12_345, 10, 10)
    assert gc.get_freeze_count() > 0
    assert gone() is None  # garbage is freed before the freeze, not kept forever


def test_zero_leaves_pythons_setting() -> None:
    gc.set_threshold(700, 10, 10)
    frozen = gc.get_freeze_count()
    tune_collector(IngestSettings(gc_young=0))
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == frozen


def test_run_once_runs_with_the_setting(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text('{"doc_id": "a", "event_time": "2024-01-01T00:00:00Z", "text": "hello"}\n')
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"source: {{path: {data}}}\nstate_dir: {tmp_path}/s\nembedder: {{class: hashing}}\n"
    )
    runner = CliRunner()
    gc.set_threshold(700, 10, 10)
    result = runner.invoke(app, ["run", "--once", str(cfg), "--set", "ingest.gc_young=0"])
    assert result.exit_code == 0, result.output
    assert gc.get_threshold()[0] == 700
    result = runner.invoke(app, ["run", "--once", str(cfg), "--set", "ingest.gc_young=4321"])
    assert result.exit_code == 0, result.output
    assert gc.get_threshold()[0] == 4321


def test_serve_runs_with_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``streamrag serve`` tunes the collector once its service has started (uvicorn not run)."""
    import streamrag.serve.server as server

    seen: list[int] = []

    def fake_serve(service: Any, **_: Any) -> None:
        seen.append(gc.get_threshold()[0])
        service.stop()

    monkeypatch.setattr(server, "serve_forever", fake_serve)
    gc.set_threshold(700, 10, 10)
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--port",
            "0",
            "--set",
            f"source.path={tmp_path / 'none.jsonl'}",
            "--set",
            f"state_dir={tmp_path / 's'}",
            "--set",
            "embedder.class=hashing",
            "--set",
            "ingest.gc_young=2345",
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen == [2345]
