from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.batching import AdaptiveController, MicroBatcher, PartitionKey, PendingBatch
from streamrag.changes import Change, ChangeBatch, Op
from streamrag.testing import ManualClock

DAY = 86_400_000_000


def _batch(n: int, start: int = 0, *, domain: str = "", t: int | None = None) -> ChangeBatch:
    return ChangeBatch.from_changes(
        [
            Change("t", f"d{i}", Op.UPSERT, i if t is None else t, {"domain": domain}, "s", i)
            for i in range(start, start + n)
        ]
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
    assert taken.reason == "size"
    assert taken.changes.doc_ids == ["d0", "d1", "d2", "d3"]  # oldest first, capped at size
    assert b.pending == 2
    assert not b.due()


def test_size_counts_chunks_and_tokens() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(max_batch_size=10, max_batch_tokens=100, max_delay_ms=1000, clock=clock)
    b.add(_batch(3), chunks=[4, 4, 4], tokens=[10, 10, 10])
    assert b.due()  # 12 chunks >= 10
    taken = b.take()
    assert (taken.chunks, len(taken.changes)) == (8, 2)  # a third change would pass 10
    b.take()
    b.add(_batch(3), chunks=[1, 1, 1], tokens=[60, 60, 60])
    assert b.due()  # 180 tokens >= 100
    taken = b.take()
    assert (taken.tokens, len(taken.changes)) == (60, 1)
    b.add(_batch(1, 10), chunks=[50], tokens=[500])
    b.take(), b.take()
    big = b.take()
    assert big.chunks == 50  # one change larger than the batch still goes, alone


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
    assert taken.reason == "deadline"


def test_partitions_keep_batches_topically_local() -> None:
    clock = ManualClock(0)
    key = PartitionKey(("tenant", "domain"))
    b = MicroBatcher(max_batch_size=3, max_delay_ms=1000, clock=clock, partition=key)
    b.add(_batch(2, 0, domain="hr"))
    b.add(_batch(2, 2, domain="ops"))
    b.add(_batch(2, 4, domain="hr"))
    assert b.partitions == 2
    taken = b.take()  # hr has 4 >= 3 chunks
    assert taken.changes.doc_ids == ["d0", "d1", "d4"]
    assert {p["domain"] for p in taken.changes.payloads} == {"hr"}


def test_a_deadline_batch_takes_every_expired_partition() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(
        max_batch_size=100, max_delay_ms=10, clock=clock, partition=PartitionKey(("domain",))
    )
    for i, domain in enumerate(["a", "b", "c"]):
        b.add(_batch(1, i, domain=domain))
    clock.advance_ms(10)
    taken = b.take()
    assert sorted(taken.changes.doc_ids) == ["d0", "d1", "d2"]
    assert b.pending == 0


def test_watermark_closes_a_date_bucket() -> None:
    clock = ManualClock(0)
    key = PartitionKey(("tenant", "date"), bucket_us=DAY)
    b = MicroBatcher(max_batch_size=100, max_delay_ms=60_000, clock=clock, partition=key)
    b.add(_batch(2, t=DAY + 5))  # in the bucket [DAY, 2 DAY)
    b.set_watermark(2 * DAY - 2)
    assert not b.due()
    b.set_watermark(2 * DAY - 1)
    assert b.due()
    assert b.take().reason == "watermark"


def test_ticks_align_deadlines_to_the_schedule() -> None:
    clock = ManualClock(1_003_000)  # 3 ms past a 10 ms tick
    b = MicroBatcher(max_batch_size=100, max_delay_ms=50, clock=clock, tick_us=10_000)
    b.add(_batch(1))
    assert b.wait_us() == 7_000  # the next tick, sooner than max_delay


def test_put_back_keeps_order_arrival_and_sizes() -> None:
    clock = ManualClock(0)
    b = MicroBatcher(
        max_batch_size=2, max_delay_ms=20, clock=clock, partition=PartitionKey(("domain",))
    )
    b.add(_batch(3, domain="x"), chunks=[1, 1, 1], tokens=[5, 6, 7])
    first = b.take()
    b.put_back(first)
    assert b.pending == 3
    assert b.pending_chunks == 3
    again = b.take()
    assert again.changes.doc_ids == ["d0", "d1"]
    assert again.tokens == 11
    assert again.first_arrival_us == 0


def test_the_deadline_counts_from_the_arrival_and_the_read_is_kept_apart() -> None:
    """A change found after an idle poll is due from that poll; it was read later."""
    clock = ManualClock(100_000)
    b = MicroBatcher(
        max_batch_size=10, max_delay_ms=20, clock=clock, partition=PartitionKey(("domain",))
    )
    b.add(_batch(1, domain="x"), arrived_us=85_000, read_us=99_000)
    b.add(_batch(1, 1, domain="y"), read_us=100_000)  # arrived when read
    clock.advance_ms(5)  # 105 ms: 20 ms after the first one's arrival
    first = b.take()
    assert first.reason == "deadline"
    assert (first.first_arrival_us, first.read_us) == (85_000, 99_000)
    b.put_back(first)  # a failed commit keeps both
    again = b.take(max_chunks=1)
    assert (again.first_arrival_us, again.read_us) == (85_000, 99_000)
    rest = b.take()
    assert (rest.first_arrival_us, rest.read_us) == (100_000, 100_000)
    merged = PendingBatch.merge([again, rest])
    assert (merged.first_arrival_us, merged.read_us) == (85_000, 99_000)
    b.put_back(merged)  # pieces of a merged batch keep their own times
    assert (b.take().read_us, b.take().read_us) == (99_000, 100_000)


def test_zero_delay_flushes_at_once() -> None:
    b = MicroBatcher(max_batch_size=100, max_delay_ms=0, clock=ManualClock(0))
    b.add(_batch(1))
    assert b.due()


@given(
    ops=st.lists(
        st.tuples(
            st.integers(0, 30_000),  # processing time to let pass (µs)
            st.integers(0, 5),  # changes to add
            st.sampled_from(["a", "b", "c"]),  # their domain
            st.integers(1, 6),  # chunks each
        ),
        max_size=80,
    ),
    max_delay_ms=st.integers(0, 25),
    max_size=st.integers(1, 12),
    tick=st.one_of(st.none(), st.integers(1_000, 40_000)),
)
@settings(max_examples=200, deadline=None)
def test_no_change_is_held_past_max_delay(
    ops: list[tuple[int, int, str, int]],
    max_delay_ms: int,
    max_size: int,
    tick: int | None,
) -> None:
    """Driven like the runner drives it — wake at wait_us(), take while due — no change
    waits longer than max_delay_ms, whatever the sizes, partitions and ticks."""
    clock = ManualClock(0)
    b = MicroBatcher(
        max_batch_size=max_size,
        max_delay_ms=max_delay_ms,
        clock=clock,
        partition=PartitionKey(("domain",)),
        tick_us=tick,
        max_pending=10_000,
    )
    arrived: dict[str, int] = {}
    weight: dict[str, int] = {}
    seq = 0

    def drain() -> None:
        while b.due():
            taken = b.take()
            for doc in taken.changes.doc_ids:
                assert clock.now_us() - arrived.pop(doc) <= max_delay_ms * 1000
        # whatever is still waiting is within its deadline, and counted right
        assert all(clock.now_us() - t <= max_delay_ms * 1000 for t in arrived.values())
        assert b.pending == len(arrived)
        assert b.pending_chunks == sum(weight[d] for d in arrived)

    def sleep(wait: int) -> None:
        while wait > 0:  # wake at the sooner of the wake-up and the batcher's deadline
            left = b.wait_us()
            step = wait if left is None else min(wait, max(left, 1))
            clock.advance_us(step)
            wait -= step
            drain()

    for wait, n, domain, chunks in ops:
        sleep(wait)
        docs = [
            Change("t", f"x{seq + i}", Op.UPSERT, 0, {"domain": domain}, "s", seq + i)
            for i in range(n)
        ]
        for d in docs:
            arrived[d.doc_id] = clock.now_us()
            weight[d.doc_id] = chunks
        seq += n
        b.add(ChangeBatch.from_changes(docs), chunks=[chunks] * n)
        drain()
    sleep(max_delay_ms * 1000 + 1)
    assert not arrived
    assert b.pending == 0


def test_controller_converges_to_the_latency_target() -> None:
    """Synthetic embedder: latency = 5 ms + 0.5 ms per chunk; a 50 ms target means 90."""
    c = AdaptiveController(min_size=1, max_size=1024, target_latency_s=0.050, initial=4)
    seen = []
    for _ in range(30):
        n = c.target
        latency = 0.005 + 0.0005 * n
        c.observe(n, latency, queued=10_000)  # work is always waiting
        seen.append(c.target)
    assert seen[-1] == pytest.approx(90, abs=2)
    assert max(seen[-10:]) - min(seen[-10:]) <= 2  # settled, no oscillation
    assert all(0.005 + 0.0005 * n <= 0.0506 for n in seen[-10:])


def test_controller_holds_without_queued_work_and_respects_bounds() -> None:
    c = AdaptiveController(min_size=2, max_size=64, target_latency_s=0.1, initial=8)
    assert c.observe(3, 0.001, queued=0) == "hold"  # small batch, nothing waiting
    assert c.target == 8
    for _ in range(10):
        c.observe(c.target, 0.001, queued=10_000)
    assert c.target == 64
    for _ in range(10):
        c.observe(c.target, 10.0, queued=10_000)
    assert c.target == 2
    assert [d.action for d in c.history[-2:]] == ["hold", "hold"]
    with pytest.raises(ValueError, match="min_size"):
        AdaptiveController(min_size=5, max_size=4, target_latency_s=1)


def test_partition_key_fields() -> None:
    key = PartitionKey(("tenant", "domain", "date"), bucket_us=DAY)
    batch = _batch(2, domain="ops", t=DAY * 3 + 7)
    assert key.keys(batch) == [("t", "ops", 3 * DAY)] * 2
    assert key.bucket_end(("t", "ops", 3 * DAY)) == 4 * DAY
    assert PartitionKey(("domain",)).bucket_end(("ops",)) is None
    assert np.all(batch.event_times == DAY * 3 + 7)
