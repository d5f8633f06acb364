"""The write-ahead log: every commit since the last checkpoint, durable before it is visible.

A commit appends one record — the micro-batch as it arrived, with its epoch,
commit time and the stream cursor it advances to — and fsyncs it before the new
epoch is published. Replaying the records after the last checkpoint through the
same commit logic rebuilds the growing segments and every tombstone exactly, so
the log is all the growing segments need to survive a crash — and the last
record's cursor says where the stream resumes.

A record is framed as ``length (u32) | crc32 (u32) | payload (msgpack)``. A
crash in the middle of an append leaves a torn last record: its length runs
past the end of the file or its checksum does not match, and no whole record
follows it. Replay cuts the file back to the last whole record (logged, and
counted in ``torn_tails``) so that new records follow it cleanly — that record
was never acknowledged. A bad record *followed by* whole ones is something
else: the file was damaged after it was written (a flipped byte, a bad disk).
The records after it were acknowledged and cannot be applied without it, so
replay refuses (:class:`~streamrag.errors.CorruptStateError`, naming the file
and the byte) instead of dropping them silently.

The log is a series of files ``wal-<first epoch>.log``; a checkpoint starts a
new file and deletes the ones whose records it covers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from streamrag.changes import Op
from streamrag.errors import CorruptStateError, IndexStoreError
from streamrag.index.base import CommitBatch, DocOp

__all__ = ["WalRecord", "WriteAheadLog", "fsync_dir"]

log = logging.getLogger("streamrag.index")

_HEADER = struct.Struct("<II")


def _as_plain(obj: Any) -> Any:
    """A mapping that is not a dict (a read-only view of metadata) is written as one."""
    if isinstance(obj, Mapping):
        return dict(obj)
    msg = f"cannot write a {type(obj).__name__} into the write-ahead log"
    raise IndexStoreError(msg)


_encode = msgspec.msgpack.Encoder(enc_hook=_as_plain).encode
_decode = msgspec.msgpack.Decoder().decode


@dataclass(frozen=True, slots=True)
class WalRecord:
    """One logged commit."""

    epoch: int
    committed_at_us: int
    batch: CommitBatch


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_record(epoch: int, committed_at_us: int, batch: CommitBatch) -> bytes:
    """A framed record for one commit.

    Each document is the array of its :class:`~streamrag.index.base.DocOp` fields.
    """
    payload = _encode(
        {
            "e": epoch,
            "t": committed_at_us,
            "docs": batch.docs,
            "ids": np.ascontiguousarray(batch.chunk_ids, dtype=np.int64).tobytes(),
            "pos": np.ascontiguousarray(batch.positions, dtype=np.int32).tobytes(),
            "texts": batch.texts,
            "hashes": batch.hashes,
            "vec": np.ascontiguousarray(batch.vectors, dtype=np.float32).tobytes(),
            "dim": int(batch.vectors.shape[1]) if batch.vectors.ndim == 2 else 0,
            "emb": batch.embedder_version,
            "embs": list(batch.chunk_embedders) if batch.chunk_embedders is not None else None,
            "cur": dict(batch.cursor) if batch.cursor is not None else None,
        }
    )
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes) -> WalRecord:
    """The commit a record's payload holds."""
    obj: dict[str, Any] = _decode(payload)
    docs = [
        DocOp(t, d, Op(op), et, off, src, dom, first, n, md)
        for t, d, op, et, off, src, dom, first, n, md in obj["docs"]
    ]
    dim = obj["dim"]
    vectors = np.frombuffer(obj["vec"], dtype=np.float32)
    batch = CommitBatch(
        docs=docs,
        chunk_ids=np.frombuffer(obj["ids"], dtype=np.int64).copy(),
        positions=np.frombuffer(obj["pos"], dtype=np.int32).copy(),
        texts=list(obj["texts"]),
        hashes=list(obj["hashes"]),
        vectors=vectors.reshape(-1, dim).copy() if dim else np.zeros((0, 0), np.float32),
        embedder_version=obj["emb"],
        chunk_embedders=obj.get("embs"),
        cursor=obj.get("cur"),
    )
    return WalRecord(obj["e"], obj["t"], batch)


def _whole_at(data: bytes, pos: int) -> int | None:
    """The end of a whole record that starts at ``pos``, or None."""
    if pos + _HEADER.size > len(data):
        return None
    length, crc = (int(x) for x in _HEADER.unpack_from(data, pos))
    start = pos + _HEADER.size
    if length == 0 or start + length > len(data):
        return None  # a real record is never empty; zeros are not one
    if zlib.crc32(data[start : start + length]) != crc:
        return None
    return start + length


def _next_whole(data: bytes, bad: int) -> int | None:
    """Where a whole record starts after the bad one at ``bad``, if any does.

    The bad record's own length is tried first (a flipped byte in its payload
    leaves it right), then every later byte.
    """
    if bad + _HEADER.size <= len(data):
        length = int(_HEADER.unpack_from(data, bad)[0])
        nxt = bad + _HEADER.size + length
        if nxt < len(data) and _whole_at(data, nxt) is not None:
            return nxt
    for pos in range(bad + 1, len(data) - _HEADER.size + 1):
        if _whole_at(data, pos) is not None:
            return pos
    return None


def read_records(path: Path) -> tuple[list[WalRecord], int]:
    """Every whole record of one file, and the byte length they occupy.

    Stops at a torn tail; raises :class:`CorruptStateError` at a bad record that
    whole records follow.
    """
    data = path.read_bytes()
    records: list[WalRecord] = []
    pos = 0
    while pos + _HEADER.size <= len(data):
        end = _whole_at(data, pos)
        if end is None:
            later = _next_whole(data, pos)
            if later is not None:
                detail = (
                    f"the record at byte {pos} fails its CRC-32 and whole records follow it "
                    f"(the next at byte {later}); they were acknowledged and cannot be applied "
                    "without it"
                )
                raise CorruptStateError(path, detail)
            break  # a torn write: the record was never acknowledged
        try:
            records.append(decode_payload(data[pos + _HEADER.size : end]))
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorruptStateError(
                path, f"the record at byte {pos} does not decode ({exc})"
            ) from None
        pos = end
    return records, pos


class WriteAheadLog:
    """Appends commit records to ``dir/wal-<epoch>.log`` files, fsynced."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.dir = directory
        self.fsync = fsync
        self._fh: BinaryIO | None = None
        self.current: Path | None = None
        self.torn_tails = 0
        """Torn last records cut off by replays (each one a crash in the middle of a commit)."""
        self.torn_bytes = 0

    @staticmethod
    def files(directory: Path) -> list[tuple[int, Path]]:
        """The log files in ``directory`` by first epoch."""
        out = []
        for p in directory.glob("wal-*.log"):
            try:
                out.append((int(p.stem.split("-", 1)[1]), p))
            except ValueError:
                continue
        return sorted(out)

    def replay(self, after_epoch: int) -> Iterator[WalRecord]:
        """Records with epochs after ``after_epoch``, in order; cuts off a torn tail."""
        expected = after_epoch + 1
        for _, path in self.files(self.dir):
            records, good = read_records(path)
            size = path.stat().st_size
            if good < size:
                log.info(
                    "write-ahead log %s: cut off a torn last record (%d bytes) left by a crash "
                    "in the middle of a commit; it was never acknowledged",
                    path,
                    size - good,
                )
                self.torn_tails += 1
                self.torn_bytes += size - good
                with open(path, "r+b") as fh:
                    fh.truncate(good)
                    os.fsync(fh.fileno())
            for rec in records:
                if rec.epoch <= after_epoch:
                    continue
                if rec.epoch != expected:
                    detail = (
                        f"the log jumps from epoch {expected - 1} to {rec.epoch} (a file before "
                        "it lost records)"
                    )
                    raise CorruptStateError(path, detail)
                expected += 1
                yield rec

    def start(self, first_epoch: int) -> None:
        """Append from now on to a new file for records from ``first_epoch`` on."""
        self.close()
        path = self.dir / f"wal-{first_epoch:012d}.log"
        self._fh = open(path, "ab")  # noqa: SIM115 - held open across commits
        self.current = path
        if self.fsync:
            fsync_dir(self.dir)

    def append(self, epoch: int, committed_at_us: int, batch: CommitBatch) -> None:
        """Write one commit and make it durable."""
        if self._fh is None:
            self.start(epoch)
        fh = self._fh
        assert fh is not None
        record = encode_record(epoch, committed_at_us, batch)
        start = fh.tell()
        try:
            fh.write(record)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        except OSError as exc:
            # The commit fails and is not visible. Cut off whatever part of the
            # record reached the file, so the retry's record follows the last
            # whole one (a torn record in the middle would hide those after it).
            self._cut_back(start)
            msg = f"cannot write the index's write-ahead log {self.current}: {exc}"
            raise IndexStoreError(msg) from exc

    def _cut_back(self, size: int) -> None:
        """Reopen the current file at ``size`` bytes, dropping a partial record."""
        assert self.current is not None
        with contextlib.suppress(OSError):
            if self._fh is not None:
                self._fh.close()
        self._fh = None
        try:
            with open(self.current, "r+b") as fh:
                fh.truncate(size)
                os.fsync(fh.fileno())
        except OSError:
            pass  # reopening below fails too; replay stops at the torn record
        self._fh = open(self.current, "ab")  # noqa: SIM115 - held open across commits

    def drop_before(self, first_kept: Path | None) -> None:
        """Delete every log file older than ``first_kept`` (checkpointed)."""
        for start, path in self.files(self.dir):
            if first_kept is not None and path == first_kept:
                break
            if first_kept is None or start < int(first_kept.stem.split("-", 1)[1]):
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close the current file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
