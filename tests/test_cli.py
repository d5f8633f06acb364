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


def test_help_keeps_bracketed_extras() -> None:
    result = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "200"})
    assert "streamrag[local-llm]" in result.output


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


def test_deadletter_list_show_and_replay_a_fixed_record(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(
        '{"doc_id": "a", "event_time": "2024-01-01T00:00:00Z", "text": "hello"}\n'
        '{"doc_id": "b", "event_time": "yesterday", "text": "a bad time"}\n'
        '{"doc_id": "c", "event_time": "2024-01-01T00:00:00Z"}\n'
    )
    cfg = _cfg(tmp_path, data)
    result = runner.invoke(app, ["run", "--once", str(cfg)])
    assert result.exit_code == 0, result.output
    assert '"dead_lettered": 2' in result.output

    listed = runner.invoke(app, ["deadletter", "list", "--config", str(cfg), "--json"])
    assert listed.exit_code == 0, listed.output
    assert '"id": 1' in listed.output
    assert '"id": 2' in listed.output
    assert "yesterday" in listed.output

    shown = runner.invoke(app, ["deadletter", "show", "1", "--config", str(cfg)])
    assert shown.exit_code == 0, shown.output
    assert '"stage": "decode"' in shown.output
    assert "event_time" in shown.output

    missing = runner.invoke(app, ["deadletter", "show", "7", "--config", str(cfg)])
    assert missing.exit_code == 2
    assert "deadletter list" in missing.output

    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text('{"doc_id": "b", "event_time": "2024-01-01T00:00:00Z", "text": "fixed"}\n')
    replayed = runner.invoke(
        app, ["deadletter", "replay", "1", "--file", str(fixed), "--config", str(cfg)]
    )
    assert replayed.exit_code == 0, replayed.output
    assert "re-injected 1 records" in replayed.output

    # The job resumes where it stopped and reads the replay folder with its source.
    again = runner.invoke(app, ["run", "--once", str(cfg)])
    assert again.exit_code == 0, again.output
    assert '"live_docs": 2' in again.output
    assert '"ingested": 4' in again.output  # three lines once, plus the fixed one

    listed = runner.invoke(app, ["deadletter", "list", "--config", str(cfg)])
    assert "2 dead letters" in listed.output
    assert "yes" in listed.output  # record 1 is marked as re-injected


def test_deadletter_replay_as_stored(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(
        '{"doc_id": "a", "event_time": "2024-01-01T00:00:00Z", "text": "' + "w " * 60 + '"}\n'
    )
    cfg = _cfg(tmp_path, data)
    small = ["--set", "ingest.max_document_bytes=100"]
    result = runner.invoke(app, ["run", "--once", str(cfg), *small])
    assert '"dead_lettered": 1' in result.output
    # Raise the limit, then re-inject the record as it was stored.
    replayed = runner.invoke(
        app, ["deadletter", "replay", "--stage", "decode", "--config", str(cfg)]
    )
    assert replayed.exit_code == 0, replayed.output
    again = runner.invoke(app, ["run", "--once", str(cfg)])
    assert '"live_docs": 1' in again.output


def test_deadletter_without_a_store_says_where_it_looked(tmp_path: Path) -> None:
    result = runner.invoke(app, ["deadletter", "list", "--set", f"state_dir={tmp_path / 'none'}"])
    assert result.exit_code == 2
    assert "no dead-letter store" in result.output
