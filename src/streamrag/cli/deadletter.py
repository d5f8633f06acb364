"""``streamrag deadletter``: the records streamrag refused — list, show, re-inject."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from streamrag.cli.common import SetOption, console, out
from streamrag.cli.common import guard as _guard
from streamrag.cli.common import settings_from as _settings
from streamrag.config import Settings
from streamrag.errors import StreamragError

__all__ = ["deadletter_app"]

deadletter_app = typer.Typer(
    help="Records streamrag refused: list them, show one, re-inject them once fixed.",
    no_args_is_help=True,
)

ConfigOption = Annotated[Path | None, typer.Option(help="YAML config file (optional).")]


def _store(config: Path | None, sets: list[str] | None) -> tuple[Settings, Any]:
    from streamrag.ingest import DeadLetterStore

    settings = _settings(config, sets, None, None)
    path = settings.dead_letter_path
    if not path.exists():
        msg = (
            f"no dead-letter store at {path}; nothing has been refused yet, or the job "
            "keeps its state elsewhere (pass the same --config / --set state_dir=... as the job)"
        )
        raise StreamragError(msg)
    return settings, DeadLetterStore(path)


@deadletter_app.command("list")
def deadletter_list(
    config: ConfigOption = None,
    sets: SetOption = None,
    stage: Annotated[str | None, typer.Option(help="Only records refused by this stage.")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (newest last).")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List refused records: id, stage, source and offset, and why.

    Example: streamrag deadletter list --stage decode --set state_dir=.streamrag
    """

    def go() -> None:
        _, store = _store(config, sets)
        rows = [e for e in store.entries() if stage is None or e.letter.stage == stage]
        shown = rows[-limit:] if limit > 0 else rows
        if as_json:
            for e in shown:
                out.print_json(json.dumps(_letter_json(e)))
            return
        table = Table(title=f"{len(rows)} dead letters in {store.path}")
        for col in ("id", "stage", "source", "offset", "reason", "replayed"):
            table.add_column(col)
        for e in shown:
            le = e.letter
            table.add_row(
                str(e.id),
                le.stage,
                Path(le.source).name,
                str(le.offset),
                le.reason[:80],
                "yes" if e.replayed_to else "",
            )
        out.print(table)
        by_stage = ", ".join(f"{k}: {v}" for k, v in sorted(store.by_stage.items())) or "none"
        console.print(f"by stage: {by_stage}")

    _guard(go)


@deadletter_app.command("show")
def deadletter_show(
    letter_id: Annotated[int, typer.Argument(help="The record's id, from `deadletter list`.")],
    config: ConfigOption = None,
    sets: SetOption = None,
) -> None:
    """Show one refused record in full, raw input included.

    Example: streamrag deadletter show 3
    """

    def go() -> None:
        _, store = _store(config, sets)
        out.print_json(json.dumps(_letter_json(store.get(letter_id))))

    _guard(go)


@deadletter_app.command("replay")
def deadletter_replay(
    ids: Annotated[list[int] | None, typer.Argument(help="Ids of records to re-inject.")] = None,
    config: ConfigOption = None,
    sets: SetOption = None,
    stage: Annotated[str | None, typer.Option(help="Re-inject every record of a stage.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(help="Re-inject these fixed JSONL records instead of the stored ones."),
    ] = None,
) -> None:
    """Re-inject records into the job: as stored, or fixed by hand (--file).

    They are written to the job's replay folder (state_dir/replay), which every
    job reads alongside its source; a running job picks them up at once. A record
    that fails again is refused again, with a new id.
    Example: streamrag deadletter list --json | jq -r .raw > fix.jsonl; (edit);
    streamrag deadletter replay --file fix.jsonl 3 4
    """

    def go() -> None:
        settings, store = _store(config, sets)
        chosen = [
            e
            for e in store.entries()
            if (ids and e.id in ids) or (stage is not None and e.letter.stage == stage)
        ]
        if ids:
            missing = set(ids) - {e.id for e in chosen}
            if missing:
                store.get(min(missing))  # raises a clear error
        if file is not None:
            lines = [ln for ln in file.read_text(encoding="utf-8").splitlines() if ln.strip()]
        else:
            if not chosen:
                msg = "nothing to re-inject: give ids, --stage STAGE or --file FIXED.jsonl"
                raise StreamragError(msg)
            cut = [e.id for e in chosen if e.letter.raw.endswith("…[cut]")]
            if cut:
                msg = (
                    f"records {cut} were stored cut (over 64 KB); fix them at their source "
                    "and re-inject them with --file"
                )
                raise StreamragError(msg)
            lines = [_raw_line(e.letter) for e in chosen]
        target = _write_replay(settings.replay_dir, lines)
        store.mark_replayed([e.id for e in chosen], target, time.time_ns() // 1000)
        console.print(
            f"re-injected {len(lines)} records through {target}; a running job reads them "
            "now, a stopped one when it starts"
        )

    _guard(go)


def _letter_json(entry: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {"id": entry.id, **asdict(entry.letter), "replayed_to": entry.replayed_to}


def _raw_line(letter: Any) -> str:
    """A stored record as one JSONL line: records are single lines already."""
    return str(letter.raw)


def _write_replay(folder: Path, lines: list[str]) -> Path:
    """Write lines to a new file in the replay folder, atomically (renamed into place)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    n = len(list(folder.glob("replay-*.jsonl")))
    target = folder / f"replay-{stamp}-{n:04d}.jsonl"
    tmp = folder / f".{target.name}.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target
