"""The command line: every command documented with an example, and errors that say what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrag.cli import app

runner = CliRunner()
COMMANDS = ["demo", "run", "replay", "serve", "query", "ask", "status"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert f"streamrag {command}" in result.output


def test_top_level_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    for command in COMMANDS:
        assert re.search(rf"\b{command}\b", result.output)


def test_bad_setting_is_reported_with_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("batcher:\n  max_delay_ms: soon\n")
    result = runner.invoke(app, ["run", str(cfg), "--once"])
    assert result.exit_code == 2
    assert "batcher.max_delay_ms" in result.output


def test_bad_set_syntax() -> None:
    result = runner.invoke(app, ["serve", "--set", "no-equals-sign"])
    assert result.exit_code != 0
    assert "KEY=VALUE" in result.output


def test_run_once_replays_a_bounded_input(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(
        '{"doc_id": "a", "event_time": "2024-01-01T00:00:00Z", "text": "hello"}\n'
        '{"doc_id": "a", "event_time": "2024-01-02T00:00:00Z", "op": "delete"}\n'
        '{"doc_id": "b", "event_time": "2024-01-01T00:00:00Z", "text": "no newline at end"}'
    )
    result = runner.invoke(app, ["run", "--once", str(_cfg(tmp_path, data))])
    assert result.exit_code == 0, result.output
    assert '"applied": 3' in result.output
    assert '"live_docs": 1' in result.output
    assert '"deleted_docs": 1' in result.output
    assert '"watermark": "end"' in result.output  # a bounded replay ends with W = +inf


def test_query_without_a_server_says_how_to_start_one() -> None:
    result = runner.invoke(app, ["query", "x", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "streamrag serve" in result.output


def _cfg(tmp_path: Path, data: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"source: {{path: {data}}}\nstate_dir: {tmp_path}\nembedder: {{class: hashing}}\n"
    )
    return cfg


def test_the_example_config_runs(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "streamrag.yaml"
    changes = tmp_path / "changes"
    changes.mkdir()
    (changes / "a.jsonl").write_text(
        '{"doc_id": "a", "event_time": "2024-01-01T00:00:00Z", "text": "hello"}\n'
    )
    result = runner.invoke(
        app,
        [
            "run",
            str(example),
            "--once",
            "--set",
            f"source.path={changes}",
            "--set",
            f"state_dir={tmp_path / 'st'}",
            "--set",
            "embedder.class=hashing",
            "--set",
            "embedder.args={}",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"live_docs": 1' in result.output


def test_a_busy_port_is_reported_before_anything_starts(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(
            app,
            [
                "serve",
                "--port",
                str(port),
                "--set",
                "embedder.class=hashing",
                "--set",
                f"source.path={tmp_path / 'none.jsonl'}",
                "--set",
                f"state_dir={tmp_path}",
            ],
        )
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "--port" in result.output
