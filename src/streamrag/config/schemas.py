"""Versioned record schemas: the registry file, what a version declares, and its settings.

A source that feeds streamrag's change format may name its record schema in a
registry (``schemas.registry: schemas.yaml``). The registry holds *versions* of
each source's schema, each valid from an event time: a record is read with the
version in force at its own event time, so a late record written before a
rename still decodes with the schema it was written under
(:mod:`streamrag.ingest.schemas` does the reading).

The file is a YAML stream with one document per version, oldest first::

    source: tickets
    version: 1
    valid_from: 2024-01-01T00:00:00Z
    fields:
      id:       {type: string, role: doc_id}
      updated:  {type: timestamp, role: event_time}
      body:     {type: string, role: text}
      priority: {type: integer}
    ---
    source: tickets
    version: 2
    valid_from: 2024-06-01T00:00:00Z
    fields:
      id:       {type: string, role: doc_id}
      updated:  {type: timestamp, role: event_time}
      text:     {type: string, aliases: [body]}
      team:     {type: string, required: false}
      priority: {type: integer}

Registering a version (``streamrag schemas register``) appends one document
after the checks of :mod:`streamrag.config.schema_compat`, so the file is a log
that only grows and keeps its comments. Loading a file whose versions break a
rule fails at once with :class:`~streamrag.errors.SchemaError` (a
``ConfigError``), when the settings load: a job never starts on a registry it
could not follow.

**A field** has a ``type`` (:data:`FieldType`), is required unless it says
``required: false`` or has a ``default``, may be ``nullable``, may be found
under ``aliases`` (older names), and feeds the change field of its ``role`` —
by default the change field of its own name (a field named ``text`` feeds
``text``). A field that feeds no change field becomes an entry of the change's
metadata, under its name in the newest version, so a typed column of a row is
filterable metadata whatever version decoded it. Fields a record has and the
schema does not declare are ignored.

Types are checked by pydantic (already the settings' library): each type maps
to an annotation (:meth:`SchemaField.annotation`) that the decoder validates
records against and that ``default-type`` checks defaults against, so the
registry and the records obey one definition.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BeforeValidator, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic import Field as Setting

from streamrag.config.base import Frozen
from streamrag.config.schema_compat import check_versions, raise_breaks
from streamrag.errors import ConfigError, DecodeError, SpecError
from streamrag.timing import Timestamp, format_timestamp, parse_timestamp

__all__ = [
    "CHANGE_FIELDS",
    "FieldType",
    "Registry",
    "Role",
    "Schema",
    "SchemaField",
    "SchemaSettings",
    "append_version",
    "load_registry",
    "read_version",
]

FieldType = Literal["string", "integer", "number", "boolean", "timestamp", "object", "array", "any"]
"""What a field holds. ``timestamp``: ISO-8601 with a zone, or epoch seconds."""

Role = Literal["doc_id", "event_time", "op", "tenant", "text", "title", "domain", "metadata"]
"""The change field a record field feeds (``metadata``: an object merged into the metadata)."""

CHANGE_FIELDS: tuple[str, ...] = get_args(Role)


def _not_bool(value: object) -> object:
    """JSON's true and false are not numbers, though Python's bool is an int."""
    if isinstance(value, bool):
        msg = f"found the boolean {str(value).lower()}, which is not a number"
        raise DecodeError(msg)
    return value


_ANNOTATIONS: Mapping[str, Any] = {
    "string": str,
    "integer": Annotated[int, BeforeValidator(_not_bool)],
    "number": Annotated[float, BeforeValidator(_not_bool)],
    "boolean": bool,
    "timestamp": Annotated[int, BeforeValidator(parse_timestamp)],
    "object": dict[str, Any],
    "array": list[Any],
    "any": Any,
}
"""Each type as pydantic validates it (lax: ``"3"`` is an integer, ``3.0`` too; ``3.5`` is not)."""


class SchemaField(Frozen):
    """One field of a record schema."""

    type: FieldType = Setting(description="What the field holds.")
    required: bool | None = Setting(
        None, description="Whether a record must have it (default: yes, unless it has a default)."
    )
    default: Any = Setting(None, description="Value of a record that lacks the field.")
    nullable: bool = Setting(False, description="Whether null is a value of the field.")
    aliases: tuple[str, ...] = Setting((), description="Other names the field is found under.")
    role: Role | None = Setting(
        None,
        description="The change field it feeds (default: the one of its name, if any; "
        "else it becomes metadata).",
    )
    description: str | None = Setting(None, description="What the field means.")

    @model_validator(mode="after")
    def _required_or_default(self) -> SchemaField:
        if self.required and self.has_default:
            msg = "a field with a default is optional; drop required: true or the default"
            raise SpecError(msg)
        return self

    @property
    def has_default(self) -> bool:
        """Whether the field declares a default (``default: null`` included)."""
        return "default" in self.model_fields_set

    @property
    def is_required(self) -> bool:
        """Whether a record without the field is refused."""
        return self.required if self.required is not None else not self.has_default

    @property
    def shown_type(self) -> str:
        """The type as messages show it (``integer``, ``nullable integer``)."""
        return f"nullable {self.type}" if self.nullable else self.type

    def feeds(self, name: str) -> str | None:
        """The change field this field (called ``name``) feeds, or None for metadata."""
        if self.role is not None:
            return self.role
        return name if name in CHANGE_FIELDS else None

    def annotation(self) -> Any:
        """The type pydantic checks values of this field against."""
        base = _ANNOTATIONS[self.type]
        return base | None if self.nullable and self.type != "any" else base

    def fits(self, value: object) -> bool:
        """Whether ``value`` is one of the field's values as it stands (no coercion)."""
        if value is None:
            return self.nullable or self.type == "any"
        try:
            TypeAdapter(self.annotation()).validate_python(value, strict=True)
        except (ValidationError, ValueError):
            return False
        return True


class Schema(Frozen):
    """One version of a source's record schema, in force from ``valid_from`` (event time)."""

    source: str = Setting(
        min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="The source it describes."
    )
    version: int = Setting(ge=1, description="1 for the first version, then 2, 3, ...")
    valid_from: Timestamp = Setting(
        description="Event time from which records are read with this version."
    )
    fields: dict[str, SchemaField] = Setting(min_length=1, description="The record's fields.")
    description: str | None = Setting(None, description="What changed in this version.")

    @field_validator("valid_from", mode="before")
    @classmethod
    def _time(cls, value: object) -> Timestamp:
        if isinstance(value, datetime):  # YAML reads an unquoted time as a datetime
            if value.tzinfo is None:
                msg = f"valid_from {value} has no time zone; add 'Z' for UTC"
                raise SpecError(msg)
            value = value.isoformat()
        return parse_timestamp(value)

    def field_for(self, role: str) -> tuple[str, SchemaField] | None:
        """The field that feeds change field ``role``, with its name."""
        return next(((n, f) for n, f in self.fields.items() if f.feeds(n) == role), None)

    def to_document(self) -> dict[str, Any]:
        """The version as the registry file holds it."""
        doc: dict[str, Any] = {
            "source": self.source,
            "version": self.version,
            "valid_from": format_timestamp(self.valid_from),
        }
        if self.description:
            doc["description"] = self.description
        doc["fields"] = {
            name: f.model_dump(mode="json", exclude_unset=True) for name, f in self.fields.items()
        }
        return doc


@dataclass(frozen=True)
class Registry:
    """The versions of each source's schema, oldest first, all rules checked."""

    sources: Mapping[str, tuple[Schema, ...]] = field(default_factory=dict)
    path: Path | None = None

    def versions(self, source: str) -> tuple[Schema, ...]:
        """The versions of ``source`` (empty if it has none)."""
        return self.sources.get(source, ())

    def in_force(self, source: str, event_time: Timestamp) -> Schema:
        """The version a record of ``source`` at ``event_time`` is read with.

        The latest version whose ``valid_from`` is at or before ``event_time``; a
        record older than the first version is read with the first.
        """
        versions = self.sources[source]
        starts = [v.valid_from for v in versions]
        return versions[max(0, bisect_right(starts, event_time) - 1)]

    def with_version(self, schema: Schema) -> Registry:
        """This registry and one more version; raises :class:`SchemaError` if it breaks a rule."""
        versions = (*self.versions(schema.source), schema)
        where = f"version {schema.version} of schema {schema.source!r}"
        raise_breaks(check_versions(schema.source, versions), where)
        return Registry({**self.sources, schema.source: versions}, self.path)


def load_registry(path: Path) -> Registry:
    """Read and check a registry file; raises :class:`ConfigError` (or :class:`SchemaError`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        msg = (
            f"schema registry {str(path)!r} does not exist; create it with `streamrag schemas "
            f"register --registry {path} --source NAME FILE`, or fix schemas.registry"
        )
        raise ConfigError(msg) from None
    except OSError as exc:
        msg = f"schema registry {str(path)!r} cannot be read: {exc}"
        raise ConfigError(msg) from None
    versions = _documents(text, str(path))
    grouped: dict[str, list[Schema]] = {}
    for schema in versions:
        grouped.setdefault(schema.source, []).append(schema)
    breaks = [b for source, vs in grouped.items() for b in check_versions(source, vs)]
    raise_breaks(breaks, f"schema registry {str(path)!r}")
    return Registry({s: tuple(vs) for s, vs in grouped.items()}, Path(path))


def _documents(text: str, where: str) -> list[Schema]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        msg = f"schema registry {where!r} is not valid YAML: {exc}"
        raise ConfigError(msg) from None
    return [_schema(doc, f"{where}, document {i}") for i, doc in enumerate(docs, start=1)]


def _schema(doc: object, where: str) -> Schema:
    if not isinstance(doc, Mapping):
        msg = (
            f"{where}: expected a mapping with source, version, valid_from and fields, "
            f"found {type(doc).__name__}"
        )
        raise ConfigError(msg)
    try:
        return Schema.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()
        )
        msg = f"{where} is not a schema version: {problems}"
        raise ConfigError(msg) from None


def read_version(path: Path, source: str, version: int, *, valid_from: str | None = None) -> Schema:
    """A version to register, from a YAML file of ``valid_from`` and ``fields``.

    ``source`` and ``version`` are filled in when the file leaves them out; a
    file that names others is refused by the checks (``version-order``).
    ``valid_from``, when given, replaces the file's.
    """
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        msg = f"schema file {str(path)!r} cannot be read as YAML: {exc}"
        raise ConfigError(msg) from None
    if isinstance(doc, Mapping):
        doc = {"source": source, "version": version, **doc}
        if valid_from is not None:
            doc["valid_from"] = valid_from
    return _schema(doc, f"schema file {str(path)!r}")


def append_version(registry: Registry, schema: Schema) -> Registry:
    """Check ``schema`` against ``registry`` and append it to the registry's file, atomically.

    The file is written whole to a temporary file and renamed over the old one,
    so a reader sees the old registry or the new one, never a torn file.
    """
    grown = registry.with_version(schema)
    if registry.path is None:
        msg = "this registry has no file to append to; load it with load_registry(path)"
        raise ConfigError(msg)
    path = registry.path
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    doc = yaml.safe_dump(schema.to_document(), sort_keys=False, default_flow_style=None)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{old}---\n{doc}", encoding="utf-8")
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return grown


class SchemaSettings(Frozen):
    """Schema on read: the registry of record schemas, versioned by event time."""

    registry: Path | None = Setting(
        None,
        description="YAML file of record schemas per source, each version valid from an event "
        "time (docs/schemas.md); the sources it names are decoded through it.",
    )

    @model_validator(mode="after")
    def _loads(self) -> SchemaSettings:
        self.load()  # a registry that breaks a rule stops the settings here
        return self

    def load(self) -> Registry | None:
        """The registry, read and checked now; None when none is configured."""
        return None if self.registry is None else load_registry(self.registry)
