"""The audit log of committed epochs: one hash-chained, optionally signed record per epoch.

Each epoch the pipeline commits gets one **record**, a line of
``<state_dir>/audit/epochs.jsonl``: the epoch and its index generation, the
time (the injected clock), the source positions that moved, what the epoch
did (upserts, deletes, chunks, the records dead-lettered since the previous
commit, redactions by entity type), a **digest** of what it stored, the
pipeline (streamrag's version and a digest of the settings that decide what is
stored), the embedder versions that made its vectors, and the API keys that
pushed its changes (their names, never the keys). A rollback gets a record too
(``kind: rollback``, ``restored_from``); so does an index found younger than
the log says (``kind: reset``: an index that does not persist, or one rebuilt
from its sources), after which the earlier records of that generation describe
an index that is gone.

**The chain.** A record is canonical JSON — sorted keys, no whitespace, UTF-8,
JSON types only (:func:`canonical`) — and its ``hash`` is the SHA-256 of the
canonical bytes of the record without ``hash`` and ``sig``. Each record holds
the hash of the one before it (``prev``; the first holds :data:`GENESIS`) and
its place in the chain (``seq``, from 0), so a changed, removed, inserted or
reordered record breaks a link. With ``audit.hmac_key_env`` each record also
carries ``sig``, an HMAC-SHA256 of the same bytes under a secret: without the
secret nobody can write a record that verifies, not even one that recomputes
every hash.

**The digest** is a Merkle root (RFC 6962's tree hash, over the leaf hashes in
sorted order, so it does not depend on where the index keeps each row) of one
leaf per chunk the epoch stored — its document, version, source, domain and
metadata, position, embedder, content hash of its text and SHA-256 of its
vector (:func:`chunk_leaf`) — and one leaf per tombstone (:func:`tombstone_leaf`).
The committer keeps only the changes the index will store (``wants``), so the
leaves come from the :class:`~streamrag.index.base.CommitBatch` before the
commit, and ``streamrag audit verify`` computes the same leaves from the rows
the index holds with that ``committed`` epoch (:mod:`.audit_verify`).

**Never a gap, never twice.** The record is made before the commit and written
into the commit's cursor (key :data:`CURSOR_KEY`), in the same write-ahead-log
record as the documents; it is appended to the log after the commit. A crash in
between leaves it in the index's cursor, and the next start — or the next
commit — appends it (:meth:`EpochAudit.catch_up`). A record is appended only
if it follows the log's last one (``seq`` and ``prev``), so one already there is
never appended again. A rollback record is appended right after the rollback;
after a crash in between, the next start makes it again from the index's
manifest.

**Generations.** The log follows the serving generation: each record names the
generation whose epoch it is. Commits a mirror or a backfill makes into a
generation that is not serving (:mod:`.generations`) get no record; after a
switch, the records name the new generation and its epochs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec
import numpy as np
import numpy.typing as npt

import streamrag
from streamrag.batching import PendingBatch
from streamrag.changes import Op
from streamrag.chunking import content_hash
from streamrag.errors import StateError
from streamrag.index.base import (
    CommitBatch,
    CommitResult,
    ReportsRebuild,
    SupportsRollback,
    VectorIndex,
)
from streamrag.index.lsm import LsmIndex
from streamrag.index.wal import fsync_dir
from streamrag.timing import Clock, format_timestamp

if TYPE_CHECKING:
    from streamrag.runtime.pipeline import Pipeline

__all__ = [
    "CURSOR_KEY",
    "FORMAT",
    "GENESIS",
    "EpochAudit",
    "EpochAuditLog",
    "canonical",
    "chunk_leaf",
    "merkle_root",
    "record_hash",
    "settings_digest",
    "signature",
    "tombstone_leaf",
]

log = logging.getLogger("streamrag.audit")

FORMAT = 1
"""Version of the record layout."""

GENESIS = "0" * 64
"""The ``prev`` of the first record: the hash of no record."""

CURSOR_KEY = "audit_record"
"""The cursor key under which a commit carries its record (see the module docstring)."""

PIPELINE_SECTIONS = (
    "source",
    "sources",
    "ingest",
    "chunking",
    "embedder",
    "index",
    "event_time",
    "redaction",
    "schemas",
)
"""The settings sections that decide what the index stores (those present are digested)."""

_UNHASHED = ("hash", "sig")


def canonical(value: Any) -> bytes:
    r"""The canonical bytes of a JSON value: sorted keys, no whitespace, UTF-8.

    >>> canonical({"b": 1, "a": ["é", None]})
    b'{"a":["\xc3\xa9",null],"b":1}'
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _body(record: Mapping[str, Any]) -> bytes:
    return canonical({k: v for k, v in record.items() if k not in _UNHASHED})


def record_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the record's canonical bytes without ``hash`` and ``sig``."""
    return hashlib.sha256(_body(record)).hexdigest()


def signature(record: Mapping[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) of the record's canonical bytes without ``hash`` and ``sig``."""
    return hmac.new(key, _body(record), hashlib.sha256).hexdigest()


def _chain(
    body: dict[str, Any], last: Mapping[str, Any] | None, key: bytes | None
) -> dict[str, Any]:
    """``body`` as the record after ``last``: with ``seq``, ``prev``, ``hash`` (and ``sig``)."""
    body["seq"] = 0 if last is None else int(last["seq"]) + 1
    body["prev"] = GENESIS if last is None else str(last["hash"])
    body["hash"] = record_hash(body)
    if key is not None:
        body["sig"] = signature(body, key)
    return body


# -- the digest of an epoch -------------------------------------------------------


_LEAF = msgspec.json.Encoder(order="sorted")
"""Leaves are compact JSON with sorted keys too, by msgspec: a commit makes one per chunk."""


def _leaf(parts: list[Any]) -> bytes:
    return _LEAF.encode(parts)


def chunk_leaf(
    tenant: str,
    doc_id: str,
    event_time: int,
    offset: int,
    source: str,
    domain: str,
    metadata: Mapping[str, Any] | None,
    position: int,
    chunk_id: int,
    embedder: str,
    text: str,
    vector: npt.NDArray[np.float32],
) -> bytes:
    """The leaf of one stored chunk (its text by content hash, its vector by SHA-256)."""
    return _hashed_chunk_leaf(
        *(tenant, doc_id, event_time, offset, source, domain, metadata),
        *(position, chunk_id, embedder),
        content_hash(text),
        np.ascontiguousarray(vector, dtype=np.float32),
    )


def _hashed_chunk_leaf(
    tenant: str,
    doc_id: str,
    event_time: int,
    offset: int,
    source: str,
    domain: str,
    metadata: Mapping[str, Any] | None,
    position: int,
    chunk_id: int,
    embedder: str,
    text_hash: bytes,
    vector: npt.NDArray[np.float32],
) -> bytes:
    """:func:`chunk_leaf` of a text already hashed, and of a C-contiguous float32 vector."""
    return _leaf(
        [
            "chunk",
            *(tenant, doc_id, int(event_time), int(offset), source, domain),
            dict(metadata) if metadata else None,
            *(int(position), int(chunk_id), embedder),
            text_hash.hex(),
            hashlib.sha256(vector.data).hexdigest(),
        ]
    )


def tombstone_leaf(tenant: str, doc_id: str, event_time: int, offset: int) -> bytes:
    """The leaf of one stored tombstone (a delete, or an upsert with no chunks).

    The index keeps no source for a tombstone, so its leaf has none.
    """
    return _leaf(["tombstone", tenant, doc_id, int(event_time), int(offset)])


def merkle_root(leaves: Iterable[bytes]) -> str:
    """RFC 6962's Merkle tree hash (hex) over the distinct leaves, in sorted order.

    Leaves hash as ``SHA-256(0x00 | leaf)`` and nodes as ``SHA-256(0x01 | left |
    right)``; an odd node moves up a level unchanged. No leaf: SHA-256 of nothing.

    >>> merkle_root([b"a", b"b"]) == merkle_root([b"b", b"a", b"a"])
    True
    """
    level = sorted(hashlib.sha256(b"\x00" + leaf).digest() for leaf in set(leaves))
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def digest(chunks: Collection[bytes], tombstones: Collection[bytes]) -> dict[str, Any]:
    """An epoch's digest: the Merkle root over its leaves, and how many of each kind."""
    chunk_set, tomb_set = set(chunks), set(tombstones)
    return {
        "root": merkle_root(chunk_set | tomb_set),
        "chunks": len(chunk_set),
        "tombstones": len(tomb_set),
    }


def batch_leaves(batch: CommitBatch) -> tuple[list[bytes], list[bytes]]:
    """The chunk and tombstone leaves of what ``batch`` stores (see the module docstring).

    The bytes of :func:`chunk_leaf` for each chunk, with its text taken by the
    content hash the batch carries for it (the chunk stage made it from that
    text; ``audit verify`` computes it again from the stored text). Made per
    document: its fields are converted once, and each chunk adds only its own
    (position, id, embedder, hashes) to a copy of the document's part. The
    vectors are hashed row by row from one copy of the matrix as bytes.
    """
    chunks: list[bytes] = []
    tombs: list[bytes] = []
    texts, hashes = batch.texts, batch.hashes
    by_hash = len(hashes) == len(texts)
    vectors = np.ascontiguousarray(batch.vectors, dtype=np.float32)
    row_bytes = vectors.shape[1] * 4 if vectors.ndim == 2 else 0
    raw = memoryview(vectors.tobytes()) if row_bytes else memoryview(b"")  # sliced, not copied
    positions = np.asarray(batch.positions).tolist()
    ids = np.asarray(batch.chunk_ids).tolist()
    made_by = batch.embedders(range(len(texts)))
    encode, sha256 = _LEAF.encode, hashlib.sha256
    for d in batch.docs:
        if d.op == Op.DELETE or d.n_chunks == 0:  # the index keeps either as a tombstone
            tombs.append(tombstone_leaf(d.tenant, d.doc_id, d.event_time, d.offset))
            continue
        head = [
            "chunk",
            *(d.tenant, d.doc_id, int(d.event_time), int(d.offset), d.source, d.domain),
            dict(d.metadata) if d.metadata else None,
        ]
        for r in range(d.first_chunk, d.first_chunk + d.n_chunks):
            text_hash = hashes[r] if by_hash else content_hash(texts[r])
            vector = raw[r * row_bytes : (r + 1) * row_bytes]
            chunks.append(
                encode(
                    [
                        *head,
                        *(int(positions[r]), int(ids[r]), made_by[r]),
                        text_hash.hex(),
                        sha256(vector).hexdigest(),
                    ]
                )
            )
    return chunks, tombs


def settings_digest(dump: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the settings sections that decide what is stored (a JSON dump)."""
    picked = {k: dump[k] for k in PIPELINE_SECTIONS if k in dump}
    return hashlib.sha256(canonical(picked)).hexdigest()


def pipeline_identity(dump: Mapping[str, Any]) -> dict[str, str]:
    """What a record says about the pipeline: the package version and the settings digest."""
    return {"version": streamrag.__version__, "settings": settings_digest(dump)}


# -- the file -----------------------------------------------------------------------


class EpochAuditLog:
    """The JSONL file of records: appended and fsynced one line at a time.

    Opening it cuts off a torn last line (a crash in the middle of an append;
    that record is still in the index's cursor and is appended again) and reads
    the last record, which the next one links to. The file is opened for each
    append and closed after it (a commit's fsync costs far more).
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self.lock = threading.Lock()
        self.last: dict[str, Any] | None = None
        """The last record appended (None for an empty log)."""
        self._warned: set[str] = set()
        path.parent.mkdir(parents=True, exist_ok=True)
        created = not path.exists()
        with open(path, "a+b") as fh:
            self._load_tail(fh)
        if created and fsync:
            fsync_dir(path.parent)

    def _load_tail(self, fh: BinaryIO) -> None:
        size = fh.seek(0, os.SEEK_END)
        if not size:
            return
        tail = b""
        pos = size
        while pos > 0 and tail.count(b"\n") < 2:
            step = min(pos, 1 << 16)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
        if not tail.endswith(b"\n"):
            keep = size - (len(tail) - tail.rfind(b"\n") - 1)
            log.warning(
                "epoch audit log %s: cut off a torn last line (%d bytes) left by a crash in the "
                "middle of an append; its record is appended again from the index",
                self.path,
                size - keep,
            )
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
            tail = tail[: tail.rfind(b"\n") + 1]
        lines = tail.splitlines()
        if not lines:
            return
        last = _last_record(lines[-1])
        if last is None:
            msg = (
                f"the last record of the epoch audit log {self.path} cannot be read, so the next "
                "record cannot link to it; run `streamrag audit verify` to see what is damaged, "
                "then move the log aside to start a new chain"
            )
            raise StateError(msg) from None
        self.last = last

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line and make it durable (call holding :attr:`lock`)."""
        line = canonical(record) + b"\n"
        try:
            with open(self.path, "ab") as fh:
                start = fh.seek(0, os.SEEK_END)
                try:
                    fh.write(line)
                    fh.flush()
                    if self.fsync:
                        os.fsync(fh.fileno())
                except OSError:
                    fh.truncate(start)  # a partial line would hide the records after it
                    raise
        except OSError as exc:
            msg = (
                f"cannot write the epoch audit log {self.path}: {exc}; the commit is retried "
                "and its record appended once the log can be written"
            )
            raise StateError(msg) from exc
        self.last = dict(record)

    def ensure(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` if it is the next one; True if it was appended.

        One already in the log (its ``seq`` is not past the last one's) is left
        alone; one that does not link to the last record is refused with a
        warning, since appending it would break the chain.
        """
        with self.lock:
            last = self.last
            last_seq = -1 if last is None else int(last["seq"])
            last_hash = GENESIS if last is None else str(last["hash"])
            seq = int(record.get("seq", -1))
            if seq <= last_seq:
                return False
            follows = seq == last_seq + 1 and record.get("prev") == last_hash
            if follows and record_hash(record) == record.get("hash"):
                self.append(record)
                return True
            key = str(record.get("hash"))
            if key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "the index holds the audit record of epoch %s (seq %s), which does not "
                    "follow the last record of %s (seq %d); it is not appended, and "
                    "`streamrag audit verify` will report the epochs the log lacks",
                    record.get("epoch"),
                    seq,
                    self.path,
                    last_seq,
                )
            return False


# -- the pipeline's side -------------------------------------------------------------


class EpochAudit:
    """Makes each epoch's record before its commit and appends it after (module docstring).

    ``generation`` says which index generation serves; ``pipeline`` is what
    :func:`pipeline_identity` gives; ``key`` signs records when set.
    """

    def __init__(
        self,
        log_file: EpochAuditLog,
        *,
        clock: Clock,
        generation: Callable[[], int],
        pipeline: Mapping[str, str],
        key: bytes | None = None,
    ) -> None:
        self.log = log_file
        self.clock = clock
        self.generation = generation
        self.pipeline = dict(pipeline)
        self.key = key

    def attach(self, pipeline: Pipeline) -> None:
        """Seal every commit of ``pipeline`` and append its record after; catch up first."""
        pipeline.committer.seal = self.seal
        pipeline.on_commit.append(self.committed)
        self.catch_up(pipeline.index)

    def seal(self, batch: CommitBatch, pending: PendingBatch, index: VectorIndex) -> CommitBatch:
        """``batch`` with its epoch's record in its cursor (called just before the commit)."""
        self._append_held(index)  # a previous record that missed its append goes first
        record = self._chained(self._commit_body(batch, pending, index))
        return replace(batch, cursor={**(batch.cursor or {}), CURSOR_KEY: record})

    def committed(self, batch: CommitBatch, result: CommitResult) -> None:
        """After the commit: append the record it carries."""
        record = (batch.cursor or {}).get(CURSOR_KEY)
        if not isinstance(record, Mapping):
            return
        if record.get("epoch") != result.epoch:
            log.error(
                "the audit record made for epoch %s was committed as epoch %d (another writer "
                "committed in between); it is not appended",
                record.get("epoch"),
                result.epoch,
            )
            return
        self.log.ensure(record)

    def catch_up(self, index: VectorIndex) -> None:
        """On start: append what the index holds and the log lacks (module docstring)."""
        self._append_held(index)
        last = self.log.last
        if last is None or last.get("generation") != self.generation():
            return
        if index.epoch < int(last["epoch"]):
            self._append(self._reset_body(index, int(last["epoch"])))
            return
        if isinstance(index, LsmIndex):
            man = index.pin()
            if man.restored_from is not None and man.epoch == int(last["epoch"]) + 1:
                self._append(self._rollback_body(index, man.restored_from))

    def rollback(self, index: VectorIndex, epoch: int) -> int:
        """Roll ``index`` back to ``epoch`` and record it; returns the new epoch.

        Call it between two commits (holding the committer's lock).
        """
        assert isinstance(index, SupportsRollback)
        self._append_held(index)
        before = index.epoch
        try:
            return index.rollback(epoch)
        finally:
            # Published (even if its checkpoint then failed): the next epoch links to it.
            if index.epoch != before:
                self._append(self._rollback_body(index, epoch))

    def status(self) -> dict[str, Any]:
        """The log's file and last record (for ``/v1/status``)."""
        last = self.log.last
        return {
            "path": str(self.log.path),
            "records": 0 if last is None else int(last["seq"]) + 1,
            "last_epoch": None if last is None else last.get("epoch"),
            "last_hash": None if last is None else last.get("hash"),
            "signed": self.key is not None,
        }

    # -- records ---------------------------------------------------------------

    def _append_held(self, index: VectorIndex) -> None:
        held = (index.cursor or {}).get(CURSOR_KEY)
        if isinstance(held, Mapping):
            self.log.ensure(held)

    def _append(self, body: dict[str, Any]) -> None:
        with self.log.lock:
            self.log.append(_chain(body, self.log.last, self.key))

    def _chained(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.log.lock:
            return _chain(body, self.log.last, self.key)

    def _head(self, kind: str, epoch: int, now: int) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": kind,
            "epoch": epoch,
            "generation": self.generation(),
            "time_us": now,
            "time": format_timestamp(now),
            "pipeline": self.pipeline,
        }

    def _commit_body(
        self, batch: CommitBatch, pending: PendingBatch, index: VectorIndex
    ) -> dict[str, Any]:
        cursor = batch.cursor or {}
        before = (index.cursor or {}).get("stats") or {}
        letters = int((cursor.get("stats") or {}).get("dead_lettered", 0))
        letters -= int(before.get("dead_lettered", 0))
        positions = dict(cursor.get("positions") or {})
        for key, value in cursor.items():
            if key.startswith("position:"):
                positions[key[len("position:") :]] = value
        payloads = pending.changes.payloads
        upserts = sum(1 for d in batch.docs if d.op == Op.UPSERT)
        chunks, tombs = batch_leaves(batch)
        body = self._head("commit", index.epoch + 1, self.clock.now_us())
        body["positions"] = positions
        body["counts"] = {
            "changes": len(pending.changes),
            "upserts": upserts,
            "deletes": len(batch.docs) - upserts,
            "chunks": len(batch.texts),
            "dead_lettered": letters,
            "redactions": _redactions(payloads),
        }
        body["digest"] = digest(chunks, tombs)
        used = batch.embedders(range(len(batch.texts)))
        body["embedders"] = {"configured": batch.embedder_version, "used": sorted(set(used))}
        body["pushed_by"] = sorted({str(p["pushed_by"]) for p in payloads if p.get("pushed_by")})
        return body

    def _rollback_body(self, index: VectorIndex, restored_from: int) -> dict[str, Any]:
        # The time the index gave the rollback's epoch: the same when a restart makes it again.
        body = self._head("rollback", index.epoch, index.stats().committed_at_us)
        body["restored_from"] = restored_from
        return body

    def _reset_body(self, index: VectorIndex, logged: int) -> dict[str, Any]:
        body = self._head("reset", index.epoch, self.clock.now_us())
        body["previous_epoch"] = logged
        rebuilt = index.rebuilt if isinstance(index, ReportsRebuild) else None
        if rebuilt:
            body["reason"] = f"rebuilt from the sources: {rebuilt.get('reason', '')}"
        else:
            body["reason"] = (
                f"the index holds epoch {index.epoch}, the log's last record epoch {logged}: "
                "the index does not persist, was deleted, or lost commits"
            )
        return body


def _last_record(line: bytes) -> dict[str, Any] | None:
    """The record a line holds, if it is one the next record can link to."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("hash"), str):
        return None
    if not isinstance(rec.get("seq"), int):
        return None
    return rec


def _redactions(payloads: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Redactions by entity type, summed over the changes' ``payload["redactions"]``."""
    total: Counter[str] = Counter()
    for p in payloads:
        found = p.get("redactions")
        if isinstance(found, Mapping):
            for kind, n in found.items():
                if isinstance(n, int) and not isinstance(n, bool):
                    total[str(kind)] += n
    return dict(sorted(total.items()))
