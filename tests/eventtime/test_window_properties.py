"""Property tests: the operator equals the oracle, and arrival order within the bound is moot."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.eventtime import (
    Accumulation,
    Collect,
    Count,
    Global,
    Session,
    Sliding,
    Trigger,
    WindowedAggregation,
)
from streamrag.eventtime.windows import WindowAssigner
from streamrag.timing import MAX_TIMESTAMP, MIN_TIMESTAMP
from tests.eventtime.oracle import Oracle, as_tuples

KEYS = st.sampled_from(["a", "b", "c"])


@st.composite
def assigners(draw: st.DrawFn) -> tuple[WindowAssigner, Oracle]:
    kind = draw(st.sampled_from(["tumbling", "sliding", "session", "global"]))
    if kind == "global":
        return Global(), Oracle("global")
    if kind == "session":
        gap = draw(st.integers(1, 30))
        return Session(gap), Oracle("session", gap=gap)
    size = draw(st.integers(1, 40))
    slide = size if kind == "tumbling" else draw(st.integers(1, size))
    offset = draw(st.integers(-20, 20))
    return Sliding(size, slide, offset), Oracle("sliding", size=size, slide=slide, offset=offset)


@given(
    spec=assigners(),
    lateness=st.integers(0, 30),
    discarding=st.booleans(),
    count=st.none() | st.integers(1, 4),
    purge=st.booleans(),
    collect=st.booleans(),
    bound=st.integers(0, 20),
    events=st.lists(st.tuples(KEYS, st.integers(-60, 200)), max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=8),
    per_event=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_operator_matches_oracle(
    spec: tuple[WindowAssigner, Oracle],
    lateness: int,
    discarding: bool,
    count: int | None,
    purge: bool,
    collect: bool,
    bound: int,
    events: list[tuple[str, int]],
    cuts: list[int],
    per_event: bool,
) -> None:
    assigner, oracle = spec
    op = WindowedAggregation(
        assigner,
        Collect() if collect else Count(),
        allowed_lateness_us=lateness,
        accumulation=Accumulation.DISCARDING if discarding else Accumulation.ACCUMULATING,
        trigger=Trigger(count=count, purge=purge),
    )
    # A purging trigger is discarding accumulation.
    oracle.lateness, oracle.discarding, oracle.count = lateness, discarding or purge, count
    oracle.agg = list if collect else len
    bounds = [0, *sorted({c for c in cuts if c < len(events)}), len(events)]
    if per_event:
        bounds = list(range(len(events) + 1))
    max_seen = MIN_TIMESTAMP
    for lo, hi in itertools.pairwise(bounds):
        batch = events[lo:hi]
        if not batch:
            continue
        values = list(range(lo, hi))
        fired, late = op.process([k for k, _ in batch], [t for _, t in batch], values)
        o_fired, o_late = oracle.batch([(k, t, v) for (k, t), v in zip(batch, values, strict=True)])
        assert as_tuples(fired) == o_fired
        assert [(el.key, el.event_time, el.value) for el in late] == o_late
        max_seen = max(max_seen, *(t for _, t in batch))
        wm = max_seen - bound - 1
        assert as_tuples(op.advance(wm)) == oracle.advance(wm)
    assert as_tuples(op.finish()) == oracle.advance(MAX_TIMESTAMP)
    assert op.open_windows == 0


@st.composite
def bounded_shuffles(draw: st.DrawFn) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Events, and the same events arriving in another order at most ``bound`` late."""
    bound = draw(st.integers(0, 25))
    events = draw(st.lists(st.tuples(KEYS, st.integers(0, 300)), min_size=1, max_size=50))
    jitter = draw(st.lists(st.integers(0, bound), min_size=len(events), max_size=len(events)))
    # An event may arrive after any event up to `bound` newer than it: sort by ts + jitter.
    order = sorted(range(len(events)), key=lambda i: (events[i][1] + jitter[i], i))
    return bound, sorted(events, key=lambda e: e[1]), [events[i] for i in order]


@given(
    case=bounded_shuffles(),
    spec=assigners(),
    batch_size=st.integers(1, 10),
)
@settings(max_examples=200, deadline=None)
def test_arrival_order_within_the_bound_gives_the_same_results(
    case: tuple[int, list[tuple[str, int]], list[tuple[str, int]]],
    spec: tuple[WindowAssigner, Oracle],
    batch_size: int,
) -> None:
    bound, in_order, shuffled = case
    finals = []
    for arrival in (in_order, shuffled):
        op = WindowedAggregation(spec[0], Count())
        out: list[Any] = []
        max_seen = MIN_TIMESTAMP
        for lo in range(0, len(arrival), batch_size):
            batch = arrival[lo : lo + batch_size]
            fired, late = op.process([k for k, _ in batch], [t for _, t in batch])
            assert late == []  # within the bound nothing is late
            out += fired
            max_seen = max(max_seen, *(t for _, t in batch))
            out += op.advance(max_seen - bound - 1)
        out += op.finish()
        assert {r.timing.value for r in out} <= {"on_time"}  # each window fires once, complete
        finals.append(sorted(as_tuples(out), key=repr))
    assert finals[0] == finals[1]
