"""What the commands share: the consoles, common options, settings from flags, HTTP calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import rich.markup
import typer
from rich.console import Console

from streamrag.config import Settings, load_settings, parse_value
from streamrag.errors import StreamragError

__all__ = [
    "DEFAULT_URL",
    "ApiKeyOption",
    "HostOption",
    "InsecureOption",
    "PortOption",
    "SetOption",
    "UrlOption",
    "console",
    "guard",
    "http",
    "out",
    "settings_from",
]

console = Console(stderr=True)
out = Console()

DEFAULT_URL = "http://127.0.0.1:8000"

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a setting: --set batcher.max_delay_ms=50 (repeatable)."),
]
HostOption = Annotated[str | None, typer.Option(help="Address to serve on (serve.host).")]
PortOption = Annotated[int | None, typer.Option(help="Port to serve on (serve.port).")]
UrlOption = Annotated[str, typer.Option("--url", help="Where a streamrag server listens.")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="STREAMRAG_API_KEY", show_default=False, help="The server's API key."
    ),
]
InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Serve an address beyond 127.0.0.1 WITHOUT API keys: anyone who reaches it can "
        "read and change every tenant's documents.",
    ),
]


def settings_from(
    config: Path | None, sets: list[str] | None, host: str | None, port: int | None
) -> Settings:
    """Settings from a config file and the --set, --host and --port flags."""
    overrides: dict[str, Any] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep:
            msg = f"--set {item!r}: expected KEY=VALUE, such as --set batcher.max_delay_ms=50"
            raise typer.BadParameter(msg)
        overrides[key.strip()] = parse_value(value)
    if host is not None:
        overrides["serve.host"] = host
    if port is not None:
        overrides["serve.port"] = port
    return load_settings(config, overrides=overrides, environ=os.environ)


def http(method: str, url: str, body: Any, api_key: str | None = None) -> Any:
    """Call a running server (with ``api_key`` as a bearer token); exit with its error."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        resp = httpx.request(method, url, json=body, headers=headers, timeout=120)
    except httpx.TransportError as exc:
        console.print(f"[red]error:[/] cannot reach {url}: {exc}. Is `streamrag serve` running?")
        raise typer.Exit(2) from None
    if resp.status_code >= 400:
        console.print(f"[red]error {resp.status_code}:[/] {_reason(resp)}")
        raise typer.Exit(1)
    return resp.json()


def _reason(resp: httpx.Response) -> str:
    """The server's message and code, from its error body (the raw text when it has none)."""
    try:
        err = resp.json()["error"]
        return rich.markup.escape(f"{err['message']} ({err['code']})")
    except (ValueError, KeyError, TypeError):
        return rich.markup.escape(resp.text)


def guard(fn: Any) -> None:
    """Run ``fn``, turning a streamrag error into one red line and exit status 2."""
    try:
        fn()
    except StreamragError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
