"""The stream cursor: typed, byte-compatible with what earlier versions wrote, and the rewind."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from streamrag.errors import SourceError, StreamragError
from streamrag.runtime.cursor import Cursor, Rewind, check_forward
from streamrag.sources.base import RawBatch

FIXTURE = Path(__file__).parent / "data" / "cursors-format1.msgpack"


def test_cursors_written_by_the_first_format_read_back_and_write_the_same_bytes() -> None:
    """The fixture holds three cursors a pipeline committed (waiting changes, a window)."""
    written = msgspec.msgpack.decode(FIXTURE.read_bytes())
    assert any("window:per_domain" in c for c in written)
    assert any(any(c["pending"].values()) for c in written)
    for raw in written:
        cursor = Cursor.from_mapping(raw)
        assert msgspec.msgpack.encode(cursor.to_mapping()) == msgspec.msgpack.encode(raw)
        assert cursor.audit is not None
        assert cursor.stats["ingested"] == raw["stats"]["ingested"]
    first = Cursor.from_mapping(written[0])
    assert first.waiting == sum(len(v) for v in written[0]["pending"].values()) > 0
    assert set(first.windows) == {"per_domain"}


def test_a_cursor_of_another_format_or_shape_is_refused_with_what_to_do() -> None:
    with pytest.raises(StreamragError, match=r"format 3.*upgrade streamrag"):
        Cursor.from_mapping({"format": 3, "positions": {}})
    with pytest.raises(StreamragError, match="cannot be read"):
        Cursor.from_mapping({"format": 1, "positions": {"a": "twelve"}})


def _raw(source: str, offsets: list[int], end: int) -> RawBatch:
    return RawBatch(source, [f"line@{o}".encode() for o in offsets], offsets, end)


def test_rewind_takes_again_only_the_waiting_records_below_the_committed_position() -> None:
    cursor = Cursor(positions={"a": 100, "b": 50}, pending={"a": [20, 60]})
    rewind = Rewind(cursor)
    assert rewind.resume == {"a": 20, "b": 50}
    assert rewind.waiting == 2
    assert rewind.active
    first = rewind.sift([_raw("a", [20, 40], 60), _raw("b", [50], 70)])
    assert [r.offsets for r in first.again] == [[20]]
    assert [r.offsets for r in first.fresh] == [[50]]  # b was never rewound
    assert first.skipped == 1  # offset 40: committed before the restart
    assert rewind.waiting == 1
    second = rewind.sift([_raw("a", [60, 80, 100, 120], 140)])
    assert [r.offsets for r in second.again] == [[60]]
    assert [r.offsets for r in second.fresh] == [[100, 120]]
    assert second.skipped == 1
    assert rewind.waiting == 0
    assert not rewind.active  # past the committed position: read as usual


def test_a_waiting_record_that_is_gone_is_logged_and_counted_superseded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rewind = Rewind(Cursor(positions={"a": 100}, pending={"a": [30]}))
    out = rewind.sift([_raw("a", [0, 100], 120)])  # the file was rewritten
    assert out.again == []
    assert out.superseded == 1
    assert rewind.waiting == 0
    assert "were not read again" in caplog.text


def test_a_capture_while_rewinding_keeps_the_committed_position_and_the_unread_waiting() -> None:
    rewind = Rewind(Cursor(positions={"a": 100}, pending={"a": [20, 60]}))
    rewind.sift([_raw("a", [20], 40)])
    positions, waiting = {"a": 40}, {"a": [20]}
    rewind.positions(positions, waiting)
    assert positions == {"a": 100}  # never behind what was committed
    assert waiting == {"a": [20, 60]}


def test_offsets_only_move_forward() -> None:
    rewind = Rewind(None)
    check_forward({"a": 10}, {"a": 12}, rewind)
    with pytest.raises(SourceError, match="moved back from offset 10 to 5"):
        check_forward({"a": 10}, {"a": 5}, rewind)
    check_forward({"a": 10}, {"a": 5}, Rewind(Cursor(positions={"a": 10}, pending={"a": [5]})))


def test_a_commit_writes_only_the_positions_that_moved_and_reading_merges_them() -> None:
    from streamrag.index.base import merge_cursor

    first = Cursor(positions={f"f{i}": 3 * i + 1 for i in range(1000)})
    held = merge_cursor(None, first.to_mapping())  # format 1 layout: every position
    moved = {**first.positions, "f7": 99, "new": 5}
    second = Cursor(base=first.positions, positions=moved)
    record = second.to_mapping()
    assert record["format"] == 2
    assert "positions" not in record  # the held map stays as it was
    assert {k for k in record if k.startswith("position:")} == {"position:f7", "position:new"}
    assert len(msgspec.msgpack.encode(record)) < 200
    merged = merge_cursor(held, record)
    assert Cursor.from_mapping(merged or {}).positions == moved
    third = Cursor(base=moved, positions={**moved, "f7": 120})
    merged = merge_cursor(merged, third.to_mapping())
    assert Cursor.from_mapping(merged or {}).positions["f7"] == 120
