"""Triggers beyond the watermark: count, every update, purging, and the global window."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from streamrag.errors import SpecError
from streamrag.eventtime import (
    GLOBAL_WINDOW,
    Accumulation,
    Collect,
    Count,
    Global,
    Session,
    Sum,
    Trigger,
    Tumbling,
    WindowedAggregation,
)
from streamrag.timing import format_timestamp
from tests.eventtime.oracle import as_tuples

G = tuple(GLOBAL_WINDOW)  # the global window's span


def _batch(op: WindowedAggregation, *elements: tuple[str, int, Any]) -> list[tuple[Any, ...]]:
    keys = [k for k, _, _ in elements]
    times = [t for _, t, _ in elements]
    values = [v for _, _, v in elements]
    fired, late = op.process(keys, times, values)
    assert late == []
    return as_tuples(fired)


def test_the_specs_read_as_flink_and_beam_name_them() -> None:
    assert Trigger() == Trigger.on_watermark()
    assert Trigger.every_update() == Trigger.of_count(1)
    assert Trigger.of_count(3).purging() == Trigger(count=3, purge=True)
    assert Trigger.of_count(3).kind == "count"
    assert Trigger.every_update().kind == "every_update"
    assert Trigger().kind == "watermark"
    assert Global().assign(-5) == Global().assign(10**17) == [GLOBAL_WINDOW]
    # Results show windows as ISO-8601 times: the global window has dates.
    assert format_timestamp(GLOBAL_WINDOW.start) == "0001-01-01T00:00:00Z"
    assert format_timestamp(GLOBAL_WINDOW.end) == "9999-12-31T23:59:59.999999Z"
    with pytest.raises(SpecError, match="count must be a positive"):
        Trigger.of_count(0)


def test_count_trigger_fires_early_every_n_elements_then_on_time() -> None:
    op = WindowedAggregation(Tumbling(100), Count(), trigger=Trigger.of_count(2))
    assert _batch(op, ("a", 1, None), ("a", 2, None), ("a", 3, None), ("b", 4, None)) == [
        ("a", 0, 100, 2, "early", 0)
    ]
    assert _batch(op, ("a", 5, None)) == [("a", 0, 100, 4, "early", 1)]
    assert as_tuples(op.advance(99)) == [
        ("a", 0, 100, 4, "on_time", 2),
        ("b", 0, 100, 1, "on_time", 0),
    ]


def test_count_trigger_counts_per_window_and_leaves_the_late_phase_as_it_was() -> None:
    op = WindowedAggregation(
        Tumbling(10), Count(), trigger=Trigger.of_count(2), allowed_lateness_us=20
    )
    assert _batch(op, ("a", 1, None), ("a", 11, None)) == []  # one element in each window
    assert as_tuples(op.advance(9)) == [("a", 0, 10, 1, "on_time", 0)]
    # Behind W, every batch re-fires its window LATE, whatever the count.
    assert _batch(op, ("a", 2, None)) == [("a", 0, 10, 2, "late", 1)]
    assert _batch(op, ("a", 12, None)) == [("a", 10, 20, 2, "early", 0)]


def test_every_update_fires_on_every_element_within_a_batch() -> None:
    op = WindowedAggregation(Tumbling(100), Sum(), trigger=Trigger.every_update())
    assert _batch(op, ("a", 1, 1.0), ("b", 2, 5.0), ("a", 3, 2.0)) == [
        ("a", 0, 100, 1.0, "early", 0),
        ("a", 0, 100, 3.0, "early", 1),
        ("b", 0, 100, 5.0, "early", 0),
    ]
    assert as_tuples(op.advance(99)) == [
        ("a", 0, 100, 3.0, "on_time", 2),
        ("b", 0, 100, 5.0, "on_time", 1),
    ]


def test_global_window_with_a_count_trigger_accumulates_and_fires_on_time_at_the_end() -> None:
    op = WindowedAggregation(Global(), Sum(), trigger=Trigger.of_count(2))
    assert _batch(op, ("a", 10**15, 1.0), ("a", -(10**15), 2.0), ("a", 5, 3.0)) == [
        ("a", *G, 3.0, "early", 0)
    ]
    assert op.advance(10**17) == []  # in the year 5138, still open
    assert _batch(op, ("a", 7, 4.0)) == [("a", *G, 10.0, "early", 1)]
    assert as_tuples(op.finish()) == [("a", *G, 10.0, "on_time", 2)]


def test_purging_count_trigger_on_a_global_window_gives_count_windows() -> None:
    """Flink's ``GlobalWindows`` + ``PurgingTrigger.of(CountTrigger.of(3))``."""
    op = WindowedAggregation(Global(), Collect(), trigger=Trigger.of_count(3).purging())
    got = _batch(op, *[("a", t, t) for t in range(1, 8)])
    assert got == [("a", *G, [1, 2, 3], "early", 0), ("a", *G, [4, 5, 6], "early", 1)]
    assert as_tuples(op.finish()) == [("a", *G, [7], "on_time", 2)]


def test_purging_clears_the_contents_after_each_firing_as_discarding_panes_do() -> None:
    """Flink's purging trigger is Beam's discarding accumulation, on every path."""
    purging = Trigger.on_watermark().purging()
    for window in (Tumbling(10), Session(5)):
        op = WindowedAggregation(window, Count(), allowed_lateness_us=50, trigger=purging)
        same = WindowedAggregation(
            window, Count(), allowed_lateness_us=50, accumulation=Accumulation.DISCARDING
        )
        for o in (op, same):
            _batch(o, ("a", 1, None), ("a", 2, None))
        assert as_tuples(op.advance(9)) == as_tuples(same.advance(9))
        assert _batch(op, ("a", 3, None)) == _batch(same, ("a", 3, None))
        assert op.snapshot() == same.snapshot()
    op = WindowedAggregation(Tumbling(10), Count(), allowed_lateness_us=50, trigger=purging)
    assert op._vectorized  # a purging watermark trigger keeps the columnar path
    _batch(op, ("a", 1, None), ("a", 2, None))
    assert as_tuples(op.advance(9)) == [("a", 0, 10, 2, "on_time", 0)]
    assert _batch(op, ("a", 3, None)) == [("a", 0, 10, 1, "late", 1)]


def test_sessions_add_up_their_counts_when_they_merge() -> None:
    """As Flink's ``CountTrigger.onMerge``: the merged window's count is the sum."""
    op = WindowedAggregation(Session(10), Count(), trigger=Trigger.of_count(3))
    assert _batch(op, ("a", 1, None), ("a", 30, None)) == []
    assert _batch(op, ("a", 20, None)) == []  # touches [30, 40) only: count 2
    assert _batch(op, ("a", 11, None)) == [("a", 1, 40, 4, "early", 0)]  # bridges all: 4


def test_counts_since_the_last_firing_survive_a_checkpoint() -> None:
    def build() -> WindowedAggregation:
        return WindowedAggregation(Tumbling(100), Count(), trigger=Trigger.of_count(3))

    op = build()
    assert not op._vectorized  # counting triggers run on the per-window path
    _batch(op, ("a", 1, None), ("a", 2, None), ("a", 3, None), ("a", 4, None))
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(op.snapshot()))
    again = build()
    again.restore(saved)
    assert _batch(again, ("a", 5, None)) == []  # two since the firing at 3
    assert _batch(again, ("a", 6, None)) == [("a", 0, 100, 6, "early", 1)]
    # A checkpoint written without counts restores with none counted.
    old = {**saved, "windows": [row[:8] for row in saved["windows"]]}
    third = build()
    third.restore(old)
    assert _batch(third, ("a", 5, None), ("a", 6, None)) == []
    assert _batch(third, ("a", 7, None)) == [("a", 0, 100, 7, "early", 1)]


def test_the_default_trigger_keeps_the_columnar_path_and_its_checkpoint_rows() -> None:
    op = WindowedAggregation(Tumbling(10), Count())
    assert op._vectorized
    _batch(op, ("a", 1, None))
    assert [len(row) for row in op.snapshot()["windows"]] == [8]


def test_the_end_of_input_expires_every_window_whatever_its_lateness() -> None:
    for window in (Global(), Session(5)):
        op = WindowedAggregation(window, Collect(), allowed_lateness_us=2**63 - 1)
        _batch(op, ("a", 1, None))
        assert op.open_windows == 1
        assert len(op.finish()) == 1
        assert op.open_windows == 0
        assert op.process(["a"], [2])[1][0].event_time == 2  # after the end: side output
