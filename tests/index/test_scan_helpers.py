"""Idle cores share one search's exact scan, and the answer is the one a lone thread gives.

The helpers (:mod:`streamrag.index.scan_helpers`) run a search's tasks — each
half-precision search, and column ranges of the float32 scan — beside the
calling thread while they are idle, and never make a search wait for a busy
one. The search tests cut the float32 columns into ranges that fall inside
segments, across masked and gathered rows, and make half-precision copies fail
their proof (near-ties), so every path of the split is compared with the
unsplit search and with brute force.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import LsmIndex, SearchFilter
from streamrag.index.base import CommitBatch, DocOp
from streamrag.index.scan_helpers import ScanHelpers, scan_helpers
from streamrag.index.search import SearchTuning, _Half
from tests.index.test_half import DIM, SPEC, _brute, _cluster, _unit

WAIT_S = 10.0  # a bound for a test that would otherwise hang, never a pause


def test_tasks_run_on_the_caller_and_an_idle_helper_at_once() -> None:
    helpers = ScanHelpers(1)
    try:
        other_started = threading.Event()
        ran: list[str] = []

        def first() -> None:
            ran.append(threading.current_thread().name)
            # Only returns if the second task runs meanwhile, on another thread.
            assert other_started.wait(WAIT_S), "the tasks ran one after the other"

        def second() -> None:
            ran.append(threading.current_thread().name)
            other_started.set()

        assert helpers.run([first, second]) == 1
        assert len(ran) == 2
        assert len(set(ran)) == 2
        assert threading.current_thread().name in ran
    finally:
        helpers.close()


def test_a_busy_helper_is_not_waited_for() -> None:
    helpers = ScanHelpers(1)
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:
        holding.set()
        assert release.wait(WAIT_S)

    def quick() -> None:
        pass

    # One search keeps the only helper busy ...
    busy = threading.Thread(target=helpers.run, args=([quick, hold],))
    busy.start()
    try:
        assert holding.wait(WAIT_S)
        # ... (or its own thread: then the helper ran ``quick`` and is idle again)
        where: list[str] = []
        used = helpers.run([lambda: where.append(threading.current_thread().name)] * 3)
        assert len(where) == 3
        if used == 0:  # the helper was busy: every task ran here, with no wait
            assert set(where) == {threading.current_thread().name}
    finally:
        release.set()
        busy.join(WAIT_S)
        helpers.close()
    assert not busy.is_alive()


def test_two_searches_scanning_at_once_on_two_cores_borrow_nothing() -> None:
    """Helpers only take cores that no search holds: one per core in all."""
    helpers = ScanHelpers(1)  # two cores: one caller and one helper
    release = threading.Event()
    holding = threading.Event()

    def hold() -> None:
        holding.set()
        assert release.wait(WAIT_S)

    busy = threading.Thread(target=helpers.run, args=([hold],))  # one task: no helper
    busy.start()
    try:
        assert holding.wait(WAIT_S)
        assert helpers._idle == 1  # the helper is idle, but both cores are taken
        where: list[str] = []
        assert helpers.run([lambda: where.append(threading.current_thread().name)] * 3) == 0
        assert set(where) == {threading.current_thread().name}
    finally:
        release.set()
        busy.join(WAIT_S)
    assert not busy.is_alive()
    try:  # once the other search is done, the helper is borrowed again
        other_started = threading.Event()

        def first() -> None:
            assert other_started.wait(WAIT_S), "the tasks ran one after the other"

        assert helpers.run([first, other_started.set]) == 1
    finally:
        helpers.close()


def test_a_helper_that_wakes_late_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller takes every task while the helper waits for a core; it does not wait on."""
    helpers = ScanHelpers(1)
    wake = threading.Event()
    helped = ScanHelpers._helped

    def late(self: ScanHelpers, work: Any) -> None:
        assert wake.wait(WAIT_S)  # a helper thread not yet scheduled
        helped(self, work)

    monkeypatch.setattr(ScanHelpers, "_helped", late)
    where: list[str] = []
    try:
        done = threading.Thread(
            target=helpers.run,
            args=([lambda: where.append(threading.current_thread().name)] * 3,),
        )
        done.start()
        done.join(WAIT_S)
        assert not done.is_alive(), "the caller waited for a helper that had not started"
        assert len(where) == 3
        assert len(set(where)) == 1  # all on the caller's thread
        assert helpers._idle == 0  # the helper is still on its way: not lent again
    finally:
        wake.set()
    helpers.close()
    assert helpers._idle == 1  # it came back once it ran, with nothing left to do


def test_every_task_runs_and_the_first_error_reaches_the_caller() -> None:
    helpers = ScanHelpers(2)
    done: list[int] = []
    lock = threading.Lock()

    def task(i: int) -> None:
        if i == 3:
            msg = "task 3 broke"
            raise ValueError(msg)
        with lock:
            done.append(i)

    try:
        with pytest.raises(ValueError, match="task 3 broke"):
            helpers.run([lambda i=i: task(i) for i in range(8)])
        assert sorted(done) == [0, 1, 2, 4, 5, 6, 7]
        # Every helper was given back: the next run can borrow them all again.
        assert helpers.run([lambda: None] * 3) in (0, 1, 2)
        assert helpers._idle == 2
    finally:
        helpers.close()


def test_after_close_tasks_run_on_the_caller() -> None:
    helpers = ScanHelpers(2)
    helpers.close()
    names: list[str] = []
    assert helpers.run([lambda: names.append(threading.current_thread().name)] * 3) == 0
    assert names == [threading.current_thread().name] * 3


def _world(threads: int) -> tuple[LsmIndex, np.ndarray, list[str]]:
    """Two sealed segments with half copies (a near-tie cluster in them) and a growing one."""
    rows, _ = _cluster(11)  # 500 rows: 300 random, 200 near one direction
    rng = np.random.default_rng(12)
    extra = _unit(rng.standard_normal((180, DIM)))  # stays in the growing segment
    everything = np.vstack([rows, extra])
    n = everything.shape[0]
    domains = ["b" if i % 4 == 0 else "a" for i in range(n)]
    tuning = SearchTuning(  # copies up to 6 queries a call, whatever this CPU measured
        half_min_rows=1,
        half_min_bytes=0,
        half_max_queries=6,
        scan_threads=threads,
        split_min_rows=40,
    )
    index = LsmIndex(DIM, replace(SPEC, tuning=tuning), background=False)

    def commit(lo: int, hi: int) -> None:
        docs = [
            DocOp("default", f"d{i}", Op.UPSERT, 1_000 + i, i, "src", domains[i], i - lo, 1)
            for i in range(lo, hi)
        ]
        index.commit(
            CommitBatch(
                docs=docs,
                chunk_ids=np.arange(lo, hi, dtype=np.int64),
                positions=np.zeros(hi - lo, np.int32),
                texts=["x"] * (hi - lo),
                hashes=[b"h"] * (hi - lo),
                vectors=everything[lo:hi],
                embedder_version="test",
            )
        )

    commit(0, 500)
    index.seal_all()
    index.maintain()
    commit(500, n)
    return index, everything, domains


def test_a_split_search_answers_as_a_lone_thread_and_brute_force_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alone, rows, domains = _world(threads=1)
    split, _, _ = _world(threads=4)
    views = [v for v in split.pin().views if v.rows]
    assert [v.segment.sealed for v in views] == [True, True, False]
    assert all(v.segment.half is not None for v in views[:2]), "no copies: this tests nothing"
    helpers = scan_helpers(4)
    before = helpers.borrowed
    unproven: list[bool] = []
    search = _Half.search

    def spy(self: _Half, q: np.ndarray, k: int) -> None:
        search(self, q, k)
        unproven.append(not self.proven)

    monkeypatch.setattr(_Half, "search", spy)
    rng = np.random.default_rng(13)
    _, near = _cluster(11)
    for m in (1, 3, 6, 16):  # up to 6: through the copies; 16: the float32 product
        queries = np.vstack([near, _unit(rng.standard_normal((m - 1, DIM)))]) if m > 1 else near
        for name, flt in (
            ("all", SearchFilter()),
            ("a", SearchFilter(domains=frozenset({"a"}))),  # 3 of 4 rows: masked ranges
            ("b", SearchFilter(domains=frozenset({"b"}))),  # 1 of 4: gathered rows
        ):
            mask = None if name == "all" else np.array([d == name for d in domains])
            for k in (1, 5, 40):
                _, want = alone.search_many(queries, k, flt)
                _, got = split.search_many(queries, k, flt)
                for i in range(m):
                    _check(rows, queries[i], k, mask, got[i], want[i], (m, name, k, i))
    assert helpers.borrowed > before, "no search was split: this tests nothing"
    assert any(unproven), "every copy proved its list: the float32 fallback went untested"
    assert not all(unproven), "no copy proved its list: the copies went untested"


def _check(
    rows: np.ndarray,
    q: np.ndarray,
    k: int,
    mask: np.ndarray | None,
    got: Any,
    want: Any,
    case: tuple[Any, ...],
) -> None:
    """The split answer against the lone thread's and against brute force.

    A matrix product over part of the rows may sum in another order, so the
    same scores agree to float32 rounding, and rows whose scores tie to that
    rounding (the near-identical cluster) may come in another order. What
    must hold: the same scores, each hit's own score, and brute force's top-k
    scores; and for up to three queries (each scored alone, by rows, in the
    float32 fallback too) the same rows in the same order as brute force.
    """
    ids = [h.chunk_id for h in got]
    scores = np.array([h.score for h in got])
    close = {"rtol": 0, "atol": 1e-6, "err_msg": str(case)}  # scores of unit vectors
    np.testing.assert_allclose(scores, [h.score for h in want], **close)
    np.testing.assert_allclose(scores, rows[ids] @ q, **close)
    exact = rows @ q
    if mask is not None:
        exact = np.where(mask, exact, -np.inf)
    best = np.sort(exact)[::-1][:k]
    np.testing.assert_allclose(scores, best, **close)
    if case[0] <= 3:
        assert ids == [h.chunk_id for h in want], case
        assert ids == _brute(rows, q, k, mask), case


def test_the_setting_reaches_the_index_and_defaults_to_every_cpu() -> None:
    from streamrag.config import IndexSettings
    from streamrag.index.factory import lsm_spec

    assert lsm_spec(IndexSettings()).tuning.scan_threads == 0
    assert lsm_spec(IndexSettings(scan_threads=1)).tuning.helpers() is None
    assert lsm_spec(IndexSettings(scan_threads=3)).tuning.helpers() is scan_helpers(3)
    assert scan_helpers(3).helpers == 2
