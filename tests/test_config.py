from __future__ import annotations

from pathlib import Path

import pytest

from streamrag.config import WindowSettings, load_settings
from streamrag.errors import ConfigError


def test_defaults() -> None:
    s = load_settings(environ={})
    assert s.batcher.max_delay_ms == 20
    assert s.embedder.class_ == "minilm-onnx"
    assert s.dead_letter_path == Path(".streamrag/deadletter.jsonl")


def test_precedence_args_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "batcher:\n  max_delay_ms: 5\n  max_batch_size: 7\nserve:\n  port: 9000\n"
        "embedder:\n  class: hashing\n  args: {dim: 32}\n"
    )
    env = {"STREAMRAG_BATCHER__MAX_DELAY_MS": "50", "STREAMRAG_SERVE__PORT": "9100", "OTHER": "x"}
    s = load_settings(cfg, overrides={"serve.port": 9200}, environ=env)
    assert s.batcher.max_batch_size == 7  # file
    assert s.batcher.max_delay_ms == 50  # env beats file
    assert s.serve.port == 9200  # argument beats env
    assert s.embedder.class_ == "hashing"
    assert s.embedder.args == {"dim": 32}


def test_env_values_are_yaml() -> None:
    s = load_settings(environ={"STREAMRAG_EMBEDDER__ARGS": "{dim: 16}"})
    assert s.embedder.args == {"dim": 16}


def test_settings_are_frozen() -> None:
    s = load_settings(environ={})
    with pytest.raises(ValueError, match="frozen"):
        s.batcher.max_delay_ms = 1  # type: ignore[misc]


def test_bad_value_names_key_value_and_origin() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(environ={"STREAMRAG_SERVE__PORT": "http"})
    msg = str(err.value)
    assert "serve.port" in msg
    assert "'http'" in msg
    assert "STREAMRAG_SERVE__PORT" in msg


def test_out_of_range_value_from_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("batcher:\n  max_batch_size: 0\n")
    with pytest.raises(ConfigError, match=r"batcher.max_batch_size' = 0 \(from file .*c.yaml\)"):
        load_settings(cfg, environ={})


def test_unknown_key_suggests_the_right_one() -> None:
    with pytest.raises(ConfigError, match="did you mean 'max_delay_ms'"):
        load_settings(overrides={"batcher.max_delay": 3}, environ={})


def test_a_misspelt_section_names_the_file_it_came_from(tmp_path: Path) -> None:
    cfg = tmp_path / "streamrag.yaml"
    cfg.write_text("sorce:\n  path: x.jsonl\n")
    with pytest.raises(ConfigError, match=r"'sorce' \(from file .*streamrag.yaml\); did you mean"):
        load_settings(cfg, environ={})


def test_missing_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_settings(bad, environ={})


def _window(**fields: object) -> WindowSettings:
    s = load_settings(overrides={"event_time.windows": [{"name": "w", **fields}]}, environ={})
    return s.event_time.windows[0]


def test_window_triggers_and_the_global_window() -> None:
    w = _window(kind="global", trigger="count", trigger_count=100, purge=True)
    assert (w.kind, w.trigger, w.trigger_count, w.purge) == ("global", "count", 100, True)
    w = _window(size_ms=5, trigger="every_update")
    assert (w.trigger, w.trigger_count, w.purge) == ("every_update", None, False)
    assert _window(size_ms=5).trigger == "watermark"  # the default is unchanged


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"size_ms": 5, "trigger": "count"}, "trigger 'count' needs trigger_count"),
        ({"size_ms": 5, "trigger_count": 3}, "trigger_count applies to trigger: count"),
        ({"kind": "global"}, "a global window never closes by time"),
        ({"size_ms": 5, "trigger": "count", "trigger_count": 0}, "trigger_count"),
        ({"size_ms": 5, "trigger": "sometimes"}, "trigger"),
    ],
)
def test_window_trigger_settings_are_validated(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _window(**fields)


def test_a_bare_off_in_yaml_turns_embedding_ahead_off(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("embedder:\n  ahead: off\n", encoding="utf-8")  # YAML reads it as false
    assert load_settings(cfg, environ={}).embedder.ahead == "off"
    env = {"STREAMRAG_EMBEDDER__AHEAD": "on"}
    assert load_settings(environ=env).embedder.ahead == "process"
