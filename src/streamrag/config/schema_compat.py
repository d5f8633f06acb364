"""The rules a schema registry keeps: what one version must hold, and how versions may evolve.

A source's records change shape over time: a field is renamed, a new one
appears, a count becomes a fraction. The registry keeps one version of the
source's record schema per shape, each valid from an event time, and every
record is read with the version in force at its event time
(:mod:`streamrag.ingest.schemas`). The rules below make sure the versions
describe *one* evolving record, so that documents decoded under any version
mean the same thing: the same field is the same metadata key, of a type that
only ever grew.

**Within a version**

* ``missing-role`` — some field feeds ``doc_id``, and some field feeds ``event_time``.
* ``duplicate-role`` — at most one field feeds each change field.
* ``role-type`` — a field feeding a change field has that field's type
  (:data:`ROLE_TYPES`); the ``doc_id`` and ``event_time`` fields are required, never null.
* ``name-clash`` — a name or alias belongs to one field only.
* ``default-type`` — a default fits its field's type (``null`` only where nullable).
* ``version-order`` — versions are numbered 1, 2, 3, … and their ``valid_from``
  times strictly increase.

**From one version to the next**

* ``field-removed`` — every field of the previous version is still declared,
  under its name or as an alias of a field (that is how a rename is written).
* ``new-field-required`` — a field new in this version is optional or has a default.
* ``type-narrowed`` — a type only widens, along :data:`WIDENS_TO` (and non-null
  to nullable, never back).
* ``became-required`` — an optional (or defaulted) field stays optional.
* ``role-changed`` — a field feeds the same change field in every version.

A broken rule is reported as a :class:`Break`, which names the source, the
version, the field, the rule and what to do; :func:`raise_breaks` turns them
into one :class:`~streamrag.errors.SchemaError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamrag.errors import SchemaError
from streamrag.timing import format_timestamp

if TYPE_CHECKING:
    from streamrag.config.schemas import Schema, SchemaField

__all__ = [
    "KEY_ROLES",
    "ROLE_TYPES",
    "RULES",
    "WIDENS_TO",
    "Break",
    "check_step",
    "check_version",
    "check_versions",
    "match_field",
    "raise_breaks",
    "widens",
]

WIDENS_TO: Mapping[str, frozenset[str]] = {
    "boolean": frozenset({"boolean", "any"}),
    "integer": frozenset({"integer", "number", "any"}),
    "number": frozenset({"number", "any"}),
    "string": frozenset({"string", "any"}),
    "timestamp": frozenset({"timestamp", "any"}),
    "object": frozenset({"object", "any"}),
    "array": frozenset({"array", "any"}),
    "any": frozenset({"any"}),
}
"""The type lattice: the types each type may become in a later version (itself included).

Every value of the old type is a value of the new one: an integer is a number,
anything is ``any``. Nullability widens on its own axis: a field may become
``nullable: true``, never go back. Nothing else converts (a number is not a
string: the same value would read differently in the index).
"""

ROLE_TYPES: Mapping[str, str] = {
    "doc_id": "string",
    "event_time": "timestamp",
    "op": "string",
    "tenant": "string",
    "text": "string",
    "title": "string",
    "domain": "string",
    "metadata": "object",
}
"""The change fields a record field may feed, and the type it must have to feed each."""

KEY_ROLES = ("doc_id", "event_time")
"""Change fields every version must feed, from a required, non-null field."""

RULES: Mapping[str, str] = {
    "missing-role": "every version has a field for doc_id and one for event_time",
    "duplicate-role": "at most one field feeds each change field",
    "role-type": "a field feeding a change field has its type; doc_id and event_time "
    "fields are required and never null",
    "name-clash": "a name or alias belongs to one field of a version",
    "default-type": "a default fits the field's type (null only where nullable)",
    "version-order": "versions are numbered 1, 2, 3, ... and valid_from strictly increases",
    "field-removed": "every field of the previous version is still declared, by name or alias",
    "new-field-required": "a field new in a version is optional or has a default",
    "type-narrowed": "a type only widens (integer -> number, anything -> any or nullable)",
    "became-required": "an optional or defaulted field stays optional",
    "role-changed": "a field feeds the same change field in every version",
}
"""Every rule, by name, with what it asks (``streamrag schemas check`` lists them)."""


@dataclass(frozen=True, slots=True)
class Break:
    """One rule a version breaks: where, which rule, what was found, and what to do."""

    source: str
    version: int
    field: str | None
    rule: str
    detail: str
    fix: str

    def __str__(self) -> str:
        where = f"schema {self.source!r} version {self.version}"
        if self.field is not None:
            where += f", field {self.field!r}"
        return f"{where}: {self.detail} (rule {self.rule}: {RULES[self.rule]}); {self.fix}"


def raise_breaks(breaks: Sequence[Break], where: str) -> None:
    """Raise one :class:`SchemaError` listing ``breaks`` (nothing when there are none)."""
    if not breaks:
        return
    lines = "\n".join(f"  - {b}" for b in breaks)
    count = "a rule" if len(breaks) == 1 else f"{len(breaks)} rules"
    msg = f"{where} breaks {count} of the schema registry:\n{lines}"
    raise SchemaError(msg, tuple(b.rule for b in breaks))


def widens(old: SchemaField, new: SchemaField) -> bool:
    """Whether every value ``old`` accepts, ``new`` accepts too (see :data:`WIDENS_TO`)."""
    return new.type in WIDENS_TO[old.type] and (new.nullable or not old.nullable)


def match_field(old_name: str, new: Schema) -> str | None:
    """The field of ``new`` that continues the field ``old_name``: same name, else by alias."""
    if old_name in new.fields:
        return old_name
    return next((n for n, f in new.fields.items() if old_name in f.aliases), None)


def check_versions(source: str, versions: Sequence[Schema]) -> list[Break]:
    """Every rule over the versions of one source, in order."""
    out: list[Break] = []
    previous: Schema | None = None
    for position, schema in enumerate(versions, start=1):
        out.extend(_order(source, position, schema, previous))
        out.extend(check_version(schema))
        if previous is not None:
            out.extend(check_step(previous, schema))
        previous = schema
    return out


def _order(source: str, position: int, schema: Schema, previous: Schema | None) -> list[Break]:
    out = []
    if schema.source != source:
        out.append(
            Break(
                *(source, schema.version, None, "version-order"),
                f"the version names source {schema.source!r}",
                f"register it under --source {schema.source}, or fix its source",
            )
        )
    if schema.version != position:
        out.append(
            Break(
                *(source, schema.version, None, "version-order"),
                f"found version {schema.version} where version {position} comes",
                f"number the versions 1, 2, 3, ... in the order of the file (this is {position})",
            )
        )
    if previous is not None and schema.valid_from <= previous.valid_from:
        out.append(
            Break(
                *(source, schema.version, None, "version-order"),
                f"valid_from {format_timestamp(schema.valid_from)} is not after version "
                f"{previous.version}'s {format_timestamp(previous.valid_from)}",
                "give each version a valid_from later than the one before",
            )
        )
    return out


def check_version(schema: Schema) -> list[Break]:
    """The rules one version keeps on its own."""
    out: list[Break] = []
    brk = _Brk(schema)
    feeders: dict[str, list[str]] = {}
    for name, f in schema.fields.items():
        role = f.feeds(name)
        if role is not None:
            feeders.setdefault(role, []).append(name)
    for role in KEY_ROLES:
        if role not in feeders:
            out.append(
                brk(
                    None,
                    "missing-role",
                    f"no field feeds {role}",
                    f"declare the record's {role} field with role: {role} "
                    f"(or name the field {role})",
                )
            )
    for role, names in feeders.items():
        if len(names) > 1:
            out.append(
                brk(
                    names[1],
                    "duplicate-role",
                    f"fields {', '.join(map(repr, names))} all feed {role}",
                    "keep one of them in that role; the others go to metadata without a role",
                )
            )
    for name, f in schema.fields.items():
        out.extend(_role_type(brk, name, f))
        if f.has_default and not f.fits(f.default):
            out.append(
                brk(
                    name,
                    "default-type",
                    f"default {f.default!r} is not of type {f.shown_type}",
                    f"give a default of type {f.shown_type}, or drop the default",
                )
            )
    out.extend(_clashes(schema, brk))
    return out


def _role_type(brk: _Brk, name: str, f: SchemaField) -> list[Break]:
    role = f.feeds(name)
    if role is None:
        return []
    want = ROLE_TYPES[role]
    if f.type != want:
        return [
            brk(
                name,
                "role-type",
                f"it feeds {role}, which takes a {want}, but is declared {f.type}",
                f"declare it type: {want}, or drop role: {role}",
            )
        ]
    if role in KEY_ROLES and (f.nullable or not f.is_required):
        return [
            brk(
                name,
                "role-type",
                f"it feeds {role}, which every record needs, but is optional or nullable",
                "make it required (no default, required: true) and not nullable",
            )
        ]
    return []


def _clashes(schema: Schema, brk: _Brk) -> list[Break]:
    owner: dict[str, str] = {}
    out = []
    for name, f in schema.fields.items():
        for key in dict.fromkeys((name, *f.aliases)):
            other = owner.setdefault(key, name)
            if other != name:
                out.append(
                    brk(
                        name,
                        "name-clash",
                        f"{key!r} already names field {other!r}",
                        f"drop {key!r} from one of the two fields",
                    )
                )
    return out


def check_step(old: Schema, new: Schema) -> list[Break]:
    """The rules from version ``old`` to the next one, ``new``."""
    out: list[Break] = []
    brk = _Brk(new)
    continued: set[str] = set()
    for old_name, was in old.fields.items():
        name = match_field(old_name, new)
        if name is None:
            out.append(
                brk(
                    old_name,
                    "field-removed",
                    f"it was declared in version {old.version} and is not declared now",
                    f"if it was renamed, list {old_name!r} in the new field's aliases; "
                    "to retire it, keep declaring it with required: false",
                )
            )
            continue
        continued.add(name)
        out.extend(_step_field(brk, old.version, old_name, was, name, new.fields[name]))
    for name, f in new.fields.items():
        if name not in continued and f.is_required:
            out.append(
                brk(
                    name,
                    "new-field-required",
                    f"the field is new in version {new.version} and required, so records "
                    "written before it cannot decode under this version",
                    "declare it with required: false, or give it a default",
                )
            )
    return out


def _step_field(
    brk: _Brk, old_version: int, old_name: str, was: SchemaField, name: str, now: SchemaField
) -> list[Break]:
    out = []
    label = repr(old_name) if old_name == name else f"{old_name!r}, now {name!r},"
    if not widens(was, now):
        wider = ", ".join(sorted(WIDENS_TO[was.type] - {was.type}))
        keep = "the field nullable" if was.nullable and not now.nullable else was.type
        out.append(
            brk(
                name,
                "type-narrowed",
                f"it was {was.shown_type} in version {old_version} and is {now.shown_type}",
                f"keep {keep}, or widen {was.type} to {wider} (see the type lattice)",
            )
        )
    if now.is_required and not was.is_required:
        out.append(
            brk(
                name,
                "became-required",
                f"it was optional in version {old_version} and is required",
                "keep it optional (required: false), or give it a default",
            )
        )
    if now.feeds(name) != was.feeds(old_name):
        before = was.feeds(old_name)
        after = now.feeds(name) or "metadata"
        stay = f"keep role: {before}" if before else "keep it without a role (metadata)"
        out.append(
            brk(
                name,
                "role-changed",
                f"field {label} fed {before or 'metadata'} in version {old_version} and "
                f"feeds {after}",
                f"{stay}, and declare a new, optional field for {after}",
            )
        )
    return out


class _Brk:
    """Makes the :class:`Break` objects of one version."""

    def __init__(self, schema: Schema) -> None:
        self.source = schema.source
        self.version = schema.version

    def __call__(self, field: str | None, rule: str, detail: str, fix: str) -> Break:
        return Break(self.source, self.version, field, rule, detail, fix)
