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
