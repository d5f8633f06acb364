"""Serving sets the interpreter's switch interval from ``serve.switch_interval_ms``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from streamrag.config import ServeSettings, load_settings
from streamrag.errors import ConfigError
from streamrag.runtime.service import Service
from streamrag.serve.server import serve_forever, tune_interpreter


@pytest.fixture
def restore_interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_default_is_shorter_than_pythons(restore_interval: None) -> None:
    sys.setswitchinterval(0.005)
    tune_interpreter(ServeSettings())
    assert sys.getswitchinterval() == pytest.approx(0.001)


def test_setting_is_applied(restore_interval: None) -> None:
    settings = load_settings(overrides={"serve.switch_interval_ms": 2.5}, environ={})
    tune_interpreter(settings.serve)
    assert sys.getswitchinterval() == pytest.approx(0.0025)


def test_zero_is_refused() -> None:
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        load_settings(overrides={"serve.switch_interval_ms": 0}, environ={})


def test_serve_forever_serves_with_the_interval(
    restore_interval: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server process runs with the setting, not Python's default (uvicorn not started)."""
    seen: list[float] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: seen.append(sys.getswitchinterval()))
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "serve.switch_interval_ms": 3,
        },
        environ={},
    )
    sys.setswitchinterval(0.005)
    serve_forever(Service(settings), host="127.0.0.1", port=0)
    assert seen == [pytest.approx(0.003)]
