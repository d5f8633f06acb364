"""Schema on read, by event time: each record is decoded with the version in force when it happened.

A source named in the schema registry (:mod:`streamrag.config.schemas`) is not
read as streamrag's fixed change format but through its own record schema.
The schema has versions, each valid from an event time, and a stream mixes
them: a late record written under version 1 may arrive after records of
version 2. So the version is chosen per record, by the record's *event time*,
never by arrival:

1. **Find the event time.** The version is not known yet, so the decoder looks
   for the event-time field under every name it has had: the name and aliases
   of the ``event_time`` field of each version, newest first (the compatibility
   rules keep that field, renamed only through aliases, so these names cover
   every version).
2. **Choose the version**: the latest one whose ``valid_from`` is at or before
   that time. A record older than the first version is read with the first:
   it is the oldest shape the registry knows, and refusing a backfill of old
   records would lose them for want of a version nobody wrote.
3. **Validate** the record against that version: required fields present
   (under their name or an alias), each value of its declared type (coerced
   where pydantic's lax mode does: ``"3"`` is the integer 3, ``3.0`` too;
   ``3.5`` and ``"three"`` are not; booleans are never numbers).
4. **Map onto a change**: fields with a role feed ``doc_id``, ``event_time``,
   ``op``, ``tenant``, ``text``, ``title``, ``domain`` or ``metadata``; every
   other declared field becomes a metadata entry named as in the newest version
   (a v1 ``prio`` that v2 renamed ``priority`` is ``metadata.priority`` for both).
   The change then passes the rules every format shares
   (:func:`~streamrag.ingest.formats.check_change`), and its payload records
   the version (``payload["schema_version"]``).

A record that fits no schema — not a JSON object, no event time, a required
field missing, a value of the wrong type that cannot be coerced — becomes a
dead letter whose reason names the version in force, the field, and the
expected and found types; decoding never raises. A delete needs only its key
fields (``doc_id``, ``event_time``, ``tenant``, ``op``).

**Why pydantic.** A version compiles to one pydantic model whose fields accept
several names (``AliasChoices``: the name, then the aliases), fill defaults and
report every failing field with its location and input, from which the reason
is written. msgspec decodes faster but takes one name per field; jsonschema
validates without converting or mapping names. msgspec still parses the bytes
here, and the change format without a schema keeps its msgspec decoder
(:class:`~streamrag.ingest.decode.Decoder`), untouched and as fast as before.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from pydantic import AliasChoices, BaseModel, ConfigDict, ValidationError, create_model
from pydantic import Field as ModelField

from streamrag.changes import ChangeBatch, Op
from streamrag.config import (
    JsonlSourceSettings,
    KafkaSourceSettings,
    NatsSourceSettings,
    RedisSourceSettings,
    SourceSpec,
)
from streamrag.config.schema_compat import check_versions, match_field, raise_breaks
from streamrag.config.schemas import Registry, Schema, SchemaField
from streamrag.errors import ConfigError, DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import check_change, decode_each
from streamrag.sources.base import RawBatch
from streamrag.timing import Timestamp, format_timestamp, parse_timestamp

__all__ = ["SchemaDecoder", "schema_decoders"]

_BOM = b"\xef\xbb\xbf"
_OPS = {"upsert": Op.UPSERT, "delete": Op.DELETE}
_DELETE_ROLES = ("doc_id", "event_time", "tenant", "op")
"""What a delete is checked for: its key, its time and its op."""
_SHOWN_PROBLEMS = 5


class _Slot:
    """Where one declared field goes: its model attribute, names, type and destination."""

    __slots__ = ("attr", "field", "key", "name", "role")

    def __init__(self, attr: str, name: str, field: SchemaField, key: str) -> None:
        self.attr = attr
        self.name = name
        self.field = field
        self.role = field.feeds(name)
        self.key = key
        """The metadata key (the field's name in the newest version), for fields without a role."""


class _Version:
    """One version, compiled: a pydantic model for upserts, a smaller one for deletes."""

    def __init__(self, schema: Schema, keys: Mapping[str, str]) -> None:
        self.schema = schema
        self.slots = [
            _Slot(f"f{i}", name, f, keys[name]) for i, (name, f) in enumerate(schema.fields.items())
        ]
        self.roles = {s.role: s for s in self.slots if s.role is not None}
        self.by_name = {n: s for s in self.slots for n in (s.name, *s.field.aliases)}
        self.full = _model(f"{schema.source}_v{schema.version}", self.slots)
        keyed = [s for s in self.slots if s.role in _DELETE_ROLES]
        self.delete = _model(f"{schema.source}_v{schema.version}_delete", keyed)

    def op_of(self, record: Mapping[str, Any]) -> str | None:
        """The record's op as written (None when it has none)."""
        slot = self.roles.get("op")
        if slot is None:
            return None
        for name in (slot.name, *slot.field.aliases):
            if name in record:
                value = record[name]
                return value if isinstance(value, str) else None
        return slot.field.default if slot.field.has_default else None

    def where(self, event_time: Timestamp) -> str:
        """The version and the record's event time, as a reason begins."""
        s = self.schema
        start, at = format_timestamp(s.valid_from), format_timestamp(event_time)
        if event_time < s.valid_from:
            when = f"the first; the record's event time {at} is before its valid_from {start}"
        else:
            when = f"in force from {start}; the record's event time is {at}"
        return f"schema {s.source!r} version {s.version} ({when})"


def _model(name: str, slots: Sequence[_Slot]) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for s in slots:
        f = s.field
        default: Any = ... if f.is_required else f.default
        names = AliasChoices(s.name, *f.aliases)
        fields[s.attr] = (f.annotation(), ModelField(default, validation_alias=names))
    return create_model(name, __config__=ConfigDict(extra="ignore"), **fields)


def _metadata_keys(versions: Sequence[Schema]) -> list[dict[str, str]]:
    """Per version: each field's name in the newest version (following renames by alias)."""
    keys: list[dict[str, str]] = [{n: n for n in versions[-1].fields}]
    for older, newer in zip(reversed(versions[:-1]), reversed(versions[1:]), strict=True):
        after = keys[0]
        now = {}
        for name in older.fields:
            continued = match_field(name, newer)
            now[name] = after[continued] if continued is not None else name
        keys.insert(0, now)
    return keys


class SchemaDecoder:
    """Decodes one source's JSON records with the schema version in force at each event time."""

    stage = "decode"

    def __init__(
        self,
        source: str,
        versions: Sequence[Schema],
        *,
        default_tenant: str = "default",
        max_document_bytes: int = 1_000_000,
    ) -> None:
        if not versions:
            msg = f"schema {source!r} has no versions; register one with streamrag schemas register"
            raise ConfigError(msg)
        raise_breaks(check_versions(source, versions), f"schema {source!r}")
        self.source = source
        self.default_tenant = default_tenant
        self.max_document_bytes = max_document_bytes
        keys = _metadata_keys(versions)
        self._versions = [_Version(s, k) for s, k in zip(versions, keys, strict=True)]
        self._starts = [s.valid_from for s in versions]
        names: dict[str, None] = {}
        for v in reversed(self._versions):
            slot = v.roles["event_time"]
            names.update(dict.fromkeys((slot.name, *slot.field.aliases)))
        self.time_fields = tuple(names)
        """Where the event time is looked for before the version is known, in this order."""
        self.decoded: Counter[int] = Counter()
        """Records decoded, per version."""
        self.refused: Counter[int] = Counter()
        """Records dead-lettered, per version in force (0: none could be chosen)."""
        self._parse = msgspec.json.Decoder().decode

    @classmethod
    def from_registry(cls, registry: Registry, source: str, **limits: Any) -> SchemaDecoder:
        """The decoder of ``source``'s records, with every version the registry holds."""
        return cls(source, registry.versions(source), **limits)

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode every record; good ones become changes, the others dead letters."""
        return decode_each(raws, self.stage, self.max_document_bytes, self._counted)

    def stats(self) -> dict[str, Any]:
        """Decoded and refused records per version."""
        return {"decoded": dict(self.decoded), "refused": dict(self.refused)}

    def destinations(self, version: int) -> dict[str, str]:
        """Where each field of ``version`` goes: a change field, or ``metadata.KEY``."""
        v = self._versions[version - 1]
        return {s.name: s.role or f"metadata.{s.key}" for s in v.slots}

    def version_at(self, event_time: Timestamp) -> Schema:
        """The version a record at ``event_time`` is read with (the first, before it)."""
        return self._versions[self._index(event_time)].schema

    def _index(self, event_time: Timestamp) -> int:
        return max(0, bisect_right(self._starts, event_time) - 1)

    def _counted(
        self, line: bytes, _key: bytes | None, _time: Timestamp | None
    ) -> tuple[str, str, int, int, Any]:
        version = 0
        try:
            record = self._record(line)
            ts = self._event_time(record)
            compiled = self._versions[self._index(ts)]
            version = compiled.schema.version
            out = self._change(compiled, record, ts)
        except Exception:
            self.refused[version] += 1
            raise
        self.decoded[version] += 1
        return out

    def _record(self, line: bytes) -> dict[str, Any]:
        if line.startswith(_BOM):
            line = line[len(_BOM) :]
        record = self._parse(line)
        if not isinstance(record, dict):
            msg = (
                f"expected a JSON object (a record of schema {self.source!r}), found "
                f"{_kind(record)}; each record must be one JSON object"
            )
            raise DecodeError(msg)
        return record

    def _event_time(self, record: Mapping[str, Any]) -> Timestamp:
        for name in self.time_fields:
            if name in record:
                try:
                    return parse_timestamp(record[name])
                except ValueError as exc:
                    msg = (
                        f"schema {self.source!r}: event-time field {name!r}: {exc}; the event "
                        "time chooses the schema version, so the record needs a readable one"
                    )
                    raise DecodeError(msg) from None
        names = ", ".join(map(repr, self.time_fields))
        msg = (
            f"schema {self.source!r}: the record has no event time; expected one of the "
            f"fields {names} (the event_time field of its versions, with their aliases)"
        )
        raise DecodeError(msg)

    def _change(
        self, v: _Version, record: Mapping[str, Any], ts: Timestamp
    ) -> tuple[str, str, int, int, Any]:
        written = v.op_of(record)
        if written is not None and written not in _OPS:
            msg = (
                f"{v.where(ts)}: field {v.roles['op'].name!r} feeds op: expected 'upsert' or "
                f"'delete', found {written!r}"
            )
            raise DecodeError(msg)
        model = v.delete if written == "delete" else v.full
        try:
            values = model.__pydantic_validator__.validate_python(record).__dict__
        except ValidationError as exc:
            raise DecodeError(_reason(v, ts, exc)) from None
        got = {s.role: values[s.attr] for s in v.slots if s.role is not None and s.attr in values}
        op = _OPS[got.get("op") or "upsert"]
        tenant = got.get("tenant")
        try:
            doc_id, tenant, payload = check_change(
                got["doc_id"],
                self.default_tenant if tenant is None else tenant,
                op,
                text=got.get("text"),
                title=got.get("title"),
                domain=got.get("domain"),
                metadata=_metadata(v, values, got.get("metadata")) if op is Op.UPSERT else None,
            )
        except DecodeError as exc:
            msg = f"{v.where(ts)}: {exc}"
            raise DecodeError(msg) from None
        if got["event_time"] != ts:
            name = v.roles["event_time"].name
            msg = (
                f"{v.where(ts)}: field {name!r} says {format_timestamp(got['event_time'])}, "
                "another name of the event-time field says otherwise; send one event time"
            )
            raise DecodeError(msg)
        payload["schema_version"] = v.schema.version
        return doc_id, tenant, op, ts, payload


def _metadata(
    v: _Version, values: Mapping[str, Any], given: Mapping[str, Any] | None
) -> dict[str, Any]:
    out = dict(given or {})
    for s in v.slots:
        if s.role is None:
            value = values[s.attr]
            if value is not None:
                out[s.key] = format_timestamp(value) if s.field.type == "timestamp" else value
    return out


def _reason(v: _Version, ts: Timestamp, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        name = str(err["loc"][0]) if err["loc"] else "?"
        slot = v.by_name.get(name)
        if slot is None:  # a nested location: name the field, not the path inside it
            problems.append(f"{'.'.join(map(str, err['loc']))}: {err['msg']}")
            continue
        if err["type"] == "missing":
            also = f" (nor under its aliases {', '.join(slot.field.aliases)})"
            problems.append(
                f"required field {slot.name!r} is missing{also if slot.field.aliases else ''}"
            )
            continue
        found = err.get("input")
        problems.append(
            f"field {name!r}: expected {slot.field.shown_type}, found {_kind(found)} "
            f"{_preview(found)} ({err['msg'].removeprefix('Value error, ')})"
        )
    shown = "; ".join(problems[:_SHOWN_PROBLEMS])
    more = (
        f" (and {len(problems) - _SHOWN_PROBLEMS} more)" if len(problems) > _SHOWN_PROBLEMS else ""
    )
    return (
        f"{v.where(ts)}: {shown}{more}; fix the record, or register a schema version "
        "that fits it (streamrag schemas register)"
    )


def _kind(value: object) -> str:
    """A value's JSON type, as messages name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _preview(value: object) -> str:
    try:
        text = msgspec.json.encode(value).decode("utf-8", "replace")
    except (TypeError, msgspec.EncodeError):
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


_CHANGE_FORMAT = (KafkaSourceSettings, NatsSourceSettings, RedisSourceSettings)


def schema_decoders(
    registry: Registry, specs: Sequence[SourceSpec], **limits: Any
) -> dict[str, SchemaDecoder]:
    """A :class:`SchemaDecoder` per source the registry names; each must read change records.

    Raises :class:`ConfigError` for a source the registry names that is not
    configured, or that reads another format (rows, Debezium, documents).
    """
    by_name = {spec.name: spec for spec in specs}
    out: dict[str, SchemaDecoder] = {}
    for name in sorted(registry.sources):
        spec = by_name.get(name)
        where = f"schema registry {str(registry.path)!r}" if registry.path else "the registry"
        if spec is None:
            known = ", ".join(sorted(by_name)) or "none"
            msg = (
                f"{where} has versions for source {name!r}, which is not configured "
                f"(sources: {known}); add it under sources: (with this name), or rename "
                "its versions"
            )
            raise ConfigError(msg)
        change = isinstance(spec, JsonlSourceSettings) or (
            isinstance(spec, _CHANGE_FORMAT) and spec.format == "change"
        )
        if not change:
            shown = getattr(spec, "format", spec.kind)
            msg = (
                f"{where} has versions for source {name!r}, which reads {shown} records; "
                "schemas apply to sources of JSON change records (jsonl, or kafka, nats, "
                "redis with format: change): set format: change, or drop its versions"
            )
            raise ConfigError(msg)
        out[name] = SchemaDecoder.from_registry(registry, name, **limits)
    return out
