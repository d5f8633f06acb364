"""The checkpoint manifest: typed, the same bytes as written, and format 1 still read."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from streamrag.changes import Op
from streamrag.errors import CorruptStateError
from streamrag.index import LsmIndex, LsmSpec
from streamrag.index.checkpoint import CheckpointManifest
from streamrag.index.compaction import CompactionSpec
from streamrag.index.store import read_manifest, read_table, write_manifest, write_table

from .reference import Change, make_batch

DIM = 8
DAY = 86_400_000_000
SPEC = LsmSpec(seal_rows=3, compaction=CompactionSpec(fanout=2, seal_rows=3))


def _build(path: Path, cursor: bool = False) -> LsmIndex:
    """Sealed and growing segments, replaced versions, a delete and a rollback."""
    index = LsmIndex(DIM, SPEC, path=path)
    for e in range(6):
        changes = [
            Change(f"d{(e + i) % 4}", Op.UPSERT, (e + 1) * DAY, e * 10 + i, (e * 3 + i,))
            for i in range(3)
        ]
        batch = make_batch(changes, DIM)
        index.commit(replace(batch, cursor={"positions": {"s": e}}) if cursor else batch)
    index.maintain()
    index.commit(make_batch([Change("d1", Op.DELETE, 9 * DAY, 99)], DIM))
    index.rollback(5)  # rows of epochs 6 and 7 undone, kept until a compaction
    index.commit(make_batch([Change("x", Op.UPSERT, 9 * DAY, 100, (7,))], DIM))
    index.checkpoint()
    return index


def _state(index: LsmIndex) -> tuple[object, ...]:
    docs = sorted((h.doc_id, h.epoch, h.event_time, h.position) for h, _ in index.export())
    history = {
        d: [s.version for s in index.doc_history("default", d)]
        for d in ("d0", "d1", "d2", "d3", "x")
    }
    return index.epoch, index.stats().live_chunks, docs, history, index.cursor


def _manifest(path: Path) -> Path:
    (newest,) = sorted(path.glob("manifest-*.json"))[-1:]
    return newest


FORMAT_2 = {
    "checksum",
    "committed_at_us",
    "compacted_floor",
    "compactions",
    "deletes",
    "dim",
    "epoch",
    "epochs",
    "files",
    "format",
    "high",
    "history",
    "last_compaction_us",
    "next_rid",
    "next_segment",
    "parent",
    "restored_from",
    "rolled_back",
    "segments",
    "stamps",
}


@pytest.mark.parametrize("cursor", [False, True])
def test_the_typed_manifest_writes_back_the_same_bytes(tmp_path: Path, cursor: bool) -> None:
    _build(tmp_path / "ix", cursor).close()
    written = _manifest(tmp_path / "ix")
    raw = json.loads(written.read_text())
    assert set(raw) == FORMAT_2 | ({"cursor"} if cursor else set())
    assert {k for entry in raw["segments"] for k in entry} == {
        "id",
        "rows",
        "file",
        "sealed",
        "ann",
    }
    manifest = CheckpointManifest.from_body(read_manifest(written), written)
    assert manifest.segments
    assert any(s.sealed for s in manifest.segments)
    assert manifest.rolled_back == ((6, 7),)
    assert manifest.restored_from is None  # the epoch after the rollback's
    write_manifest(tmp_path / "again.json", manifest.to_body())
    assert (tmp_path / "again.json").read_bytes() == written.read_bytes()


def test_a_format_1_checkpoint_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ix"
    index = _build(path, cursor=True)
    want = _state(index)
    index.close()
    # Format 1 listed no checksums nor ANN files, and its stamps had no ``dead``
    # column (a row a rollback undid carried sup == created).
    written = _manifest(path)
    body = json.loads(written.read_text())
    for key in ("checksum", "files", "history"):
        body.pop(key)
    body["format"] = 1
    for entry in body["segments"]:
        entry.pop("ann")
    stamps = read_table(path / body["stamps"])
    write_table(path / body["stamps"], {k: v for k, v in stamps.items() if k != "dead"})
    written.write_text(json.dumps(body))
    for log in path.glob("wal-*.log"):
        log.unlink()
    reopened = LsmIndex(DIM, SPEC, path=path)
    try:
        assert _state(reopened) == want
    finally:
        reopened.close()


def test_a_manifest_missing_a_field_is_damage_named_by_its_file(tmp_path: Path) -> None:
    path = tmp_path / "ix"
    _build(path).close()
    written = _manifest(path)
    body = read_manifest(written)
    del body["next_rid"]
    write_manifest(written, body)
    with pytest.raises(CorruptStateError, match="manifest does not parse") as caught:
        LsmIndex(DIM, SPEC, path=path)
    assert caught.value.path == str(written)
