from __future__ import annotations

from streamrag.batching import MicroBatcher
from streamrag.changes import Change, ChangeBatch, Op
from streamrag.testing import ManualClock


def _batch(n: int, start: int = 0) -> ChangeBatch:
    return ChangeBatch.from_changes(
        [Change("t", f"d{i}", Op.DELETE, i, {}, "s", i) for i in range(start, start + n)]
    )


def test_flushes_at_size_before_the_deadline() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(max_batch_size=4, max_delay_ms=1000, clock=clock)
    b.add(_batch(3))
    assert not b.due()
    assert not b.full
    b.add(_batch(3, 3))
    assert b.full
    assert b.due()
    taken = b.take()
    assert taken.changes.doc_ids == ["d0", "d1", "d2", "d3"]  # oldest first, capped at size
    assert b.pending == 2
    assert not b.due()


def test_flushes_at_the_deadline_counted_from_the_oldest_arrival() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(max_batch_size=100, max_delay_ms=20, clock=clock)
    assert b.wait_us() is None
    b.add(_batch(1))
    clock.advance_ms(15)
    b.add(_batch(1, 1))  # a later arrival does not push the deadline back
    assert b.wait_us() == 5_000
    clock.advance_ms(4)
    assert not b.due()
    clock.advance_ms(1)
    assert b.due()
    taken = b.take()
    assert len(taken.changes) == 2
    assert taken.first_arrival_us == 0


def test_put_back_keeps_order_and_arrival() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(max_batch_size=2, max_delay_ms=20, clock=clock)
    b.add(_batch(3))
    first = b.take()
    b.put_back(first)
    assert b.pending == 3
    assert b.take().changes.doc_ids == ["d0", "d1"]


def test_zero_delay_flushes_at_once() -> None:
    b = MicroBatcher(max_batch_size=100, max_delay_ms=0, clock=ManualClock(0))
    b.add(_batch(1))
    assert b.due()
