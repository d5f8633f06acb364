"""The window operator, table by table, and against the naive oracle."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from streamrag.errors import ConfigError
from streamrag.eventtime import (
    Accumulation,
    Collect,
    Count,
    Max,
    Mean,
    Min,
    Session,
    Sliding,
    Sum,
    Tumbling,
    Window,
    WindowedAggregation,
)
from streamrag.timing import MAX_TIMESTAMP
from tests.eventtime.oracle import Oracle, as_tuples

# Each case: the operator, then steps. A step is ("batch", [(key, ts)...]) or ("wm", W);
# expect lists the results and late elements each step produces, in the oracle's shape.
Step = tuple[str, Any, list[tuple[Any, ...]]]


def run(op: WindowedAggregation, steps: list[Step]) -> None:
    for i, (kind, arg, expected) in enumerate(steps):
        if kind == "batch":
            keys = [k for k, _ in arg]
            times = [t for _, t in arg]
            fired, late = op.process(keys, times)
            got = as_tuples(fired) + [("LATE-OUT", el.key, el.event_time) for el in late]
        else:
            got = as_tuples(op.advance(arg))
        assert got == expected, f"step {i} ({kind} {arg})"


CASES: dict[str, tuple[WindowedAggregation, list[Step]]] = {
    "tumbling, out of order, fires once at W >= end - 1": (
        WindowedAggregation(Tumbling(10), Count()),
        [
            ("batch", [("a", 7), ("a", 2), ("b", 9), ("a", 12)], []),
            ("wm", 8, []),  # end - 1 = 9 not reached
            ("wm", 9, [("a", 0, 10, 2, "on_time", 0), ("b", 0, 10, 1, "on_time", 0)]),
            ("wm", 9, []),  # same W: nothing twice
            ("wm", 5, []),  # W never goes back: nothing re-fires
            ("wm", 19, [("a", 10, 20, 1, "on_time", 0)]),
        ],
    ),
    "tumbling, late within allowed lateness re-fires LATE, beyond goes to side output": (
        WindowedAggregation(Tumbling(10), Count(), allowed_lateness_us=5),
        [
            ("batch", [("a", 1)], []),
            ("wm", 10, [("a", 0, 10, 1, "on_time", 0)]),
            ("batch", [("a", 3), ("a", 4)], [("a", 0, 10, 3, "late", 1)]),  # once per batch
            ("wm", 13, []),  # 9 + 5 = 14 > 13: state still kept
            ("batch", [("a", 5)], [("a", 0, 10, 4, "late", 2)]),
            ("wm", 14, []),  # expired now
            ("batch", [("a", 6)], [("LATE-OUT", "a", 6)]),
        ],
    ),
    "a late element for a window never seen, within lateness, fires at once": (
        WindowedAggregation(Tumbling(10), Count(), allowed_lateness_us=20),
        [
            ("wm", 25, []),
            ("batch", [("z", 3)], [("z", 0, 10, 1, "late", 0)]),
            ("wm", 29, []),  # 9 + 20 = 29: expired, and it never fires again
            ("batch", [("z", 4)], [("LATE-OUT", "z", 4)]),
        ],
    ),
    "empty windows never emit": (
        WindowedAggregation(Tumbling(10), Count()),
        [
            ("batch", [("a", 5), ("a", 45)], []),
            ("wm", 100, [("a", 0, 10, 1, "on_time", 0), ("a", 40, 50, 1, "on_time", 0)]),
        ],
    ),
    "negative times fall in epoch-aligned windows": (
        WindowedAggregation(Tumbling(10), Count()),
        [
            ("batch", [("a", -1), ("a", -10), ("a", -11), ("a", 0)], []),
            (
                "wm",
                0,
                [("a", -20, -10, 1, "on_time", 0), ("a", -10, 0, 2, "on_time", 0)],
            ),
        ],
    ),
    "offset shifts the alignment": (
        WindowedAggregation(Tumbling(10, offset_us=3), Count()),
        [
            ("batch", [("a", 2), ("a", 3), ("a", 12)], []),
            ("wm", 12, [("a", -7, 3, 1, "on_time", 0), ("a", 3, 13, 2, "on_time", 0)]),
        ],
    ),
    "sliding: an element is in size/slide windows; late only when all expired": (
        WindowedAggregation(Sliding(10, 5), Count(), allowed_lateness_us=0),
        [
            ("batch", [("a", 7)], []),  # windows [5,15) and [0,10)
            ("wm", 9, [("a", 0, 10, 1, "on_time", 0)]),
            # ts 8 is in [0,10) (expired) and [5,15) (open): not late, counted once
            ("batch", [("a", 8)], []),
            ("wm", 14, [("a", 5, 15, 2, "on_time", 0)]),
            ("batch", [("a", 8)], [("LATE-OUT", "a", 8)]),
        ],
    ),
    "session: merges when touching (exactly gap apart), fires at end of merged window": (
        WindowedAggregation(Session(10), Count()),
        [
            ("batch", [("a", 0), ("a", 10)], []),  # [0,10) and [10,20) touch: one session
            ("batch", [("a", 35)], []),  # 35 >= 20: a new session [35,45)
            ("wm", 19, [("a", 0, 20, 2, "on_time", 0)]),
            ("wm", 44, [("a", 35, 45, 1, "on_time", 0)]),
        ],
    ),
    "session: a bridging element merges two sessions (one of them fired)": (
        WindowedAggregation(Session(10), Count(), allowed_lateness_us=100),
        [
            ("batch", [("a", 0), ("a", 25)], []),  # [0,10) and [25,35)
            ("wm", 12, [("a", 0, 10, 1, "on_time", 0)]),
            # [12,22) touches neither [0,10) nor [25,35); its end is ahead of W: it waits
            ("batch", [("a", 12)], []),
            # [9,19) touches [0,10) and overlaps [12,22): one session [0,22), which
            # fires again (pane 1) when W passes its new end
            ("batch", [("a", 9)], []),
            ("wm", 21, [("a", 0, 22, 3, "on_time", 1)]),
            ("batch", [("a", 5)], [("a", 0, 22, 4, "late", 2)]),  # inside: no merge
            ("wm", 34, [("a", 25, 35, 1, "on_time", 0)]),
        ],
    ),
    "session: merge happens before the lateness check": (
        WindowedAggregation(Session(10), Count(), allowed_lateness_us=0),
        [
            ("batch", [("a", 20)], []),  # [20,30)
            ("wm", 15, []),
            # [8,18) alone would be expired (17 <= 15? no: 17 > 15, not expired) ...
            # [3,13) alone is expired (12 <= 15), but it touches nothing: late
            ("batch", [("a", 3)], [("LATE-OUT", "a", 3)]),
            # [11,21) is expired on its own? 20 > 15: not expired; merges with [20,30)
            ("batch", [("a", 11)], []),
            ("wm", 29, [("a", 11, 30, 2, "on_time", 0)]),
        ],
    ),
    "discarding mode: later panes carry only new elements": (
        WindowedAggregation(
            Tumbling(10), Count(), allowed_lateness_us=50, accumulation=Accumulation.DISCARDING
        ),
        [
            ("batch", [("a", 1), ("a", 2)], []),
            ("wm", 9, [("a", 0, 10, 2, "on_time", 0)]),
            ("batch", [("a", 3)], [("a", 0, 10, 1, "late", 1)]),
            ("batch", [("a", 4), ("a", 5)], [("a", 0, 10, 2, "late", 2)]),
        ],
    ),
    "end of input fires everything": (
        WindowedAggregation(Session(5), Count()),
        [
            ("batch", [("a", 100), ("b", 7)], []),
            (
                "wm",
                MAX_TIMESTAMP,
                [("b", 7, 12, 1, "on_time", 0), ("a", 100, 105, 1, "on_time", 0)],
            ),
        ],
    ),
}


@pytest.mark.parametrize("columnar", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_window_table(name: str, columnar: bool) -> None:
    op, steps = CASES[name]
    op = copy.deepcopy(op)
    op._vectorized = op._vectorized and columnar  # the per-row path must agree
    run(op, steps)


@pytest.mark.parametrize("name", list(CASES))
def test_oracle_agrees_with_the_table(name: str) -> None:
    """The oracle gives the same answers as the hand-written table (it checks itself)."""
    op, steps = CASES[name]
    op = copy.deepcopy(op)
    a = op.assigner
    if isinstance(a, Session):
        oracle = Oracle("session", gap=a.gap_us, lateness=op.allowed_lateness_us)
    else:
        assert isinstance(a, Sliding)
        oracle = Oracle(
            "sliding",
            size=a.size_us,
            slide=a.slide_us,
            offset=a.offset_us,
            lateness=op.allowed_lateness_us,
        )
    oracle.discarding = op.accumulation is Accumulation.DISCARDING
    for kind, arg, expected in steps:
        if kind == "batch":
            fired, late = oracle.batch([(k, t, None) for k, t in arg])
            got = fired + [("LATE-OUT", k, t) for k, t, _ in late]
        else:
            got = oracle.advance(arg)
        assert got == expected


def test_per_event_and_micro_batch_judge_against_different_watermarks() -> None:
    """In one batch, an element is judged against W at the batch start, not W after it."""
    batch_op = WindowedAggregation(Tumbling(10), Count())
    fired, late = batch_op.process(["a", "a"], [25, 3])
    assert late == []
    assert fired == []
    event_op = WindowedAggregation(Tumbling(10), Count())
    event_op.process(["a"], [25])
    event_op.advance(20)  # a watermark moved by the first element
    _, late = event_op.process(["a"], [3])
    assert [el.event_time for el in late] == [3]


def test_early_firing_on_processing_time() -> None:
    op = WindowedAggregation(Tumbling(100), Count(), early_every_us=1_000)
    op.process(["a"], [10])
    assert op.on_processing_time(0) == []  # the first call starts the schedule
    op.process(["a"], [20])
    assert op.on_processing_time(999) == []
    early = op.on_processing_time(1_000)
    assert as_tuples(early) == [("a", 0, 100, 2, "early", 0)]
    assert op.on_processing_time(2_500) == []  # nothing new: no repeat
    op.process(["a"], [30])
    assert as_tuples(op.on_processing_time(3_000)) == [("a", 0, 100, 3, "early", 1)]
    assert as_tuples(op.advance(99)) == [("a", 0, 100, 3, "on_time", 2)]
    op.process(["b"], [150])
    assert as_tuples(op.on_processing_time(4_000)) == [("b", 100, 200, 1, "early", 0)]


def test_early_firing_in_discarding_mode_does_not_emit_empty_on_time() -> None:
    op = WindowedAggregation(
        Tumbling(100), Count(), early_every_us=10, accumulation=Accumulation.DISCARDING
    )
    op.on_processing_time(0)
    op.process(["a"], [10])
    assert as_tuples(op.on_processing_time(10)) == [("a", 0, 100, 1, "early", 0)]
    assert op.advance(99) == []  # nothing new since the early pane: nothing to emit


@pytest.mark.parametrize(
    ("agg", "values", "expected"),
    [
        (Sum(), [1.5, 2.5, 4.0], 8.0),
        (Min(), [3.0, 1.5, 2.0], 1.5),
        (Max(), [3.0, 1.5, 2.0], 3.0),
        (Mean(), [1.0, 2.0, 6.0], 3.0),
        (Collect(), ["x", "y", "z"], ["x", "y", "z"]),
    ],
)
@pytest.mark.parametrize("columnar", [True, False])
def test_aggregations_fold_values(
    agg: Any, values: list[Any], expected: Any, columnar: bool
) -> None:
    op = WindowedAggregation(Tumbling(10), agg)
    op._vectorized = op._vectorized and columnar
    op.process(["k"] * 2, [1, 2], values[:2])
    op.process(["k"], [3], values[2:])  # two batches: partial results are combined
    [r] = op.advance(9)
    assert r.value == expected


def test_vectorized_and_row_paths_agree_on_a_large_batch() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    keys = rng.choice(np.array(["a", "b", "c", "d"]), 5000)
    times = rng.integers(-500, 5000, 5000)
    values = rng.random(5000)
    fast = WindowedAggregation(Sliding(100, 25), Sum(), allowed_lateness_us=30)
    slow = WindowedAggregation(Sliding(100, 25), Sum(), allowed_lateness_us=30)
    slow._vectorized = False
    assert fast._vectorized
    for op in (fast, slow):
        op.advance(1000)
    f_fired, f_late = fast.process(keys, times, values)
    s_fired, s_late = slow.process(list(keys), times.tolist(), values.tolist())
    assert [el.index for el in f_late] == [el.index for el in s_late]
    assert len(f_late) > 0
    assert _rounded(f_fired) == _rounded(s_fired)
    assert f_fired
    assert _rounded(fast.finish()) == _rounded(slow.finish())


def _rounded(results: list[Any]) -> list[tuple[Any, ...]]:
    return [(*t[:3], round(t[3], 9), *t[4:]) for t in as_tuples(results)]


def test_snapshot_and_restore_continue_identically() -> None:
    import msgspec

    def make() -> WindowedAggregation:
        return WindowedAggregation(Session(10), Count(), allowed_lateness_us=15)

    first = make()
    first.process([("t", "a"), ("t", "b")], [5, 8])
    first.advance(14)
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(first.snapshot()))
    second = make()
    second.restore(saved)
    for op in (first, second):
        op.process([("t", "a")], [12])
    assert as_tuples(first.advance(40)) == as_tuples(second.advance(40))
    assert first.snapshot() == second.snapshot()


def test_window_definitions_are_checked() -> None:
    with pytest.raises(ConfigError, match="slide"):
        Sliding(10, 20)
    with pytest.raises(ConfigError, match="positive"):
        Session(0)
    with pytest.raises(ValueError, match="allowed_lateness"):
        WindowedAggregation(Tumbling(10), Count(), allowed_lateness_us=-1)
    with pytest.raises(ValueError, match="same length"):
        WindowedAggregation(Tumbling(10), Count()).process(["a"], [1, 2])
    assert Window(0, 10).max_timestamp == 9


@pytest.mark.parametrize("agg", [Count(), Sum(), Mean()])
def test_column_store_snapshot_and_restore_continue_identically(agg: Any) -> None:
    import msgspec

    def make() -> WindowedAggregation:
        return WindowedAggregation(Sliding(10, 5), agg, allowed_lateness_us=8)

    first = make()
    assert first._columnar() is not None
    first.process(["a", "b", "a"], [1, 4, 12], [1.0, 2.0, 3.0])
    first.advance(13)
    saved = msgspec.msgpack.decode(msgspec.msgpack.encode(first.snapshot()))
    second = make()
    second.restore(saved)
    assert second.open_windows == first.open_windows > 0
    for op in (first, second):
        fired, _ = op.process(["a", ("t", "b")], [9, 15], [4.0, 5.0])
        assert as_tuples(fired)  # [5, 15) was behind W: it re-fires
    assert as_tuples(first.advance(40)) == as_tuples(second.advance(40))
    assert first.snapshot() == second.snapshot()
    # The row layout gives the same checkpoint for the same input.
    rows = make()
    rows._vectorized = False
    rows.process(["a", "b", "a"], [1, 4, 12], [1.0, 2.0, 3.0])
    rows.advance(13)
    assert sorted(map(repr, rows.snapshot()["windows"])) == sorted(map(repr, saved["windows"]))
