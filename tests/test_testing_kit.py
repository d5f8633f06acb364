"""The test kit itself: scripted markers and the timeline builder."""

from __future__ import annotations

import pickle

import pytest

from streamrag.errors import ArgumentError, SourceError, StateError
from streamrag.sources import RawBatch
from streamrag.testing import (
    CRASH,
    EOF,
    PAUSE,
    WATERMARK,
    ScriptedCrash,
    ScriptedSource,
    Timeline,
    change_line,
)

BIG = 1 << 20


def _offsets(batches: list[RawBatch]) -> list[int]:
    return [o for b in batches for o in b.offsets]


def test_plain_script_keeps_line_numbers_as_offsets() -> None:
    src = ScriptedSource()
    src.push("a", b"b", {"c": 1})
    reader = src.build()
    batches = reader.poll(BIG)
    assert [(b.lines, b.offsets, b.end_offset, b.watermark) for b in batches] == [
        ([b"a", b"b", b'{"c": 1}'], [0, 1, 2], 3, None)
    ]
    assert reader.snapshot() == {"scripted": 3}
    assert reader.poll(BIG) == []
    src.push("d")
    assert _offsets(reader.poll(BIG)) == [3]


def test_push_refuses_what_is_not_a_line() -> None:
    with pytest.raises(ArgumentError, match="found int"):
        ScriptedSource().push(3)  # type: ignore[arg-type]


def test_eof_ends_the_reader_and_a_resumed_one_continues_after_it() -> None:
    src = ScriptedSource()
    src.push("a", "b", EOF, "c")
    reader = src.build()
    assert _offsets(reader.poll(BIG)) == [0, 1]
    assert reader.ended
    assert reader.backlog_bytes() == 0
    assert reader.poll(BIG) == []
    assert reader.snapshot() == {"scripted": 3}
    resumed = src.build(reader.snapshot())
    assert not resumed.ended
    assert _offsets(resumed.poll(BIG)) == [3]


def test_pause_makes_exactly_one_empty_poll_each() -> None:
    src = ScriptedSource()
    src.push("a", PAUSE, PAUSE, "b")
    reader = src.build()
    assert _offsets(reader.poll(BIG)) == [0]
    assert reader.backlog_bytes() == 0  # nothing is available during the pause
    assert reader.poll(BIG) == []
    assert reader.poll(BIG) == []
    assert reader.backlog_bytes() == 1
    assert _offsets(reader.poll(BIG)) == [3]


def test_a_pause_first_and_a_resume_at_a_pause_both_pause() -> None:
    src = ScriptedSource()
    src.push(PAUSE, "a")
    reader = src.build()
    assert reader.poll(BIG) == []
    assert _offsets(reader.poll(BIG)) == [1]
    again = src.build({"scripted": 0})
    assert again.poll(BIG) == []


def test_crash_fires_on_the_poll_after_the_records_before_it_and_only_once() -> None:
    src = ScriptedSource()
    src.push("a", CRASH, "b")
    reader = src.build()
    assert _offsets(reader.poll(BIG)) == [0]
    with pytest.raises(ScriptedCrash, match="position 1"):
        reader.poll(BIG)
    with pytest.raises(StateError, match="build a new reader"):
        reader.poll(BIG)
    assert src.fired == {1}
    # The restarted process resumes from before the crash and passes it by.
    restarted = src.build({"scripted": 0})
    assert _offsets(restarted.poll(BIG)) == [0, 2]


def test_crash_escapes_except_exception() -> None:
    # What a retry loop or a dead-letter guard catches must not catch a crash.
    assert not issubclass(ScriptedCrash, Exception)
    assert issubclass(ScriptedCrash, BaseException)


def test_watermark_closes_the_batch_and_rides_on_it() -> None:
    src = ScriptedSource()
    src.push("a", WATERMARK(10), "b", "c", WATERMARK(20), WATERMARK(30), "d")
    reader = src.build()
    got = [(b.lines, b.offsets, b.end_offset, b.watermark) for b in reader.poll(BIG)]
    assert got == [
        ([b"a"], [0], 2, 10),
        ([b"b", b"c"], [2, 3], 5, 20),
        ([], [], 6, 30),  # a batch with a watermark and no lines
        ([b"d"], [6], 7, None),
    ]
    # Resuming after a watermark does not emit it again.
    resumed = src.build({"scripted": 2})
    assert [b.watermark for b in resumed.poll(BIG)] == [20, 30, None]


def test_budget_takes_at_least_one_record_and_stops_near_max_bytes() -> None:
    src = ScriptedSource()
    src.push(*(b"x" * 10 for _ in range(10)))
    reader = src.build()
    assert _offsets(reader.poll(1)) == [0]
    assert _offsets(reader.poll(25)) == [1, 2, 3]  # 20 < 25: one more
    assert reader.backlog_bytes() == 60


def test_resume_past_the_end_of_the_script_is_a_source_error() -> None:
    src = ScriptedSource()
    src.push("a")
    with pytest.raises(SourceError, match="past the end"):
        src.build({"scripted": 5}).poll(BIG)


def test_scripted_source_pickles_with_its_fired_crashes() -> None:
    src = ScriptedSource("p0")
    src.push("a", CRASH, "b")
    src.fired.add(1)
    clone = pickle.loads(pickle.dumps(src))
    assert clone == src
    assert clone.fired == {1}


# -- the timeline builder -----------------------------------------------------


def test_timeline_builds_the_script_it_describes() -> None:
    tl = (
        Timeline()
        .add(change_line("a", 10, "x"), change_line("b", 12, "y"))
        .watermark(11_000_000)
        .add(change_line("c", 9, "z"), late=True)
        .pause(2)
        .crash()
        .raw('{"doc_id": ')
        .eof()
    )
    assert len(tl) == 9
    assert tl.current_watermark == 11_000_000
    items = tl.items
    assert items[2] == WATERMARK(11_000_000)
    assert items[4:] == [PAUSE, PAUSE, CRASH, b'{"doc_id": ', EOF]
    src = tl.source("p0")
    assert src.name == "p0"
    assert src.lines == items


def test_timeline_refuses_a_watermark_going_backwards() -> None:
    tl = Timeline().watermark("2024-01-01T00:00:10Z")
    tl.watermark("2024-01-01T00:00:10Z")  # the same one again is fine
    with pytest.raises(ArgumentError, match="never goes backwards"):
        tl.watermark("2024-01-01T00:00:09Z")


def test_timeline_refuses_anything_after_eof() -> None:
    tl = Timeline().add(change_line("a", 1, "x")).eof()
    for step in (
        lambda: tl.add(change_line("b", 2, "y")),
        lambda: tl.watermark(5),
        lambda: tl.pause(),
        lambda: tl.crash(),
        lambda: tl.raw("junk"),
        lambda: tl.eof(),
    ):
        with pytest.raises(ArgumentError, match=r"after eof\(\) \(item 1\)"):
            step()


def test_timeline_refuses_an_unmarked_late_change_and_a_wrongly_marked_one() -> None:
    tl = Timeline().watermark("1970-01-01T00:00:10Z")
    with pytest.raises(ArgumentError, match="below the watermark"):
        tl.add(change_line("a", 9, "late"))
    with pytest.raises(ArgumentError, match="marked late but"):
        tl.add(change_line("a", 10, "on time"), late=True)
    with pytest.raises(ArgumentError, match="marked late but"):
        Timeline().add(change_line("a", 0, "no watermark yet"), late=True)
    tl.add(change_line("a", 10, "on time"))  # at the watermark is not late
    tl.add(change_line("a", 9, "late"), late=True)
    assert len(tl) == 3  # the refused steps added nothing


def test_timeline_reads_event_times_as_the_decoder_does() -> None:
    tl = Timeline().watermark("2024-01-01T00:00:00Z")
    tl.add({"doc_id": "a", "event_time": "2024-01-01T01:00:00+01:00"})  # = the watermark
    with pytest.raises(ArgumentError, match="below the watermark"):
        tl.add({"doc_id": "a", "event_time": 1_704_067_199.5})


def test_timeline_refuses_a_change_without_a_readable_event_time() -> None:
    for line in ('{"doc_id": "a"}', "not json", '{"event_time": "yesterday"}', "[1]"):
        with pytest.raises(ArgumentError, match=r"Timeline\.raw\(\)"):
            Timeline().add(line)


def test_timeline_refuses_bad_watermark_values_and_pauses() -> None:
    with pytest.raises(ArgumentError, match="no time zone"):
        Timeline().watermark("2024-01-01T00:00:00")
    with pytest.raises(ArgumentError, match="Timestamp"):
        Timeline().watermark(1.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="Timestamp"):
        Timeline().watermark(True)
    with pytest.raises(ArgumentError, match="outside"):
        Timeline().watermark(2**63)
    with pytest.raises(ArgumentError, match="at least one poll"):
        Timeline().pause(0)


def test_timeline_source_without_crashes_keeps_the_offsets() -> None:
    tl = Timeline().add(change_line("a", 1, "x")).crash().add(change_line("b", 2, "y"))
    calm = tl.source(crashes=False).build()
    assert _offsets(calm.poll(BIG)) == [0, 2]
    armed = tl.source().build()
    assert _offsets(armed.poll(BIG)) == [0]
    with pytest.raises(ScriptedCrash):
        armed.poll(BIG)


def test_timeline_repr_shows_its_script() -> None:
    tl = Timeline().add('{"doc_id": "a", "event_time": 1}').watermark(2).pause().crash().eof()
    assert repr(tl) == (
        """Timeline([b'{"doc_id": "a", "event_time": 1}', Watermark(time=2), PAUSE, CRASH, EOF])"""
    )
