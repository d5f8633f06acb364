"""Watermarks over several inputs: minimum over active ones, idleness, monotonicity."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.eventtime import WatermarkTracker
from streamrag.testing import ManualClock
from streamrag.timing import MAX_TIMESTAMP, MIN_TIMESTAMP


def test_minimum_over_inputs_with_bound() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=10, clock=clock)
    assert wm.advance() == MIN_TIMESTAMP
    wm.observe("p0", 100)
    assert wm.advance() == 89  # max - bound - 1
    wm.observe("p1", 50)
    assert wm.advance() == 89  # a slower input joining does not move W back
    wm.observe("p0", 200)
    assert wm.advance() == 89  # held back by p1 (39)
    wm.observe("p1", 150)
    assert wm.advance() == 139


def test_idle_input_releases_the_watermark_and_rejoins_without_moving_it_back() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, idle_timeout_us=1_000, clock=clock)
    wm.observe("busy", 10)
    wm.observe("quiet", 10)
    assert wm.advance() == 9
    clock.advance_us(999)
    wm.observe("busy", 500)
    assert wm.advance() == 9  # quiet is not idle yet
    clock.advance_us(1)
    assert wm.advance() == 9  # silent for exactly the timeout: still active
    clock.advance_us(1)
    assert wm.active() == ["busy"]
    assert wm.advance() == 499  # quiet is idle: it no longer holds W back
    wm.observe("quiet", 20)  # back, far behind
    assert set(wm.active()) == {"busy", "quiet"}
    assert wm.advance() == 499  # W does not go back
    wm.observe("busy", 900)
    assert wm.advance() == 499  # and quiet holds it until it catches up
    wm.observe("quiet", 700)
    assert wm.advance() == 699


def test_all_inputs_idle_keeps_the_watermark() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(idle_timeout_us=10, clock=clock)
    wm.observe("a", 100)
    assert wm.advance() == 99
    clock.advance_us(50)
    assert wm.active() == []
    assert wm.advance() == 99


def test_end_of_input_and_snapshot() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=5, clock=clock)
    wm.observe("a", 100)
    wm.observe("b", 40)
    wm.advance()
    again = WatermarkTracker(bound_us=5, clock=clock)
    again.restore(wm.snapshot())
    assert again.advance() == wm.advance() == 34
    assert again.max_seen() == 100
    assert wm.finish() == MAX_TIMESTAMP
    wm.observe("a", 1)
    assert wm.advance() == MAX_TIMESTAMP


@given(
    steps=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(-1000, 1000), st.integers(0, 500)),
        max_size=60,
    ),
    bound=st.integers(0, 50),
)
@settings(max_examples=200, deadline=None)
def test_watermark_never_decreases_and_never_passes_an_active_input(
    steps: list[tuple[str, int, int]], bound: int
) -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=bound, idle_timeout_us=300, clock=clock)
    newest: dict[str, int] = {}
    last = MIN_TIMESTAMP
    for partition, ts, pause in steps:
        clock.advance_us(pause)
        wm.observe(partition, ts)
        newest[partition] = max(newest.get(partition, ts), ts)
        w = wm.advance()
        assert w >= last
        if w > last:  # when it moves, it moves to the minimum over active inputs
            assert w == min(newest[p] for p in wm.active()) - bound - 1
        last = w


# -- declared inputs ---------------------------------------------------------------------


def test_a_declared_input_that_sent_nothing_holds_the_watermark() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, clock=clock, inputs=["a", "b"])
    assert wm.partitions == 2
    wm.observe("a", 50)
    assert wm.advance() == MIN_TIMESTAMP  # b has sent nothing: it holds W at its minimum
    wm.observe("b", 20)
    assert wm.advance() == 19
    # Without declared inputs, W follows the inputs seen so far (unchanged behaviour).
    seen = WatermarkTracker(bound_us=0, clock=clock)
    seen.observe("a", 50)
    assert seen.advance() == 49


def test_a_declared_silent_input_goes_idle_after_the_timeout() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock, inputs=["a", "b"])
    wm.observe("a", 50)
    clock.advance_us(100)
    assert wm.advance() == MIN_TIMESTAMP  # silent for exactly the timeout: not idle yet
    clock.advance_us(1)
    wm.observe("a", 60)
    assert wm.active() == ["a"]
    assert wm.advance() == 59


def test_declared_inputs_survive_a_restore() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, clock=clock, inputs=["a", "b"])
    wm.observe("a", 50)
    again = WatermarkTracker(bound_us=0, clock=clock, inputs=["a", "b"])
    again.restore(wm.snapshot())
    assert again.advance() == MIN_TIMESTAMP
    again.observe("b", 30)
    assert again.advance() == 29


# -- idleness ----------------------------------------------------------------------------


def test_an_input_is_idle_only_after_strictly_more_than_the_timeout() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    wm.observe("a", 50)
    wm.observe("b", 20)
    clock.advance_us(100)
    wm.observe("a", 80)
    assert set(wm.active()) == {"a", "b"}  # silent for exactly 100 µs: still active
    assert wm.advance() == 19
    clock.advance_us(1)
    assert wm.active() == ["a"]
    assert wm.advance() == 79


def test_an_idle_input_stays_idle_across_a_restore() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    wm.observe("a", 50)
    wm.observe("b", 20)
    clock.advance_us(150)
    wm.observe("a", 500)
    assert wm.advance() == 499  # b is idle
    saved = wm.snapshot()
    again = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    again.restore(saved)
    assert again.active() == ["a"]
    again.observe("a", 800)
    assert again.advance() == 799  # b, idle before the snapshot, still does not hold W
    again.observe("b", 900)  # data brings it back
    assert set(again.active()) == {"a", "b"}
    assert again.advance() == 799


def test_a_snapshot_without_idle_inputs_restores_every_input_as_active() -> None:
    """Snapshots written before idleness was stored: every input is active from the restore."""
    clock = ManualClock(1_000)
    wm = WatermarkTracker(bound_us=0, idle_timeout_us=100, clock=clock)
    wm.restore({"watermark": 19, "finished": False, "inputs": {"a": 50, "b": 20}})
    assert set(wm.active()) == {"a", "b"}
    wm.observe("a", 90)
    assert wm.advance() == 19
    clock.advance_us(101)
    wm.observe("a", 95)
    assert wm.advance() == 94


# -- explicit watermarks -------------------------------------------------------------------


def test_an_explicit_watermark_advances_its_input_and_never_goes_back() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=10, clock=clock, inputs=["a", "b"])
    wm.observe("a", 100)  # derived: 89
    wm.observe_watermark("b", 40)  # b sent no data, only a watermark
    assert wm.advance() == 40
    wm.observe_watermark("b", 30)  # lower: ignored
    assert wm.advance() == 40
    wm.observe_watermark("b", 95)
    assert wm.advance() == 89  # now a holds W
    wm.observe_watermark("a", 120)  # above what a's data implies
    assert wm.advance() == 95
    wm.observe("a", 110)  # derived 99 < 120: the explicit one stands
    wm.observe_watermark("b", 200)
    assert wm.advance() == 120


def test_explicit_watermarks_survive_a_restore() -> None:
    clock = ManualClock(0)
    wm = WatermarkTracker(bound_us=0, clock=clock)
    wm.observe("a", 10)
    wm.observe_watermark("a", 70)
    wm.observe("b", 50)
    again = WatermarkTracker(bound_us=0, clock=clock)
    again.restore(wm.snapshot())
    assert again.advance() == wm.advance() == 49
    again.observe("b", 100)
    wm.observe("b", 100)
    assert again.advance() == wm.advance() == 70
