"""Damaged state is never served: checksums on every state file, and a WAL that tells a torn
tail (a crash mid-commit: cut it off) from damage in the middle (refuse, naming the byte).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from streamrag.changes import Op
from streamrag.config import load_settings
from streamrag.errors import CorruptStateError
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.compaction import CompactionSpec
from streamrag.runtime.service import Service
from streamrag.testing import change_line

from .reference import Change, make_batch, unit

DIM = 8
SPEC = LsmSpec(
    seal_rows=40,
    ann=AnnSpec(min_rows=40, hnsw_m=8, hnsw_ef_construction=32),
    compaction=CompactionSpec(fanout=8, seal_rows=40),
    checkpoint_every=1000,
)


def _build(path: Path) -> list[tuple[str, int]]:
    """A persistent index with every kind of file: sealed segments and their HNSW graph,
    a growing segment, stamps, deletes, epochs, a cursor, a manifest."""
    index = LsmIndex(DIM, SPEC, path=path)
    for e in range(6):
        changes = [
            Change(f"d{e}-{i}", Op.UPSERT, e * 100 + i, e * 100 + i, (e * 100 + i,))
            for i in range(20)
        ]
        changes.append(Change(f"d0-{e}", Op.UPSERT, 1000 + e, 1000 + e, (5000 + e,)))
        batch = make_batch(changes, DIM)
        batch = replace(batch, cursor={"format": 1, "positions": {"s": e}})
        index.commit(batch)
    index.commit(make_batch([Change("d1-1", Op.DELETE, 2000, 2000)], DIM))
    while index.maintain():
        pass
    index.checkpoint()
    answer = _answer(index)
    index.close()
    return answer


def _answer(index: LsmIndex) -> list[tuple[str, int]]:
    _, hits = index.search_many(unit(7, DIM)[None], 10, SearchFilter())
    return [(h.doc_id, h.event_time) for h in hits[0]]


def _flip(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    i = int(len(data) * where)
    data[i] ^= 0x20
    path.write_bytes(bytes(data))


def test_every_kind_of_state_file_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "good"
    want = _build(good)
    files = sorted(p.name for p in good.iterdir() if not p.name.startswith("wal-"))
    kinds = {name.split("-")[0] + ("." + name.rsplit(".", 1)[1]) for name in files}
    assert {"seg.arrow", "seg.hnsw", "grow.arrow", "stamps.arrow", "deletes.arrow"} <= kinds
    assert {"epochs.arrow", "cursor.msgpack", "manifest.json"} <= kinds
    for name in files:
        copy = tmp_path / f"flip-{name}"
        shutil.copytree(good, copy)
        _flip(copy / name)
        if name.endswith(".hnsw"):
            # A damaged graph is rebuilt from the segment's vectors: answers stay right.
            index = LsmIndex(DIM, SPEC, path=copy)
            assert _answer(index) == want
            while index.maintain():
                pass
            assert index.health().ann_segments >= 1
            index.close()
            continue
        with pytest.raises(CorruptStateError) as err:
            LsmIndex(DIM, SPEC, path=copy)
        assert err.value.path == str(copy / name), name
        assert name in str(err.value)
        assert "index.on_corruption: rebuild" in str(err.value)


def _wal_index(path: Path, commits: int) -> None:
    index = LsmIndex(DIM, LsmSpec(checkpoint_every=10_000), path=path)
    for e in range(commits):
        index.commit(make_batch([Change(f"d{e}", Op.UPSERT, e, e, (e,))], DIM))
    index.abandon()  # a crash: no checkpoint, everything is in the log


def test_a_torn_tail_is_cut_off_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _wal_index(tmp_path, 20)
    [wal] = tmp_path.glob("wal-*.log")
    size = wal.stat().st_size
    with wal.open("r+b") as fh:
        fh.truncate(size - 37)  # the last record is half-written
    with caplog.at_level(logging.INFO, logger="streamrag.index"):
        index = LsmIndex(DIM, LsmSpec(), path=tmp_path)
    assert index.epoch == 19
    assert index.health().wal_torn_tails == 1
    assert "torn last record" in caplog.text
    index.close()


def test_damage_in_the_middle_of_the_log_is_refused_not_dropped(tmp_path: Path) -> None:
    _wal_index(tmp_path, 20)
    [wal] = tmp_path.glob("wal-*.log")
    _flip(wal, 0.5)  # inside record ~10 of 20: the records after it are whole
    with pytest.raises(CorruptStateError, match=r"fails its CRC-32 and whole records follow"):
        LsmIndex(DIM, LsmSpec(), path=tmp_path)
    assert wal.stat().st_size > 0  # nothing was cut off


def test_rebuild_from_the_source_when_asked(tmp_path: Path) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(
        "".join(change_line(f"d{i}", 1_700_000_000 + i, f"text {i}") + "\n" for i in range(50))
    )
    overrides = {
        "embedder.class": "hashing",
        "embedder.args": {"dim": 16},
        "source.path": str(data),
        "state_dir": str(tmp_path / "state"),
        "index.seal_rows": 16,
    }
    first = Service(load_settings(overrides=overrides, environ={}))
    first.pipeline.run_until_caught_up()
    first.pipeline.close()
    first.index.close()  # type: ignore[attr-defined]
    seg = sorted((tmp_path / "state" / "index").glob("seg-*.arrow"))[0]
    _flip(seg)
    with pytest.raises(CorruptStateError):
        Service(load_settings(overrides=overrides, environ={}))
    again = Service(
        load_settings(overrides={**overrides, "index.on_corruption": "rebuild"}, environ={})
    )
    assert again.index.cursor is None  # a new index: the source is read from its start
    again.pipeline.run_until_caught_up()
    status = again.status()
    assert status["recovery"]["rebuilt_from_source"]["damaged_file"] == str(seg)
    assert status["index"]["live_docs"] == 50
    moved = Path(status["recovery"]["rebuilt_from_source"]["moved_to"])
    assert (moved / seg.name).exists()  # the damaged index is kept for inspection
    again.pipeline.close()
    again.index.close()  # type: ignore[attr-defined]
