"""``streamrag keys``: make, list and revoke API keys (each names a tenant and a role).

A key is shown once, when it is made; the key file keeps only its SHA-256, its
name, tenant, role and when it was made. A running server reads the file again
within a second of a change, so a revoked key is refused from then on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from streamrag.cli.common import SetOption, console, out
from streamrag.cli.common import guard as _guard
from streamrag.cli.common import settings_from as _settings
from streamrag.config.security import ROLES, ApiKeySpec, KeyFile
from streamrag.errors import ConfigError
from streamrag.serve.auth import hash_key, new_key
from streamrag.timing import US_PER_S, SystemClock, format_timestamp

__all__ = ["keys_app"]

keys_app = typer.Typer(
    help="API keys: make one for a tenant and role, list them, revoke one.",
    no_args_is_help=True,
)

ConfigOption = Annotated[Path | None, typer.Option(help="YAML config file (optional).")]
FileOption = Annotated[
    Path | None,
    typer.Option(
        "--file", help="The key file (default: security.key_file, or <state_dir>/keys.yaml)."
    ),
]


def _key_file(config: Path | None, sets: list[str] | None, file: Path | None) -> KeyFile:
    if file is not None:
        return KeyFile(file)
    settings = _settings(config, sets, None, None)
    return KeyFile(settings.security.key_path(settings.state_dir))


def _default_name(tenant: str, role: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", tenant).strip("-._")[:40] or "tenant"
    return f"{stem}-{role}-{new_key()[3:9].lower().replace('_', 'x').replace('-', 'x')}"


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The only tenant the key may read or write.")],
    role: Annotated[
        str, typer.Option(help="reader (queries), writer (and push ingest), admin (everything).")
    ] = "reader",
    name: Annotated[
        str | None, typer.Option(help="Unique name (default: tenant-role-xxxxxx).")
    ] = None,
    rate_per_s: Annotated[
        float | None, typer.Option(help="This key's requests per second (security.limits).")
    ] = None,
    burst: Annotated[int | None, typer.Option(help="This key's burst (security.limits).")] = None,
    file: FileOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
) -> None:
    """Make a key, print it once, and add its hash to the key file.

    Example: streamrag keys create --tenant acme --role reader --name acme-app
    """

    def go() -> None:
        if role not in ROLES:
            msg = f"--role {role!r}: expected one of {', '.join(ROLES)}"
            raise ConfigError(msg)
        if not tenant.strip() or tenant != tenant.strip():
            msg = f"--tenant {tenant!r}: name a tenant, without spaces around it"
            raise ConfigError(msg)
        key = new_key()
        now = SystemClock().now_us()
        fields: dict[str, Any] = {
            "name": name or _default_name(tenant, role),
            "tenant": tenant,
            "role": role,
            "sha256": hash_key(key),
            "created": format_timestamp(now - now % US_PER_S),
            "rate_per_s": rate_per_s,
            "burst": burst,
        }
        try:
            spec = ApiKeySpec.model_validate(fields)
        except ValueError as exc:  # pydantic's ValidationError: a bad name or limit
            msg = f"cannot make this key: {exc}"
            raise ConfigError(msg) from None
        store = _key_file(config, sets, file)
        store.add(spec)
        typer.echo(key)
        console.print(
            f"[bold]{spec.name}[/]: {'an' if spec.role == 'admin' else 'a'} {spec.role} key of "
            f"the tenant {spec.tenant!r}, shown only "
            f"now: store it. Its hash is in {store.path}. Send it as 'Authorization: Bearer <key>'."
        )

    _guard(go)


@keys_app.command("list")
def keys_list(
    file: FileOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List the keys: name, tenant, role, when made, and where each is kept (never hashes).

    Example: streamrag keys list --set state_dir=.streamrag
    """

    def go() -> None:
        configured: list[ApiKeySpec] = []
        if file is None:
            configured = list(_settings(config, sets, None, None).security.keys)
        store = _key_file(config, sets, file)
        rows = [(s, "config") for s in configured] + [(s, str(store.path)) for s in store.read()]
        if as_json:
            for spec, where in rows:
                shown = {
                    "name": spec.name,
                    "tenant": spec.tenant,
                    "role": spec.role,
                    "created": spec.created,
                    "in": where,
                }
                out.print(json.dumps(shown), highlight=False, soft_wrap=True)
            return
        table = Table(title=f"{len(rows)} API keys")
        for col in ("name", "tenant", "role", "created", "kept in"):
            table.add_column(col)
        for spec, where in rows:
            table.add_row(spec.name, spec.tenant, spec.role, spec.created or "", where)
        out.print(table)

    _guard(go)


@keys_app.command("revoke")
def keys_revoke(
    name: Annotated[str, typer.Argument(help="The key's name (see `streamrag keys list`).")],
    file: FileOption = None,
    config: ConfigOption = None,
    sets: SetOption = None,
) -> None:
    """Remove a key from the key file: a running server refuses it within a second.

    Example: streamrag keys revoke acme-app
    """

    def go() -> None:
        store = _key_file(config, sets, file)
        if file is None:
            configured = _settings(config, sets, None, None).security.keys
            if any(s.name == name for s in configured):
                msg = (
                    f"the key {name!r} is in security.keys of the configuration, not in the key "
                    "file: remove it there and restart the server"
                )
                raise ConfigError(msg)
        spec = store.remove(name)
        console.print(f"revoked [bold]{spec.name}[/] (tenant {spec.tenant!r}, {spec.role})")

    _guard(go)
