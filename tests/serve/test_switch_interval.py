"""Serving sets the interpreter's switch interval from ``serve.switch_interval_ms``."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from streamrag.config import ServeSettings, load_settings
from streamrag.errors import ConfigError
from streamrag.serve.server import tune_interpreter


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
