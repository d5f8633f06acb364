"""``streamrag schemas check|show|register`` on real registry and config files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from streamrag.cli import app
from streamrag.config.schemas import load_registry

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "schemas.yaml"
runner = CliRunner()

V4: dict[str, Any] = {
    "valid_from": "2025-06-01T00:00:00Z",
    "description": "a customer, when known",
    "fields": {
        "id": {"type": "string", "role": "doc_id"},
        "updated": {"type": "timestamp", "role": "event_time"},
        "text": {"type": "string", "aliases": ["body"]},
        "subject": {"type": "string", "role": "title", "required": False},
        "priority": {"type": "number"},
        "team": {"type": "string", "required": False},
        "customer": {"type": "string", "required": False},
    },
}


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["schemas", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def _copy(tmp_path: Path) -> Path:
    path = tmp_path / "schemas.yaml"
    shutil.copy(EXAMPLE, path)
    return path


def _version(tmp_path: Path, doc: dict[str, Any], name: str = "v4.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["check", "show", "register"])
def test_every_schemas_command_has_help_with_an_example(command: str) -> None:
    code, output = _run(command, "--help")
    assert code == 0
    assert "Example:" in output
    assert f"streamrag schemas {command}" in output


def test_check_passes_the_example_and_names_its_versions() -> None:
    code, output = _run("check", "--registry", str(EXAMPLE))
    assert code == 0, output
    assert "3 versions of sources tickets" in output


def test_register_appends_a_version_that_passes(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    before = path.read_text(encoding="utf-8")
    v4 = _version(tmp_path, V4)
    code, output = _run("check", "--registry", str(path), "--source", "tickets", str(v4))
    assert code == 0, output
    assert "can be version 4 of 'tickets'" in output
    assert path.read_text(encoding="utf-8") == before  # check writes nothing
    code, output = _run("register", "--registry", str(path), "--source", "tickets", str(v4))
    assert code == 0, output
    assert "registered version 4 of 'tickets' (valid from 2025-06-01T00:00:00Z)" in output
    after = path.read_text(encoding="utf-8")
    assert after.startswith(before)  # the comments and versions 1-3 as they were
    versions = load_registry(path).versions("tickets")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    assert versions[3].fields["customer"].is_required is False
    code, output = _run("show", "--registry", str(path), "--source", "tickets")
    assert code == 0, output
    assert "metadata.customer" in output
    assert "event time looked for in: updated" in output


def test_register_refuses_a_version_that_breaks_a_rule_and_writes_nothing(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    before = path.read_text(encoding="utf-8")
    narrowed = {**V4, "fields": {**V4["fields"], "priority": {"type": "integer"}}}
    v4 = _version(tmp_path, narrowed)
    code, output = _run("register", "--registry", str(path), "--source", "tickets", str(v4))
    assert code == 2
    flat = " ".join(output.split())
    assert "field 'priority'" in flat
    assert "rule type-narrowed" in flat
    assert "keep number" in flat
    assert path.read_text(encoding="utf-8") == before


def test_register_creates_a_registry_and_takes_valid_from_as_an_option(tmp_path: Path) -> None:
    path = tmp_path / "new.yaml"
    first = {"fields": {k: V4["fields"][k] for k in ("id", "updated", "text")}}
    v1 = _version(tmp_path, first, "v1.yaml")
    code, output = _run(
        "register",
        "--registry",
        str(path),
        "--source",
        "notes",
        "--valid-from",
        "2024-01-01T00:00:00+02:00",
        str(v1),
    )
    assert code == 0, output
    (only,) = load_registry(path).versions("notes")
    assert only.version == 1
    assert only.to_document()["valid_from"] == "2023-12-31T22:00:00Z"
    code, output = _run("register", "--registry", str(path), str(v1))
    assert code == 2
    assert "--source NAME" in output


def test_check_with_a_config_also_checks_the_sources(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "schemas": {"registry": str(EXAMPLE)},
                "sources": [{"kind": "jsonl", "name": "tickets", "path": str(tmp_path)}],
            }
        ),
        encoding="utf-8",
    )
    code, output = _run("check", "--config", str(config))
    assert code == 0, output
    other = tmp_path / "other.yaml"
    other.write_text(
        yaml.safe_dump(
            {
                "schemas": {"registry": str(EXAMPLE)},
                "sources": [{"kind": "jsonl", "name": "notes", "path": str(tmp_path)}],
            }
        ),
        encoding="utf-8",
    )
    code, output = _run("check", "--config", str(other))
    assert code == 2
    assert "source 'tickets', which is not configured (sources: notes)" in " ".join(output.split())


def test_a_config_whose_registry_breaks_a_rule_fails_every_command(tmp_path: Path) -> None:
    path = _copy(tmp_path)
    text = path.read_text(encoding="utf-8").replace(
        "priority: {type: number}", "priority: {type: string}"
    )
    path.write_text(text, encoding="utf-8")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump({"schemas": {"registry": str(path)}}), encoding="utf-8")
    for command in ("check", "show"):
        code, output = _run(command, "--config", str(config))
        assert code == 2
        flat = " ".join(output.split())
        assert "schema 'tickets' version 3, field 'priority'" in flat
        assert "rule type-narrowed" in flat
    code, output = _run("check")
    assert code == 2
    assert "no schema registry" in output


def test_show_json_prints_each_version_as_the_file_holds_it() -> None:
    code, output = _run("show", "--registry", str(EXAMPLE), "--json")
    assert code == 0, output
    docs = [json.loads(chunk) for chunk in output.replace("}\n{", "}\x00{").split("\x00")]
    assert [d["version"] for d in docs] == [1, 2, 3]
    assert docs[1]["fields"]["text"] == {"type": "string", "aliases": ["body"]}
    code, output = _run("show", "--registry", str(EXAMPLE), "--source", "nope")
    assert code == 2
    assert "no schema for source 'nope' (it has: tickets)" in output
