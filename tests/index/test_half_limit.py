"""How many queries a call go through the half-precision copies: measured on this CPU."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.config import IndexSettings
from streamrag.index import LsmIndex, LsmSpec, SearchFilter, half_limit, search
from streamrag.index.ann import AnnSpec
from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.compaction import CompactionSpec
from streamrag.index.factory import lsm_spec
from streamrag.index.half_limit import (
    QUIET_S,
    MeasurementCancelled,
    MeasurementPostponed,
    Quiet,
    measure_half_limit,
    others_cpu_s,
)
from streamrag.index.scan_helpers import ScanHelpers
from streamrag.index.search import (
    DEFAULT_HALF_QUERIES,
    SearchTuning,
    _Half,
    half_query_limit,
    set_half_query_limit,
)
from streamrag.testing import ScriptedSource, change_line
from tests.conftest import PipelineFactory

DIM = 32


@pytest.fixture(autouse=True)
def _fresh_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process that has measured nothing."""
    monkeypatch.setattr(search, "_half_limits", {})
    monkeypatch.setattr(half_limit, "_measured", set())


def _scripted(monkeypatch: pytest.MonkeyPatch, copies_win: Callable[[int], bool]) -> list[int]:
    """Timings the copies win at the sizes ``copies_win`` says; returns the sizes timed."""
    sizes: list[int] = []

    def best_of(
        copies: partial[Any], float32: partial[Any], quiet: Quiet | None
    ) -> tuple[float, float]:
        m = copies.args[1].shape[0]  # search_segments(views, queries, k, spec, epoch, tuning)
        assert copies.args[5].half_max_queries == m  # through the copies
        assert float32.args[5].half_max_queries == 0  # the same search in float32
        sizes.append(m)
        return (1.0, 2.0) if copies_win(m) else (2.0, 1.0)

    monkeypatch.setattr(half_limit, "_best_of", best_of)
    return sizes


def test_the_limit_is_the_last_size_of_the_run_the_copies_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sizes = _scripted(monkeypatch, lambda m: m <= 3)
    assert half_query_limit(DIM) == DEFAULT_HALF_QUERIES  # not measured yet
    assert measure_half_limit(DIM, 1024, SearchTuning()) == 3
    assert half_query_limit(DIM) == 3
    assert sizes == [1, 2, 3, 4]  # stops at the first size float32 wins


def test_a_later_win_does_not_extend_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, lambda m: m in (1, 5))
    assert measure_half_limit(DIM, 1024, SearchTuning()) == 1


def test_copies_that_never_win_are_never_searched_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _scripted(monkeypatch, lambda m: False)
    assert measure_half_limit(DIM, 1024, SearchTuning()) == 0


def test_measured_once_per_process_and_width(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = _scripted(monkeypatch, lambda m: m <= 2)
    measure_half_limit(DIM, 1024, SearchTuning())
    timed = len(sizes)
    assert measure_half_limit(DIM, 1024, SearchTuning()) == 2
    assert len(sizes) == timed  # not measured again
    measure_half_limit(DIM * 2, 1024, SearchTuning())
    assert len(sizes) == 2 * timed  # another width is


def test_a_real_measurement_times_the_search_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unscripted: the synthetic segments are searched both ways, size by size, in order."""
    calls: list[tuple[int, int | None]] = []
    real = search.search_segments

    def spy(views: Any, q: np.ndarray, *args: Any) -> Any:
        calls.append((q.shape[0], args[-1].half_max_queries))
        return real(views, q, *args)

    monkeypatch.setattr(half_limit, "search_segments", spy)
    limit = measure_half_limit(16, 1024, SearchTuning(scan_threads=1))
    assert limit in (0, *half_limit._SIZES)
    assert half_query_limit(16) == limit
    sizes = list(dict.fromkeys(m for m, _ in calls))
    timed = half_limit._SIZES[: len(sizes)]
    assert sizes == list(timed)  # from one query up, stopping at the first loss
    for m in sizes:  # each size through the copies and in float32, five times each
        assert calls.count((m, m)) == half_limit._TRIES
        assert calls.count((m, 0)) == half_limit._TRIES
    won = [m for m in sizes if m <= limit]
    assert won == list(half_limit._SIZES[: len(won)])
    assert limit == (won[-1] if won else 0)


def _commit(index: LsmIndex, rows: np.ndarray, first: int = 0) -> None:
    """One commit of a document per row, ``d<first>`` on (each its chunk id)."""
    n = rows.shape[0]
    ids = np.arange(first, first + n, dtype=np.int64)
    index.commit(
        CommitBatch(
            docs=[
                DocOp("default", f"d{i}", Op.UPSERT, 1_000 + i, i, "src", "", k, 1)
                for k, i in enumerate(ids.tolist())
            ],
            chunk_ids=ids,
            positions=np.zeros(n, np.int32),
            texts=["x"] * n,
            hashes=[b"h"] * n,
            vectors=rows,
            embedder_version="test",
        )
    )


def _spec(tuning: SearchTuning | None = None) -> LsmSpec:
    """Small segments (250 rows), no ANN, a half-precision copy for any of them."""
    return LsmSpec(
        seal_rows=250,
        ann=AnnSpec(min_rows=2**62),
        compaction=CompactionSpec(fanout=64, seal_rows=250),
        tuning=replace(tuning or SearchTuning(), half_min_rows=1, half_min_bytes=0),
        wal_fsync=False,
    )


def _index_with_copies(tuning: SearchTuning) -> LsmIndex:
    index = LsmIndex(DIM, _spec(tuning), background=False)
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((1000, DIM)).astype(np.float32)
    _commit(index, rows / np.linalg.norm(rows, axis=1, keepdims=True))
    index.seal_all()
    index.maintain()
    assert index.health().half_segments > 0, "no copies: this tests nothing"
    return index


def _through_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch sizes searched through a copy from now on."""
    seen: list[int] = []
    search_one = _Half.search

    def spy(self: _Half, q: np.ndarray, k: int) -> None:
        seen.append(q.shape[0])
        search_one(self, q, k)

    monkeypatch.setattr(_Half, "search", spy)
    return seen


def test_the_maintenance_measures_before_the_first_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def measured(
        dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None
    ) -> tuple[int, dict[int, float]]:
        calls.append((dim, segment_rows))
        assert quiet is None  # maintain() called in the foreground: nothing to wait for
        return 2, {}

    monkeypatch.setattr(half_limit, "_measure", measured)
    index = _index_with_copies(SearchTuning())
    assert calls == [(DIM, 250)]  # once, for the index's width and segment size
    seen = _through_copies(monkeypatch)
    queries = np.eye(DIM, dtype=np.float32)
    index.search_many(queries[:2], 5, SearchFilter())
    assert set(seen) == {2}  # every copy, at that size
    seen.clear()
    index.search_many(queries[:3], 5, SearchFilter())
    assert seen == []  # past the measured limit: the float32 product


def test_a_set_limit_is_kept_and_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(half_limit, "_measure", lambda *a: pytest.fail("measured"))
    index = _index_with_copies(SearchTuning(half_max_queries=5))
    set_half_query_limit(DIM, 1)  # what another index of this width measured
    seen = _through_copies(monkeypatch)
    index.search_many(np.eye(DIM, dtype=np.float32)[:5], 5, SearchFilter())
    assert set(seen) == {5}


def test_the_setting_sets_the_limit_and_zero_measures() -> None:
    assert lsm_spec(IndexSettings()).tuning.half_max_queries is None
    assert lsm_spec(IndexSettings(half_max_queries=4)).tuning.half_max_queries == 4


def test_no_copy_is_made_where_none_would_be_searched_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(half_limit, "_measure", lambda *a: (0, {}))
    index = LsmIndex(DIM, _spec(), background=False)
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((1000, DIM)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    _commit(index, rows)
    index.seal_all()
    index.maintain()
    assert index.health().half_segments == 0
    assert index.last_maintenance_error is None  # declined, not failed
    _, hits = index.search_many(rows[:3], 1, SearchFilter())
    assert [h[0].chunk_id for h in hits] == [0, 1, 2]


# -- timed in the gaps between queries and commits ------------------------------


class _Script:
    """A scripted process: ``busy`` answers from a list, ``pause`` advances a clock.

    ``others_cpu`` advances by ``others_share`` of each pause: the CPU the
    process's other threads use meanwhile.
    """

    def __init__(
        self, busy: list[bool], closing_after: int | None = None, others_share: float = 0.0
    ) -> None:
        self.answers = list(busy)
        self.now = 0.0
        self.cpu = 0.0
        self.others_share = others_share
        self.pauses: list[float] = []
        self.closing_after = closing_after

    def busy(self) -> bool:
        return self.answers.pop(0) if self.answers else False

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        self.cpu += self.others_share * seconds

    def closing(self) -> bool:
        return self.closing_after is not None and len(self.pauses) >= self.closing_after

    def quiet(self, budget_s: float = 5.0) -> Quiet:
        return Quiet(
            self.busy,
            self.pause,
            self.closing,
            clock=lambda: self.now,
            budget_s=budget_s,
            others_cpu=lambda: self.cpu,
        )


def test_a_quiet_process_is_timed_back_to_back_after_one_quiet_spell() -> None:
    script = _Script([False, False, False])
    quiet = script.quiet()
    for _ in range(3):
        quiet.wait()
    assert script.pauses == [QUIET_S]  # the first spell only: nothing came since


def test_after_a_query_or_commit_a_timing_waits_for_a_quiet_spell() -> None:
    # a quiet spell; then something came; then: busy, busy, quiet -> three more pauses
    script = _Script([False, True, True, True, False])
    quiet = script.quiet()
    quiet.wait()
    quiet.wait()
    assert script.pauses == [QUIET_S] * 4
    assert quiet.waited_s == pytest.approx(4 * QUIET_S)


def test_a_spell_the_other_threads_were_busy_in_is_not_quiet() -> None:
    """A bulk load reads and chunks between its commits: no commit came, yet not quiet."""
    busy = _Script([], others_share=0.5)  # another thread on half a core, nothing else
    with pytest.raises(MeasurementPostponed):
        busy.quiet(budget_s=0.1).wait()
    assert sum(busy.pauses) == pytest.approx(0.1)  # every spell judged, none quiet
    idle = _Script([], others_share=half_limit.OTHERS_SHARE / 2)  # an event loop's ticks
    idle.quiet(budget_s=0.1).wait()
    assert idle.pauses == [QUIET_S]


def test_a_process_never_quiet_postpones_the_measurement_once_the_budget_is_spent() -> None:
    script = _Script([True] * 1000)
    quiet = script.quiet(budget_s=0.1)
    with pytest.raises(MeasurementPostponed):  # not timed under its load
        quiet.wait()
    assert quiet.waited_s == pytest.approx(0.1)
    assert sum(script.pauses) == pytest.approx(0.1)  # the last pause is cut to the budget


def test_a_closing_index_cancels_the_measurement() -> None:
    quiet = _Script([True] * 10, closing_after=2).quiet()
    with pytest.raises(MeasurementCancelled):
        quiet.wait()  # while it waits for a quiet spell


def test_a_closing_index_cancels_a_quiet_measurement_at_its_next_timing() -> None:
    script = _Script([])  # nothing ever comes
    quiet = script.quiet()
    quiet.wait()
    script.closing_after = 0  # closing from now on
    with pytest.raises(MeasurementCancelled):
        quiet.wait()
    assert script.pauses == [QUIET_S]  # without waiting for anything more


def test_a_timing_a_query_overlapped_is_taken_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first timing waits for a quiet spell (asks busy once: nothing came), runs,
    # then "overlapped?" asks busy: a query came. The timing taken again first waits
    # for a quiet spell (a second pause); no other one is overlapped.
    script = _Script([False, True, False] + [False] * 1000)
    now = [0.0]
    # The module's clock only: other threads keep the real one.
    monkeypatch.setattr(half_limit, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    # The copies' runs take 1 s, but 0.5 s in the overlapped first timing: a timing
    # a query overlapped says nothing, and must not count.
    copies_took = [0.5] + [1.0] * 100
    runs = {"copies": 0, "float32": 0}

    def copies() -> None:
        runs["copies"] += 1
        now[0] += copies_took.pop(0)

    def float32() -> None:
        runs["float32"] += 1
        now[0] += 2.0

    quiet = script.quiet()
    best = half_limit._best_of(copies, float32, quiet)
    assert best == (1.0, 2.0)  # the overlapped 0.5 s was taken again
    assert quiet.retaken == 1
    assert script.pauses == [QUIET_S, QUIET_S]
    assert runs == {"copies": half_limit._TRIES + 1, "float32": half_limit._TRIES}


def test_a_timing_the_other_threads_ran_in_is_taken_again() -> None:
    """A load that reads and chunks before its first commit: no commit came, but not quiet."""
    script = _Script([])
    quiet = script.quiet()
    quiet.wait()  # one quiet spell
    script.now += 0.01  # a 10 ms timing ...
    script.cpu += 0.008  # ... while another thread used 8 ms
    assert quiet.overlapped()
    quiet.wait()  # the next timing waits for a quiet spell first
    assert script.pauses == [QUIET_S, QUIET_S]
    script.now += 0.01
    script.cpu += 0.001  # an event loop's tick
    assert not quiet.overlapped()


def test_a_real_thread_that_computes_overlaps_a_timing() -> None:
    """The process's CPU clocks, unscripted: another thread's work shows, the helpers' not."""
    helpers = ScanHelpers(1)
    quiet = Quiet(lambda: False, threading.Event().wait, others_cpu=lambda: others_cpu_s(helpers))
    quiet.wait()
    assert not quiet.overlapped()  # nothing else ran
    worker = threading.Thread(target=lambda: sum(range(3_000_000)))
    worker.start()
    worker.join()  # "the timing": while another thread computed
    assert quiet.overlapped()
    quiet.wait()
    used = helpers.cpu_s()
    done = [0, 0]

    def task(i: int) -> None:
        done[i] = sum(range(1_000_000))

    for _ in range(20):  # until the helper took one of the two tasks
        helpers.run([partial(task, 0), partial(task, 1)])
        if helpers.cpu_s() > used:
            break
    assert helpers.cpu_s() > used, "the helper never ran a task"
    assert not quiet.overlapped()  # the measurement's own helpers are not a load


def test_retakes_are_bounded_then_the_measurement_is_postponed() -> None:
    script = _Script([])
    script.busy = lambda: True  # type: ignore[method-assign]  # always overlapped
    quiet = script.quiet(budget_s=1e9)
    for _ in range(half_limit._RETAKES):
        assert quiet.overlapped()
    with pytest.raises(MeasurementPostponed):  # not timed over what never stops
        quiet.overlapped()


def _background_index() -> LsmIndex:
    return LsmIndex(DIM, _spec(), background=True)


def test_the_maintenance_thread_measures_at_start_in_the_gaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not when the first copy is due (a bulk load ending, the first queries coming)."""
    seen: list[Quiet | None] = []
    done = threading.Event()

    def measured(
        dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None
    ) -> tuple[int, dict[int, float]]:
        seen.append(quiet)
        done.set()
        return 2, {}

    monkeypatch.setattr(half_limit, "_measure", measured)
    index = _background_index()
    try:
        assert done.wait(30), "the maintenance thread did not measure at start"
        assert index.health().rows == 0  # nothing committed, no copy due
        rng = np.random.default_rng(5)
        rows = rng.standard_normal((1000, DIM)).astype(np.float32)
        _commit(index, rows / np.linalg.norm(rows, axis=1, keepdims=True))
        index.seal_all()
    finally:
        index.close()
    assert len(seen) == 1  # once: the copies made later use it
    assert isinstance(seen[0], Quiet)
    assert half_query_limit(DIM) == 2


def test_closing_while_the_measurement_waits_leaves_it_to_the_next_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def waits_for_ever(
        dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None
    ) -> tuple[int, dict[int, float]]:
        assert quiet is not None
        closing.set()
        while True:  # timing after timing, never done: ends when the index closes
            quiet.wait()

    closing = threading.Event()
    monkeypatch.setattr(half_limit, "_measure", waits_for_ever)
    index = _background_index()
    rng = np.random.default_rng(6)
    rows = rng.standard_normal((1000, DIM)).astype(np.float32)
    _commit(index, rows / np.linalg.norm(rows, axis=1, keepdims=True))
    index.seal_all()
    assert closing.wait(30), "the measurement never started"
    closer = threading.Thread(target=index.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() waits on a measurement that never ends"
    assert DIM not in half_limit._measured  # nothing was measured: the next open measures
    assert index.last_maintenance_error is None


class _Attempts:
    """The real measurement, its attempts counted; events say when enough happened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(half_limit, "WAIT_BUDGET_S", 0.2)
        self.postponed = 0
        self.done = 0
        self.postponed_twice = threading.Event()
        self.finished = threading.Event()
        real = half_limit._measure

        def counted(
            dim: int, segment_rows: int, tuning: SearchTuning, quiet: Quiet | None
        ) -> tuple[int, dict[int, float]]:
            assert quiet is not None
            try:
                out = real(dim, segment_rows, tuning, quiet)
            except MeasurementPostponed:
                self.postponed += 1
                if self.postponed >= 2:
                    self.postponed_twice.set()
                raise
            self.done += 1
            self.finished.set()
            return out

        monkeypatch.setattr(half_limit, "_measure", counted)


def _measured_once_quiet(index: LsmIndex, attempts: _Attempts) -> None:
    """The load has stopped: the next attempt measures, once; then the index closes."""
    try:
        index._maintenance.wake()
        assert attempts.finished.wait(60), "not measured once quiet"
    finally:
        index.close()
    assert attempts.done == 1


def test_queries_that_never_stop_postpone_the_measurement_and_are_answered_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real queries on another thread, a real measurement: not timed over them; then timed."""
    attempts = _Attempts(monkeypatch)
    index = _background_index()
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((1000, DIM)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    _commit(index, rows)
    stop = threading.Event()
    answers, wrong = [0], [0]

    def query() -> None:
        i = 0
        while not stop.is_set():
            batch = rows[i % 1000 : i % 1000 + 1 + i % 4]  # one to four queries a call
            _, hits = index.search_many(batch, 1, SearchFilter())
            expected = list(range(i % 1000, i % 1000 + len(batch)))
            wrong[0] += [h[0].chunk_id for h in hits] != expected
            answers[0] += 1
            i += 1

    # Only while the queries run: a measurement done before they start proves nothing.
    monkeypatch.setattr(half_limit, "_measured", {DIM})
    t = threading.Thread(target=query)
    t.start()
    try:
        monkeypatch.setattr(half_limit, "_measured", set())
        index._maintenance.wake()  # a step with nothing else to do: an attempt
        assert attempts.postponed_twice.wait(60), "no attempt was postponed"
        assert attempts.done == 0  # never timed over the queries
        assert half_limit.measured_half_limit(DIM) is None
    finally:
        stop.set()
        t.join()
    _measured_once_quiet(index, attempts)
    assert half_limit.measured_half_limit(DIM) is not None  # once quiet: measured, once
    assert answers[0] > 0
    assert wrong[0] == 0  # every query answered exactly while it tried


def test_a_bulk_load_postpones_the_measurement_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer that commits every few ms and computes in between, as a pipeline does.

    The gaps between its commits have no query and no commit, but they are not
    quiet: the writer's thread is busy.
    """
    attempts = _Attempts(monkeypatch)
    monkeypatch.setattr(half_limit, "_measured", {DIM})  # not before the load starts
    index = _background_index()
    rng = np.random.default_rng(8)
    stop, started = threading.Event(), threading.Event()
    committed = [0]

    def write() -> None:
        n = 0
        while not stop.is_set():
            rows = rng.standard_normal((50, DIM)).astype(np.float32)
            _commit(index, rows / np.linalg.norm(rows, axis=1, keepdims=True), first=n)
            n += 50
            committed[0] = n
            started.set()
            spin = sum(range(2_000_000))  # reading and chunking the next batch: ~30-60 ms
            assert spin > 0

    t = threading.Thread(target=write)
    t.start()
    try:
        assert started.wait(30)
        monkeypatch.setattr(half_limit, "_measured", set())
        assert attempts.postponed_twice.wait(60), "no attempt was postponed"
        assert attempts.done == 0  # never timed over the load
    finally:
        stop.set()
        t.join()
    _measured_once_quiet(index, attempts)
    assert half_limit.measured_half_limit(DIM) is not None
    assert committed[0] > 0


def test_a_read_of_the_input_makes_the_process_busy_for_the_measurement_only() -> None:
    """A bulk load reads before its first commit; ANN builds keep their own rule."""
    index = LsmIndex(DIM, _spec(), background=False)
    for_measurement, for_builds = index._in_use(reading=True), index._in_use()
    assert not for_measurement()
    half_limit.note_read()
    assert for_measurement()
    assert not for_measurement()  # until the next read
    assert not for_builds()


def test_the_pipeline_notes_each_poll_that_read_something(
    pipeline_factory: PipelineFactory,
) -> None:
    src = ScriptedSource()
    p = pipeline_factory(src)
    before = half_limit.reads()
    assert p.poll() == 0
    assert half_limit.reads() == before  # nothing read: quiet as far as reads go
    src.push(change_line("a", "2024-01-01T00:00:00Z", "text"))
    assert p.poll() == 1
    assert half_limit.reads() == before + 1


def test_copies_made_before_a_measurement_of_none_are_let_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Copies are made under the default until measured; measured at none, they go."""
    monkeypatch.setattr(half_limit, "_measured", {DIM})  # not measured yet, but hold off
    monkeypatch.setattr(search, "_half_limits", {})  # the default holds: copies are made
    index = _background_index()
    try:
        rng = np.random.default_rng(9)
        rows = rng.standard_normal((1000, DIM)).astype(np.float32)
        _commit(index, rows / np.linalg.norm(rows, axis=1, keepdims=True))
        index.seal_all()
        index.maintain()  # in this thread: builds the copies under the default
        assert index.health().half_segments > 0, "no copies: this tests nothing"
        monkeypatch.setattr(half_limit, "_measured", set())
        monkeypatch.setattr(half_limit, "_measure", lambda *a: (0, {}))
        index._measure_half_limit()  # what a step with nothing else to do runs
        assert index.health().half_segments == 0
        _, hits = index.search_many(
            rows[:3] / np.linalg.norm(rows[:3], axis=1, keepdims=True), 1, SearchFilter()
        )
        assert [h[0].chunk_id for h in hits] == [0, 1, 2]
    finally:
        index.close()
