"""``streamrag schemas``: record schemas versioned by event time — check, show, register.

The registry is the file ``schemas.registry`` of the config names (or
``--registry FILE``). ``check`` runs every rule over it, and over a version to
register when given one, without writing; ``register`` appends a version once
it passes; ``show`` prints the versions, and where each field goes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streamrag.cli.common import SetOption, console, out
from streamrag.cli.common import guard as _guard
from streamrag.cli.common import settings_from as _settings
from streamrag.config import Settings
from streamrag.config.schemas import Registry, append_version, load_registry, read_version
from streamrag.errors import StreamragError
from streamrag.ingest.schemas import SchemaDecoder, schema_decoders
from streamrag.timing import format_timestamp

__all__ = ["schemas_app"]

schemas_app = typer.Typer(
    help="Record schemas of sources, versioned by event time: check, show, register.",
    no_args_is_help=True,
)

ConfigOption = Annotated[
    Path | None, typer.Option(help="YAML config file whose schemas.registry names the registry.")
]
RegistryOption = Annotated[
    Path | None,
    typer.Option("--registry", help="The registry file (else the config's schemas.registry)."),
]
SourceOption = Annotated[str | None, typer.Option("--source", help="The source it describes.")]


def _open(
    registry: Path | None, config: Path | None, sets: list[str] | None, *, may_be_new: bool = False
) -> tuple[Registry, Settings | None]:
    """The registry (checked as it loads), and the settings when they named it."""
    settings = None
    if registry is None:
        settings = _settings(config, sets, None, None)
        registry = settings.schemas.registry
        if registry is None:
            msg = (
                "no schema registry: pass --registry FILE, or set schemas.registry in the "
                "config (--config job.yaml)"
            )
            raise StreamragError(msg)
    if may_be_new and not registry.exists():
        return Registry({}, registry), settings
    return load_registry(registry), settings


@schemas_app.command("check")
def schemas_check(
    file: Annotated[
        Path | None, typer.Argument(help="A version to check before registering it.")
    ] = None,
    source: SourceOption = None,
    registry: RegistryOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
) -> None:
    """Check every rule of the registry, and of FILE as its source's next version (writes nothing).

    With a config, also that each source the registry names is configured and
    reads JSON change records. Exit status 2 names each rule broken.
    Example: streamrag schemas check --config job.yaml --source tickets v4.yaml
    """

    def go() -> None:
        reg, settings = _open(registry, config, sets, may_be_new=file is not None)
        if settings is not None:
            schema_decoders(reg, settings.sources)
        if file is not None:
            name = _source_for(source)
            reg.with_version(read_version(file, name, len(reg.versions(name)) + 1))
            console.print(
                f"[green]ok:[/] {file} can be version {len(reg.versions(name)) + 1} of {name!r}"
            )
            return
        count = sum(len(v) for v in reg.sources.values())
        sources = ", ".join(sorted(reg.sources)) or "none"
        console.print(f"[green]ok:[/] {reg.path}: {count} versions of sources {sources}")

    _guard(go)


@schemas_app.command("register")
def schemas_register(
    file: Annotated[Path, typer.Argument(help="YAML file of the version: valid_from, fields.")],
    source: SourceOption = None,
    valid_from: Annotated[
        str | None, typer.Option(help="Event time it is in force from (instead of the file's).")
    ] = None,
    registry: RegistryOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
) -> None:
    """Append FILE as the next version of a source's schema, once it passes every rule.

    A running job reads the registry when it starts: restart it to decode with
    the new version.
    Example: streamrag schemas register --registry schemas.yaml --source tickets v4.yaml
    """

    def go() -> None:
        reg, _ = _open(registry, config, sets, may_be_new=True)
        name = _source_for(source)
        version = len(reg.versions(name)) + 1
        schema = read_version(file, name, version, valid_from=valid_from)
        append_version(reg, schema)
        console.print(
            f"registered version {schema.version} of {name!r} (valid from "
            f"{format_timestamp(schema.valid_from)}) in {reg.path}; a running job decodes "
            "with it once restarted"
        )

    _guard(go)


@schemas_app.command("show")
def schemas_show(
    source: SourceOption = None,
    registry: RegistryOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per version.")] = False,
) -> None:
    """Show each version: when it is in force, its fields, and where each one goes.

    Example: streamrag schemas show --registry schemas.yaml --source tickets
    """

    def go() -> None:
        reg, _ = _open(registry, config, sets)
        names = [source] if source is not None else sorted(reg.sources)
        for name in names:
            if not reg.versions(name):
                known = ", ".join(sorted(reg.sources)) or "none"
                msg = f"the registry has no schema for source {name!r} (it has: {known})"
                raise StreamragError(msg)
            if as_json:
                for schema in reg.versions(name):
                    out.print_json(json.dumps(schema.to_document()))
                continue
            _table(reg, name)

    _guard(go)


def _table(reg: Registry, name: str) -> None:
    decoder = SchemaDecoder.from_registry(reg, name)
    table = Table(title=f"schema {name!r} ({reg.path})")
    for col in ("version", "valid from", "field", "type", "required", "aliases", "goes to"):
        table.add_column(col)
    for schema in reg.versions(name):
        goes = decoder.destinations(schema.version)
        first = True
        for field_name, f in schema.fields.items():
            need = (
                "yes" if f.is_required else ("default " + repr(f.default) if f.has_default else "")
            )
            table.add_row(
                str(schema.version) if first else "",
                format_timestamp(schema.valid_from) if first else "",
                field_name,
                f.shown_type,
                need,
                ", ".join(f.aliases),
                goes[field_name],
            )
            first = False
    out.print(table)
    console.print(f"event time looked for in: {', '.join(decoder.time_fields)}")


def _source_for(source: str | None) -> str:
    if source is None:
        msg = "name the source the version describes: --source NAME"
        raise StreamragError(msg)
    return source
