"""``streamrag audit``: the hash-chained log of committed epochs — verify it, show it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import rich.markup
import typer
from rich.table import Table

from streamrag.cli.common import SetOption, console, out
from streamrag.cli.common import guard as _guard
from streamrag.cli.common import settings_from as _settings
from streamrag.config import Settings
from streamrag.errors import StreamragError

__all__ = ["audit_app"]

audit_app = typer.Typer(
    help="The audit log of committed epochs: verify its chain and the index, show records.",
    no_args_is_help=True,
)

ConfigOption = Annotated[Path | None, typer.Option(help="YAML config file (optional).")]

_SHOWN_FINDINGS = 20


def _log_path(settings: Settings) -> Path:
    path = settings.audit.log_path(settings.state_dir)
    if not path.exists():
        msg = (
            f"no epoch audit log at {path}; nothing was committed with audit.enabled yet, or "
            "the job keeps its state elsewhere (pass the same --config / --set state_dir=... as "
            "the job)"
        )
        raise StreamragError(msg)
    return path


@audit_app.command("verify")
def audit_verify(config: ConfigOption = None, sets: SetOption = None) -> None:
    """Check the log's hash chain (and signatures), then the index against each epoch's digest.

    Exits 1 and names the first broken link (line, epoch, what differs) when
    anything does not hold; prints a summary when everything does.
    Example: streamrag audit verify --config job.yaml
    """
    code = 0

    def go() -> None:
        nonlocal code
        from streamrag.index.factory import lsm_spec
        from streamrag.runtime.audit_verify import verify
        from streamrag.runtime.generations import Book, index_home

        settings = _settings(config, sets, None, None)
        path = _log_path(settings)
        key = settings.audit.secret(os.environ)
        book = Book.load(settings.state_dir)
        idx = settings.index
        persists = idx.kind == "lsm" and idx.persist
        state = settings.state_dir
        report = verify(
            path,
            index_dir=(lambda g: index_home(state, g) / "index") if persists else None,
            spec=lsm_spec(idx),
            key=key,
            serving=book.serving.number if book is not None else 1,
            created={e.number: e.created_us for e in book.entries} if book is not None else None,
        )
        _print_report(report, path, signed=key is not None)
        code = 0 if report.ok else 1

    _guard(go)
    raise typer.Exit(code)


def _print_report(report: Any, path: Path, *, signed: bool) -> None:
    esc = rich.markup.escape
    if report.findings:
        first = report.findings[0]
        out.print(f"[red bold]BROKEN[/] {esc(str(path))} — {esc(str(first))}")
        for finding in report.findings[1 : _SHOWN_FINDINGS + 1]:
            out.print(f"  also: {esc(str(finding))}")
        if len(report.findings) > _SHOWN_FINDINGS + 1:
            out.print(f"  … and {len(report.findings) - _SHOWN_FINDINGS - 1} more")
    else:
        out.print(f"[green bold]OK[/] {esc(str(path))}: every link of the chain holds")
    out.print(f"records: {report.records}")
    out.print(f"epochs checked against the index: {report.epochs_checked}")
    if signed:
        out.print(f"signatures checked: {report.signatures_checked}")
    elif report.signatures_unchecked:
        out.print(
            f"signatures not checked: {report.signatures_unchecked} signed records "
            "(set the secret named by audit.hmac_key_env to check them)"
        )
    for reason, epochs in sorted(report.not_verifiable.items()):
        out.print(f"not verifiable ({esc(reason)}): {len(epochs)} epochs {_span(epochs)}")
    for note in report.notes:
        out.print(f"note: {esc(note)}")


def _span(epochs: list[int]) -> str:
    if not epochs:
        return ""
    lo, hi = min(epochs), max(epochs)
    return f"({lo})" if lo == hi else f"({lo}–{hi})"


@audit_app.command("show")
def audit_show(
    config: ConfigOption = None,
    sets: SetOption = None,
    epoch: Annotated[
        int | None, typer.Option(help="Only the records of this epoch, in full.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (newest last).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One record (JSON) per line.")] = False,
) -> None:
    """Show the log's records: a table of the latest, or one epoch's records in full.

    Example: streamrag audit show --epoch 12 --set state_dir=.streamrag
    """

    def go() -> None:
        from streamrag.runtime.audit_verify import read_log

        settings = _settings(config, sets, None, None)
        path = _log_path(settings)
        lines, _ = read_log(path)
        rows: list[tuple[int, dict[str, Any]]] = []
        for n, raw in enumerate(lines, 1):
            try:
                rec = json.loads(raw)
            except ValueError:
                console.print(f"[yellow]line {n} is not a record[/] (run `streamrag audit verify`)")
                continue
            if isinstance(rec, dict) and (epoch is None or rec.get("epoch") == epoch):
                rows.append((n, rec))
        if epoch is not None and not rows:
            msg = f"the epoch audit log {path} has no record of epoch {epoch}"
            raise StreamragError(msg)
        shown = rows[-limit:] if limit > 0 and epoch is None else rows
        if as_json:
            for _, rec in shown:
                out.print(json.dumps(rec, ensure_ascii=False), soft_wrap=True, markup=False)
            return
        if epoch is not None:
            for _, rec in shown:
                out.print_json(json.dumps(rec))
            return
        out.print(_table(shown, path, len(rows)))

    _guard(go)


def _table(rows: list[tuple[int, dict[str, Any]]], path: Path, total: int) -> Table:
    table = Table(title=f"{total} records in {path}")
    for col in ("line", "kind", "epoch", "gen", "time", "upserts", "deletes", "dead", "hash"):
        table.add_column(col)
    for n, rec in rows:
        counts = rec.get("counts") or {}
        table.add_row(
            str(n),
            str(rec.get("kind", "")),
            str(rec.get("epoch", "")),
            str(rec.get("generation", "")),
            str(rec.get("time", "")),
            str(counts.get("upserts", "")),
            str(counts.get("deletes", "")),
            str(counts.get("dead_lettered", "")),
            str(rec.get("hash", ""))[:16],
        )
    return table
