"""The schema registry's rules: the type lattice, one test per rule, and loading a registry file."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamrag.config import load_settings
from streamrag.config.schema_compat import RULES, WIDENS_TO, widens
from streamrag.config.schemas import (
    Registry,
    Schema,
    SchemaField,
    append_version,
    load_registry,
)
from streamrag.errors import ConfigError, SchemaError

KEYS = {
    "id": {"type": "string", "role": "doc_id"},
    "ts": {"type": "timestamp", "role": "event_time"},
}
BASE = {**KEYS, "body": {"type": "string", "role": "text"}, "priority": {"type": "integer"}}
TYPES = ["string", "integer", "number", "boolean", "timestamp", "object", "array", "any"]

ALLOWED = {(t, t) for t in TYPES} | {(t, "any") for t in TYPES} | {("integer", "number")}
"""The lattice, written out pair by pair: what the implementation's table must say."""


def _v(version: int, fields: dict[str, Any], valid_from: str | None = None) -> dict[str, Any]:
    return {
        "source": "tickets",
        "version": version,
        "valid_from": valid_from or f"202{version}-01-01T00:00:00Z",
        "fields": fields,
    }


def _write(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False), encoding="utf-8")
    return path


def _breaks(tmp_path: Path, *docs: dict[str, Any]) -> SchemaError:
    with pytest.raises(SchemaError) as info:
        load_registry(_write(tmp_path / "schemas.yaml", *docs))
    return info.value


# -- the lattice ---------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), list(itertools.product(TYPES, TYPES)))
def test_the_type_lattice_allows_exactly_the_widenings(old: str, new: str) -> None:
    a, b = SchemaField(type=old), SchemaField(type=new)
    assert widens(a, b) is ((old, new) in ALLOWED)
    assert (new in WIDENS_TO[old]) is ((old, new) in ALLOWED)


@pytest.mark.parametrize("kind", TYPES)
def test_nullable_widens_and_never_narrows_back(kind: str) -> None:
    plain = SchemaField(type=kind)
    nullable = SchemaField(type=kind, nullable=True)
    assert widens(plain, nullable)
    assert not widens(nullable, plain)
    assert widens(nullable, nullable)


def test_a_compatible_evolution_loads(tmp_path: Path) -> None:
    """Rename through an alias, a new optional field, integer to number, then nullable."""
    v2 = {**KEYS, "text": {"type": "string", "aliases": ["body"]}, "priority": BASE["priority"]}
    v2["team"] = {"type": "string", "required": False}
    v3 = {**v2, "priority": {"type": "number"}, "score": {"type": "number", "default": 0.5}}
    v4 = {**v3, "team": {"type": "any", "nullable": True, "required": False}}
    reg = load_registry(_write(tmp_path / "s.yaml", _v(1, BASE), _v(2, v2), _v(3, v3), _v(4, v4)))
    assert [s.version for s in reg.versions("tickets")] == [1, 2, 3, 4]
    assert reg.in_force("tickets", 0).version == 1  # before the first: the first
    assert reg.in_force("tickets", reg.versions("tickets")[2].valid_from).version == 3


# -- one test per rule -----------------------------------------------------------------


def _assert_rule(err: SchemaError, rule: str, field: str | None, *fix: str) -> None:
    assert err.rules == (rule,), str(err)
    text = str(err)
    assert f"rule {rule}" in text
    if field is not None:
        assert f"field {field!r}" in text
    for words in fix:
        assert words in text


def test_rule_missing_role(tmp_path: Path) -> None:
    fields = {k: v for k, v in BASE.items() if k != "ts"}
    err = _breaks(tmp_path, _v(1, fields))
    _assert_rule(err, "missing-role", None, "no field feeds event_time", "role: event_time")


def test_rule_duplicate_role(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, {**BASE, "summary": {"type": "string", "role": "text"}}))
    _assert_rule(err, "duplicate-role", "summary", "'body', 'summary' all feed text")


def test_rule_role_type(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, {**BASE, "id": {"type": "integer", "role": "doc_id"}}))
    _assert_rule(err, "role-type", "id", "takes a string", "type: string")
    optional = {**BASE, "ts": {"type": "timestamp", "role": "event_time", "required": False}}
    err = _breaks(tmp_path, _v(1, optional))
    _assert_rule(err, "role-type", "ts", "make it required")


def test_rule_name_clash(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, {**BASE, "prio": {"type": "integer", "aliases": ["priority"]}}))
    _assert_rule(err, "name-clash", "prio", "'priority' already names field 'priority'")


def test_rule_default_type(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, {**BASE, "level": {"type": "integer", "default": "three"}}))
    _assert_rule(err, "default-type", "level", "default 'three' is not of type integer")
    err = _breaks(tmp_path, _v(1, {**BASE, "level": {"type": "integer", "default": None}}))
    _assert_rule(err, "default-type", "level")


def test_rule_version_order(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, BASE, "2024-06-01T00:00:00Z"), _v(2, BASE, "2024-01-01T00:00Z"))
    _assert_rule(err, "version-order", None, "is not after version 1's", "later than")
    err = _breaks(tmp_path, _v(1, BASE), _v(3, BASE))
    _assert_rule(err, "version-order", None, "found version 3 where version 2 comes")


def test_rule_field_removed_is_how_a_rename_without_alias_is_caught(tmp_path: Path) -> None:
    renamed = {**KEYS, "text": {"type": "string", "required": False}, "priority": BASE["priority"]}
    err = _breaks(tmp_path, _v(1, BASE), _v(2, renamed))
    _assert_rule(err, "field-removed", "body", "list 'body' in the new field's aliases")


def test_rule_new_field_required(tmp_path: Path) -> None:
    err = _breaks(tmp_path, _v(1, BASE), _v(2, {**BASE, "team": {"type": "string"}}))
    _assert_rule(err, "new-field-required", "team", "required: false, or give it a default")


def test_rule_type_narrowed(tmp_path: Path) -> None:
    wide = {**BASE, "priority": {"type": "number"}}
    err = _breaks(tmp_path, _v(1, wide), _v(2, BASE))
    _assert_rule(err, "type-narrowed", "priority", "was number in version 1 and is integer")
    nullable = {**BASE, "priority": {"type": "integer", "nullable": True}}
    err = _breaks(tmp_path, _v(1, nullable), _v(2, BASE))
    _assert_rule(err, "type-narrowed", "priority", "keep the field nullable")
    err = _breaks(tmp_path, _v(1, BASE), _v(2, {**BASE, "priority": {"type": "string"}}))
    _assert_rule(err, "type-narrowed", "priority", "widen integer to any, number")


def test_rule_became_required(tmp_path: Path) -> None:
    optional = {**BASE, "team": {"type": "string", "default": "help desk"}}
    err = _breaks(tmp_path, _v(1, optional), _v(2, {**BASE, "team": {"type": "string"}}))
    _assert_rule(err, "became-required", "team", "keep it optional")


def test_rule_role_changed(tmp_path: Path) -> None:
    """A v1 metadata field cannot become the text, even through an alias."""
    v1 = {**KEYS, "body": {"type": "string", "role": "text"}, "note": {"type": "string"}}
    v2 = {**KEYS, "body": {"type": "string"}, "text": {"type": "string", "aliases": ["note"]}}
    err = _breaks(tmp_path, _v(1, v1), _v(2, v2))
    assert set(err.rules) == {"role-changed"}
    assert "field 'body' fed text in version 1 and feeds metadata" in str(err)
    assert "field 'note', now 'text', fed metadata in version 1 and feeds text" in str(err)
    assert "keep role: text" in str(err)
    assert "keep it without a role (metadata)" in str(err)


def test_every_rule_has_a_test_here() -> None:
    names = {n for n in globals() if n.startswith("test_rule_")}
    tested = {n.removeprefix("test_rule_").split("_is_")[0].replace("_", "-") for n in names}
    assert tested == set(RULES)


# -- loading and appending ---------------------------------------------------------------


def test_an_incompatible_registry_fails_the_settings_with_the_same_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.yaml", _v(1, BASE), _v(2, {**BASE, "team": {"type": "string"}}))
    with pytest.raises(SchemaError) as direct:
        load_registry(path)
    with pytest.raises(ConfigError) as loading:
        load_settings(overrides={"schemas.registry": str(path)}, environ={})
    assert isinstance(loading.value, SchemaError)
    assert str(loading.value) == str(direct.value)
    assert loading.value.rules == ("new-field-required",)


def test_a_registry_that_is_not_one_says_where(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist; create it with `streamrag schemas"):
        load_settings(overrides={"schemas.registry": str(tmp_path / "no.yaml")}, environ={})
    bad = _write(tmp_path / "b.yaml", _v(1, BASE), _v(2, {**BASE, "id": {"type": "uuid"}}))
    with pytest.raises(ConfigError, match=r"document 2 is not a schema version: fields\.id\.type"):
        load_registry(bad)
    (tmp_path / "c.yaml").write_text("source: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_registry(tmp_path / "c.yaml")
    both = {**BASE, "x": {"type": "string", "required": True, "default": "a"}}
    with pytest.raises(ConfigError, match="a field with a default is optional"):
        load_registry(_write(tmp_path / "d.yaml", _v(1, both)))


def test_a_time_without_zone_is_refused(tmp_path: Path) -> None:
    text = "source: tickets\nversion: 1\nvalid_from: 2024-01-01 00:00:00\nfields: {}\n"
    (tmp_path / "s.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="has no time zone"):
        load_registry(tmp_path / "s.yaml")


def test_appending_keeps_the_file_and_refuses_what_breaks_a_rule(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("# the help desk's tickets\n" + yaml.safe_dump(_v(1, BASE)), encoding="utf-8")
    reg = load_registry(path)
    bad = Schema.model_validate(_v(2, {**BASE, "priority": {"type": "string"}}))
    before = path.read_text(encoding="utf-8")
    with pytest.raises(SchemaError, match="type-narrowed"):
        append_version(reg, bad)
    assert path.read_text(encoding="utf-8") == before
    good = Schema.model_validate(_v(2, {**BASE, "team": {"type": "string", "required": False}}))
    grown = append_version(reg, good)
    text = path.read_text(encoding="utf-8")
    assert text.startswith(before)  # appended: the comment and version 1 as they were
    again = load_registry(path)
    assert again == grown
    assert again.versions("tickets")[1].fields["team"].is_required is False
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_version_round_trips_through_its_document() -> None:
    schema = Schema.model_validate(
        _v(1, {**BASE, "level": {"type": "integer", "default": 2}, "x": {"type": "string"}})
    )
    back = Schema.model_validate(yaml.safe_load(yaml.safe_dump(schema.to_document())))
    assert back == schema
    assert back.fields["level"].has_default
    assert not back.fields["x"].has_default
    assert Registry().versions("tickets") == ()
