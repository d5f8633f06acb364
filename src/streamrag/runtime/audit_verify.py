"""Checking the epoch audit log: its chain, its signatures, and the index against its digests.

:func:`verify` reads the log and checks, record by record, that each one
hashes to its ``hash``, links to the one before (``prev``, ``seq``), carries a
valid signature when a secret is given, and that the epochs of a generation
follow one another. Then it opens each generation's index **read-only** — a
private snapshot: the immutable files hard-linked, the write-ahead log copied,
so opening it never touches the job's files — and recomputes every epoch's
digest from the rows the index holds with that ``committed`` epoch and the
tombstones it logged, exactly the leaves the record was made from
(:mod:`.audit`). It also checks each stored chunk's text against its content
hash, naming the chunk when they differ.

Not every epoch can be checked. Compaction drops rows no readable version can
see any more (history before ``index.retention_s``, epochs a rollback undid):
an epoch before the oldest readable one, or undone, whose stored leaves are
fewer than its record says is **not verifiable**, not broken. So are the
records of an index that was reset (rebuilt, or not persistent) and of a
generation whose index was dropped. A file of the index that fails its
checksum is a finding naming the file.

The log is read before the snapshot is taken and again after, so a job that
keeps committing meanwhile is no false alarm: every record read before holds
an epoch the snapshot has, and an epoch newer than the last record is either
the one record the index still holds for its append (a crash between the
commit and the append; the next start appends it) or a finding.
"""

from __future__ import annotations

import hmac
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from streamrag.chunking import content_hash
from streamrag.errors import CorruptStateError, StateError
from streamrag.index.lsm import LsmIndex, LsmSpec
from streamrag.index.manifest import Manifest
from streamrag.index.store import read_manifest
from streamrag.index.wal import WriteAheadLog, read_records
from streamrag.runtime.audit import (
    CURSOR_KEY,
    GENESIS,
    chunk_leaf,
    digest,
    record_hash,
    signature,
    tombstone_leaf,
)

__all__ = ["Finding", "Logged", "Report", "read_log", "verify"]

_KINDS = ("commit", "rollback", "reset")
_REQUIRED = ("seq", "prev", "hash", "kind", "epoch", "generation")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that does not hold: where (line of the log, epoch) and what differs."""

    what: str
    line: int | None = None
    epoch: int | None = None

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.epoch is not None:
            where.append(f"epoch {self.epoch}")
        return f"{', '.join(where)}: {self.what}" if where else self.what


@dataclass(frozen=True, slots=True)
class Logged:
    """A record of the log and the line it is on (1-based)."""

    line: int
    record: dict[str, Any]

    @property
    def epoch(self) -> int:
        """The record's epoch."""
        return int(self.record["epoch"])

    @property
    def generation(self) -> int:
        """The index generation the record's epoch belongs to."""
        return int(self.record["generation"])


@dataclass
class Report:
    """What :func:`verify` found."""

    records: int = 0
    epochs_checked: int = 0
    """Commit records whose digest the index's rows reproduce."""
    signatures_checked: int = 0
    signatures_unchecked: int = 0
    """Signed records read without the secret."""
    not_verifiable: dict[str, list[int]] = field(default_factory=dict)
    """Epochs whose chunks the index no longer holds in full, by reason."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was found broken."""
        return not self.findings

    def unverifiable(self, reason: str, epoch: int) -> None:
        """Note ``epoch`` as not verifiable, for ``reason``."""
        self.not_verifiable.setdefault(reason, []).append(epoch)


def read_log(path: Path) -> tuple[list[bytes], bool]:
    """The log's whole lines, and whether a torn last line (no newline) followed them."""
    data = path.read_bytes()
    torn = bool(data) and not data.endswith(b"\n")
    lines = data.split(b"\n")
    return lines[:-1], torn


def verify(
    log_path: Path,
    *,
    index_dir: Callable[[int], Path] | None,
    spec: LsmSpec,
    key: bytes | None = None,
    serving: int = 1,
    created: Mapping[int, int] | None = None,
) -> Report:
    """Check the log at ``log_path``, and the index against it.

    ``index_dir`` gives each generation's index directory (None when the index
    does not persist); ``serving`` is the generation serving now; ``key`` the
    signing secret; ``created`` when each generation listed in the book was
    made (a number is given again after its generation is dropped: the records
    of the dropped one are older than the new one).
    """
    report = Report()
    if not log_path.exists():
        report.findings.append(Finding(f"there is no epoch audit log at {log_path}"))
        return report
    before, _ = read_log(log_path)
    generations = sorted({r.generation for r in _parse_all(before)})
    snapshots: dict[int, tuple[LsmIndex | None, str]] = {}
    with _Snapshots(index_dir, spec, report) as snaps:
        for g in generations:
            snapshots[g] = snaps.open(g)
        lines, torn = read_log(log_path)  # again: what was appended while the snapshots were made
        records = check_chain(lines, key, report)
        if torn:
            report.notes.append(
                "the last line is torn (a crash in the middle of an append): the job's next start "
                "cuts it off and appends that record again from the index"
            )
        for g, (index, why) in sorted(snapshots.items()):
            mine = [r for r in records if r.generation == g]
            made = (created or {}).get(g, 0) if g > 1 else 0
            earlier = {r.line for r in mine if int(r.record.get("time_us", 0)) < made}
            if index is None or earlier:
                for r in mine:
                    if r.record["kind"] == "commit" and (index is None or r.line in earlier):
                        report.unverifiable(why or f"of a generation {g} since dropped", r.epoch)
                mine = [r for r in mine if r.line not in earlier]
            if index is not None:
                check_generation(mine, index, report, read_before=len(before))
                if g == serving:
                    check_tail(records, mine, index, report)
    return report


def _parse_all(lines: list[bytes]) -> list[Logged]:
    out = []
    for n, raw in enumerate(lines, 1):
        rec = _parse(raw)
        if rec is not None:
            out.append(Logged(n, rec))
    return out


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rec, dict) or any(k not in rec for k in _REQUIRED):
        return None
    try:
        int(rec["epoch"]), int(rec["generation"]), int(rec["seq"])
    except (TypeError, ValueError):
        return None
    return rec


# -- the chain ------------------------------------------------------------------------


def check_chain(lines: list[bytes], key: bytes | None, report: Report) -> list[Logged]:
    """Hashes, links, signatures and epoch order of every record; the records read."""
    out: list[Logged] = []
    prev: Logged | None = None
    prev_hash: str | None = GENESIS
    last_epoch: dict[int, int] = {}
    for n, raw in enumerate(lines, 1):
        report.records += 1
        rec = _parse(raw)
        if rec is None:
            report.findings.append(Finding("not a whole record (a damaged or foreign line)", n))
            prev, prev_hash = None, None
            continue
        item = Logged(n, rec)
        _check_links(item, prev, prev_hash, report)
        _check_signature(item, key, report)
        g, epoch, kind = item.generation, item.epoch, rec["kind"]
        if kind not in _KINDS:
            report.findings.append(Finding(f"unknown record kind {kind!r}", n, epoch))
        held = last_epoch.get(g)
        same_run = prev is not None and prev.generation == g
        if kind != "reset" and same_run and held is not None and epoch != held + 1:
            report.findings.append(
                Finding(
                    f"generation {g}'s epochs jump from {held} to {epoch}: the records of the "
                    "epochs between are missing",
                    n,
                    epoch,
                )
            )
        last_epoch[g] = epoch
        out.append(item)
        prev, prev_hash = item, str(rec["hash"])
    return out


def _check_links(item: Logged, prev: Logged | None, prev_hash: str | None, report: Report) -> None:
    rec, n = item.record, item.line
    computed = record_hash(rec)
    if rec["hash"] != computed:
        report.findings.append(
            Finding(
                f"the record does not hash to its hash ({str(rec['hash'])[:16]}…; its contents "
                f"hash to {computed[:16]}…): it was changed after it was written",
                n,
                item.epoch,
            )
        )
    want_seq = 0 if n == 1 else (None if prev is None else int(prev.record["seq"]) + 1)
    if prev_hash is not None and rec["prev"] != prev_hash:
        before = "a first record links to" if prev is None else f"line {prev.line} hashes to"
        report.findings.append(
            Finding(
                f"it links to {str(rec['prev'])[:16]}…, but {before} {prev_hash[:16]}…: "
                "a record before it was changed, removed or inserted",
                n,
                item.epoch,
            )
        )
    elif want_seq is not None and int(rec["seq"]) != want_seq:
        report.findings.append(
            Finding(
                f"its seq is {rec['seq']} where {want_seq} follows: records were removed or "
                "inserted",
                n,
                item.epoch,
            )
        )


def _check_signature(item: Logged, key: bytes | None, report: Report) -> None:
    rec = item.record
    if key is None:
        report.signatures_unchecked += "sig" in rec
        return
    if "sig" not in rec:
        report.findings.append(
            Finding("the record is not signed, but the log is checked with a secret", item.line)
        )
    elif not hmac.compare_digest(str(rec["sig"]), signature(rec, key)):
        report.findings.append(
            Finding(
                "its signature does not match: written without the secret, or changed",
                item.line,
                item.epoch,
            )
        )
    else:
        report.signatures_checked += 1


# -- the index ----------------------------------------------------------------------


class _Snapshots:
    """Read-only snapshots of each generation's index (removed on exit)."""

    def __init__(self, index_dir: Callable[[int], Path] | None, spec: LsmSpec, report: Report):
        self.index_dir = index_dir
        self.spec = replace(spec, wal_fsync=False)
        self.report = report
        self._open: list[tuple[LsmIndex, Path]] = []

    def __enter__(self) -> _Snapshots:
        return self

    def __exit__(self, *exc: object) -> None:
        for index, tmp in self._open:
            index.abandon()
            shutil.rmtree(tmp, ignore_errors=True)

    def open(self, generation: int) -> tuple[LsmIndex | None, str]:
        """Generation ``generation``'s index as a snapshot; or None, and why there is none."""
        if self.index_dir is None:
            return None, "the index does not persist (index.kind: exact, or index.persist: false)"
        path = self.index_dir(generation)
        if not path.is_dir():
            return None, f"generation {generation}'s index is not there (dropped, or moved)"
        unreadable = f"generation {generation}'s index cannot be opened: see the finding"
        try:
            dim = _dim_of(path) or 1  # an empty index: any length opens it
            tmp = _snapshot(path)
        except CorruptStateError as exc:
            self.report.findings.append(Finding(str(exc)))
            return None, unreadable
        try:
            index = LsmIndex(dim, self.spec, path=tmp, background=False)
        except CorruptStateError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            self.report.findings.append(Finding(str(exc).replace(str(tmp), str(path))))
            return None, unreadable
        self._open.append((index, tmp))
        return index, ""


def _dim_of(path: Path) -> int | None:
    """The vector length the index in ``path`` holds (None: it holds nothing yet)."""
    manifests = sorted(path.glob("manifest-*.json"))
    if manifests:
        return int(read_manifest(manifests[-1])["dim"])
    for _, wal in WriteAheadLog.files(path):
        records, _ = read_records(wal)
        if records:
            return int(records[0].batch.vectors.shape[1])
    return None


def _snapshot(path: Path) -> Path:
    """A private copy of the index directory: files hard-linked, the log copied.

    Retried while a running job's checkpoint changes the files under it.
    """
    for _ in range(5):
        names = sorted(p.name for p in path.iterdir() if p.is_file())
        tmp = _private_dir(path.parent)
        try:
            for name in names:
                _take(path / name, tmp / name, copy=name.startswith("wal-"))
        except FileNotFoundError:
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        if sorted(p.name for p in path.iterdir() if p.is_file()) == names:
            return tmp
        shutil.rmtree(tmp, ignore_errors=True)
    msg = f"the index in {path} kept changing while it was read; verify again, or stop the job"
    raise StateError(msg)


def _private_dir(near: Path) -> Path:
    """A new directory beside the index (hard links need one file system), else in /tmp."""
    try:
        return Path(tempfile.mkdtemp(prefix=".audit-snapshot-", dir=near))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="streamrag-audit-"))


def _take(src: Path, dst: Path, *, copy: bool) -> None:
    if not copy:  # written once, by rename, never changed in place: a link is a snapshot
        try:
            os.link(src, dst)
            return
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
    shutil.copyfile(src, dst)


def stored_leaves(index: LsmIndex, report: Report) -> dict[int, tuple[set[bytes], set[bytes]]]:
    """Every epoch's chunk and tombstone leaves, from what the index holds."""
    out: dict[int, tuple[set[bytes], set[bytes]]] = {}
    changed: set[tuple[str, str, int, int]] = set()  # a copy of a changed row is reported once
    for rows in index.stored_rows():
        for i in range(len(rows)):
            text = rows.texts[i]
            epoch = int(rows.committed[i])
            where = (rows.tenants[i], rows.doc_ids[i], int(rows.positions[i]), epoch)
            if content_hash(text) != rows.hashes[i] and where not in changed:
                changed.add(where)
                report.findings.append(
                    Finding(
                        f"chunk {rows.positions[i]} of {rows.tenants[i]}/{rows.doc_ids[i]} holds a "
                        "text that does not match its content hash: the stored text was changed",
                        epoch=epoch,
                    )
                )
            leaf = chunk_leaf(
                *(rows.tenants[i], rows.doc_ids[i], int(rows.valid_from[i]), int(rows.offsets[i])),
                *(rows.sources[i], rows.domains[i], rows.metadata[i]),
                *(int(rows.positions[i]), int(rows.chunk_ids[i]), rows.embedders[i]),
                text,
                rows.vectors[i],
            )
            out.setdefault(epoch, (set(), set()))[0].add(leaf)
    for tenant, doc_id, event_time, offset, epoch in index.stored_deletes():
        leaf = tombstone_leaf(tenant, doc_id, event_time, offset)
        out.setdefault(int(epoch), (set(), set()))[1].add(leaf)
    return out


def _removed_why(man: Manifest, epoch: int) -> str | None:
    """Why compaction may have dropped rows of ``epoch`` (None: it never drops them)."""
    if epoch < man.epoch_floor:
        return "older than the retained history (index.retention_s): compaction dropped its rows"
    for lo, hi in man.rolled_back:
        if lo <= epoch <= hi:
            return "undone by a rollback: compaction dropped its rows"
    return None


def check_generation(
    records: list[Logged], index: LsmIndex, report: Report, *, read_before: int
) -> None:
    """Each record of one generation against that generation's index."""
    resets = [r.line for r in records if r.record["kind"] == "reset"]
    commits = [r for r in records if r.record["kind"] == "commit"]
    current = [r for r in commits if not resets or r.line > resets[-1]]
    for r in commits:
        if resets and r.line < resets[-1]:
            report.unverifiable("the index was reset (rebuilt) after it", r.epoch)
    man = index.pin()
    leaves = stored_leaves(index, report)
    for r in current:
        _check_digest(r, man, leaves, report, read_before=read_before)
    for r in records:
        if r.record["kind"] == "rollback" and (not resets or r.line > resets[-1]):
            undone = (int(r.record.get("restored_from", -1)) + 1, r.epoch - 1)
            if r.epoch <= man.epoch and undone not in man.rolled_back:
                report.findings.append(
                    Finding(
                        f"the record says epochs {undone[0]}–{undone[1]} were rolled back, but "
                        f"the index lists no such rollback",
                        r.line,
                        r.epoch,
                    )
                )


def _check_digest(
    r: Logged,
    man: Manifest,
    leaves: dict[int, tuple[set[bytes], set[bytes]]],
    report: Report,
    *,
    read_before: int,
) -> None:
    epoch = r.epoch
    if epoch > man.epoch:
        if r.line <= read_before:
            report.findings.append(
                Finding(
                    f"the index holds epochs up to {man.epoch} only: it lost committed epochs "
                    "(a damaged or missing write-ahead log)",
                    r.line,
                    epoch,
                )
            )
        return  # committed while the snapshot was taken: checked next time
    chunks, tombs = leaves.get(epoch, (set(), set()))
    held = digest(chunks, tombs)
    want = r.record.get("digest") or {}
    if held["root"] == want.get("root"):
        report.epochs_checked += 1
        return
    fewer = held["chunks"] <= want.get("chunks", 0) and held["tombstones"] <= want.get(
        "tombstones", 0
    )
    why = _removed_why(man, epoch)
    if why is not None and fewer:
        report.unverifiable(why, epoch)
        return
    if held["chunks"] != want.get("chunks") or held["tombstones"] != want.get("tombstones"):
        what = (
            f"the index holds {held['chunks']} chunks and {held['tombstones']} tombstones of "
            f"it; the record says {want.get('chunks')} and {want.get('tombstones')}"
        )
    else:
        what = (
            f"the index holds as many chunks and tombstones as the record says, but their "
            f"contents differ (Merkle root {held['root'][:16]}…, recorded "
            f"{str(want.get('root'))[:16]}…): a stored chunk was changed"
        )
    report.findings.append(Finding(what, r.line, epoch))


def check_tail(
    all_records: list[Logged], mine: list[Logged], index: LsmIndex, report: Report
) -> None:
    """Epochs of the serving index newer than its last record: pending, or missing."""
    man = index.pin()
    logged = mine[-1].epoch if mine else None
    if logged is None or man.epoch <= logged or all_records[-1].generation != mine[-1].generation:
        return
    last = all_records[-1].record
    held = (index.cursor or {}).get(CURSOR_KEY)
    pending = (
        isinstance(held, dict)
        and held.get("epoch") == man.epoch == logged + 1
        and held.get("prev") == last["hash"]
        and held.get("hash") == record_hash(held)
    )
    if pending:
        report.notes.append(
            f"epoch {man.epoch}'s record is held in the index and not yet in the log (a stop "
            "between the commit and its append); the job's next start appends it"
        )
    elif man.restored_from is not None and man.epoch == logged + 1:
        report.notes.append(
            f"epoch {man.epoch} is a rollback whose record is not in the log yet; the job's next "
            "start appends it"
        )
    else:
        report.findings.append(
            Finding(
                f"the index holds epochs {logged + 1}–{man.epoch}, which have no record: the "
                "log lost its last records (if the job is running, verify again)",
                epoch=logged + 1,
            )
        )
