"""The write-ahead log: records with their cursor, and no torn record after a failed append."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import pytest

from streamrag.changes import Op
from streamrag.errors import IndexStoreError
from streamrag.index.wal import WriteAheadLog, decode_payload, encode_record

from .reference import Change, make_batch


def _batch(epoch: int) -> Any:
    batch = make_batch([Change(f"d{epoch}", Op.UPSERT, epoch, epoch, (epoch,))], 8)
    return dataclasses.replace(batch, cursor={"positions": {"in.jsonl": epoch * 100}})


class _DiskFull:
    """A file whose next write stores half the bytes and then fails, as on a full disk."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, data: bytes) -> int:
        self.real.write(data[: len(data) // 2])
        self.real.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_records_carry_their_cursor(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    for epoch in (1, 2):
        wal.append(epoch, 0, _batch(epoch))
    wal.close()
    cursors = [r.batch.cursor for r in WriteAheadLog(tmp_path).replay(0)]
    assert cursors == [{"positions": {"in.jsonl": 100}}, {"positions": {"in.jsonl": 200}}]


def test_a_failed_append_is_cut_off_so_the_retry_follows_the_last_whole_record(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append(1, 0, _batch(1))
    wal._fh = _DiskFull(wal._fh)  # type: ignore[assignment]
    with pytest.raises(IndexStoreError, match="No space left"):
        wal.append(2, 0, _batch(2))
    wal.append(2, 0, _batch(2))  # the retry, once there is room
    wal.append(3, 0, _batch(3))
    wal.close()
    assert [r.epoch for r in WriteAheadLog(tmp_path).replay(0)] == [1, 2, 3]


def test_a_record_keeps_the_layout_older_logs_were_written_in(tmp_path: Path) -> None:
    """Each document is the array of its ten fields, the op as its number, a read-only
    metadata view as a plain map: a log written before replays, and round-trips."""
    changes = [
        Change("a", Op.UPSERT, 5, 2, (1, 2), metadata={"lang": "en", "n": 3}),
        Change("a", Op.UPSERT, 3, 1, (3,)),  # a late version of the same document
        Change("b", Op.DELETE, 4, 3),
        Change("c", Op.UPSERT, 6, 4, (4,), tenant="t2", domain="it"),
    ]
    batch = make_batch(changes, 8)
    viewed = dataclasses.replace(
        batch,
        docs=[
            msgspec.structs.replace(d, metadata=MappingProxyType(dict(d.metadata)))
            if d.metadata
            else d
            for d in batch.docs
        ],
    )
    payload = encode_record(7, 9, viewed)[8:]
    written = msgspec.msgpack.decode(payload)["docs"]
    assert written == [
        [
            *(d.tenant, d.doc_id, int(d.op), d.event_time, d.offset, d.source, d.domain),
            *(d.first_chunk, d.n_chunks, dict(d.metadata) if d.metadata else None),
        ]
        for d in batch.docs
    ]
    assert decode_payload(payload).batch.docs == batch.docs
    with pytest.raises(IndexStoreError, match="cannot write a object into the write-ahead log"):
        encode_record(7, 9, dataclasses.replace(batch, cursor={"x": object()}))
