"""Every vector index goes through the same checks: the ``VectorIndex`` contract.

Each entry of ``IMPLEMENTATIONS`` opens one index kind (or one way of holding
it: in memory, persisted, reopened from its checkpoint, replayed from its
write-ahead log, cut into tiny compacted segments); each check runs against
all of them. ``reopen`` is where a persisted index is closed (or dropped as a
crash would) and opened again: a check calls it after committing, so what it
asserts afterwards must have survived. A new implementation is one more line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.errors import IndexStoreError, QueryError
from streamrag.index import (
    Closeable,
    ExactIndex,
    LsmIndex,
    LsmSpec,
    SearchFilter,
    SupportsHealth,
    SupportsRollback,
    VectorIndex,
)
from streamrag.index.compaction import CompactionSpec
from tests.index.reference import Change, make_batch, unit

DIM = 8
DAY = 86_400_000_000
Index = Any  # a VectorIndex, with whichever optional protocols it has


def _same(index: Index, path: Path) -> Index:
    return index


def _lsm_reopened(index: Index, path: Path) -> Index:
    """Close (a checkpoint) and open the directory again: the state comes from files."""
    index.close()
    return LsmIndex(DIM, index.spec, path=path)


def _lsm_replayed(index: Index, path: Path) -> Index:
    """Drop the index as a crash would and open it again: the state comes from the log."""
    index.abandon()
    return LsmIndex(DIM, index.spec, path=path)


_TINY = LsmSpec(seal_rows=2, compaction=CompactionSpec(fanout=2, seal_rows=2))


def _lsm_compacted(index: Index, path: Path) -> Index:
    """Seal, maintain and compact everything: the state comes from merged segments."""
    index.seal_all()
    index.maintain()
    index.compact(force=True)
    return index


@dataclass(frozen=True)
class Implementation:
    """How to open an index kind, and how to reopen it after commits."""

    name: str
    open: Callable[[Path], Index]
    reopen: Callable[[Index, Path], Index] = _same
    history: bool = False
    """Whether older changes are kept as versions (as_of reads)."""
    epochs: bool = False
    """Whether earlier epochs can be read."""


IMPLEMENTATIONS = [
    Implementation("exact", lambda p: ExactIndex(DIM, initial_capacity=2)),
    Implementation("lsm", lambda p: LsmIndex(DIM), history=True, epochs=True),
    Implementation("lsm-current", lambda p: LsmIndex(DIM, LsmSpec(history=False)), epochs=True),
    Implementation("lsm-persisted", lambda p: LsmIndex(DIM, path=p), history=True, epochs=True),
    Implementation(
        "lsm-reopened", lambda p: LsmIndex(DIM, path=p), _lsm_reopened, history=True, epochs=True
    ),
    Implementation(
        "lsm-replayed", lambda p: LsmIndex(DIM, path=p), _lsm_replayed, history=True, epochs=True
    ),
    Implementation(
        "lsm-compacted", lambda p: LsmIndex(DIM, _TINY), _lsm_compacted, history=True, epochs=True
    ),
]


class Harness:
    """One index under test, reopened in place by :meth:`reopen`."""

    def __init__(self, impl: Implementation, path: Path) -> None:
        self.impl = impl
        self.path = path / "index"
        self.index = impl.open(self.path)

    def reopen(self) -> Index:
        self.index = self.impl.reopen(self.index, self.path)
        return self.index

    def commit(self, *changes: Change, cursor: dict[str, Any] | None = None) -> Any:
        batch = make_batch(list(changes), DIM)
        return self.index.commit(replace(batch, cursor=cursor) if cursor else batch)

    def docs(self, flt: SearchFilter | None = None, seed: int = 1) -> list[tuple[str, int]]:
        """(doc id, event time in days) of every chunk a search can find, sorted."""
        _, hits = self.index.search_many(unit(seed, DIM)[None], 100, flt or SearchFilter())
        return sorted((h.doc_id, h.event_time // DAY) for h in hits[0])


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda impl: impl.name)
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(request.param, tmp_path)
    yield harness
    if isinstance(harness.index, Closeable):
        harness.index.close()


def _up(doc: str, day: int, offset: int, *seeds: int, **kw: Any) -> Change:
    return Change(doc, Op.UPSERT, day * DAY, offset, seeds or (offset,), **kw)


def _delete(doc: str, day: int, offset: int) -> Change:
    return Change(doc, Op.DELETE, day * DAY, offset)


def test_is_a_documented_vector_index_that_starts_empty(h: Harness) -> None:
    ix = h.index
    assert isinstance(ix, VectorIndex)
    assert type(ix).__doc__
    assert ix.dim == DIM
    assert ix.epoch == 0
    assert ix.cursor is None
    assert ix.stats().live_chunks == 0
    assert ix.export() == []
    assert ix.search_many(unit(1, DIM)[None], 5, SearchFilter()) == (0, [[]])


def test_a_commit_is_found_by_search_with_its_provenance(h: Harness) -> None:
    result = h.commit(_up("a", 10, 7, 3, 4, domain="hr"))
    assert (result.epoch, result.applied_docs, result.chunks_added) == (1, 1, 2)
    ix = h.reopen()
    epoch, hits = ix.search_many(unit(3, DIM)[None], 1, SearchFilter())
    assert epoch == 1
    (top,) = hits[0]
    assert top.score == pytest.approx(1.0, abs=1e-5)
    assert (top.doc_id, top.tenant, top.domain, top.position) == ("a", "default", "hr", 0)
    assert (top.event_time, top.offset, top.epoch, top.embedder_version) == (10 * DAY, 7, 1, "test")
    assert top.text == f"a@{10 * DAY}:0"
    assert ix.stats().live_chunks == 2
    assert ix.stats().live_docs == 1


def test_the_epoch_grows_by_one_per_commit_whatever_it_holds(h: Harness) -> None:
    assert h.commit(_up("a", 10, 1)).epoch == 1
    assert h.commit().epoch == 2  # an empty micro-batch is an epoch too
    assert h.commit(_up("a", 10, 1)).epoch == 3  # so is one that changes nothing
    ix = h.reopen()
    assert ix.epoch == 3
    assert ix.stats().epoch == 3
    assert h.commit(_up("b", 11, 2)).epoch == 4
    assert h.index.search_many(unit(1, DIM)[None], 3, SearchFilter())[0] == 4


def test_a_newer_upsert_replaces_the_document(h: Harness) -> None:
    h.commit(_up("a", 10, 1, 1, 2))
    h.commit(_up("a", 12, 2, 5))
    ix = h.reopen()
    assert h.docs() == [("a", 12)]
    state = ix.doc_state("default", "a")
    assert state is not None
    assert (state.version, state.deleted, len(state.rows)) == ((12 * DAY, 2), False, 1)
    assert ix.stats().live_chunks == 1
    assert [hit.doc_id for hit, _ in ix.export()] == ["a"]


def test_an_older_change_never_replaces_a_newer_one(h: Harness) -> None:
    h.commit(_up("a", 12, 5))
    result = h.commit(_up("a", 10, 9), _up("b", 3, 1), _up("b", 3, 2, 8))  # late; then a tie
    assert result.applied_docs == 1
    h.reopen()
    assert h.docs() == [("a", 12), ("b", 3)]
    state = h.index.doc_state("default", "b")
    assert state is not None
    assert state.version == (3 * DAY, 2)  # equal event times: the greater offset wins


def test_a_delete_removes_and_its_tombstone_blocks_older_upserts(h: Harness) -> None:
    h.commit(_up("a", 10, 1), _up("b", 10, 2))
    h.commit(_delete("a", 11, 3))
    h.commit(_up("a", 10, 4))  # older than the delete: stays deleted
    ix = h.reopen()
    assert h.docs() == [("b", 10)]
    state = ix.doc_state("default", "a")
    assert state is not None
    assert state.deleted
    assert state.version == (11 * DAY, 3)
    assert (ix.stats().live_docs, ix.stats().deleted_docs) == (1, 1)
    h.commit(_up("a", 12, 5))  # newer than the delete: back
    assert h.docs() == [("a", 12), ("b", 10)]


def test_within_one_batch_the_newest_change_is_current(h: Harness) -> None:
    h.commit(_up("a", 12, 3, 12), _up("a", 14, 2, 14), _up("a", 13, 1, 13))
    h.reopen()
    assert h.docs() == [("a", 14)]


def test_an_older_epoch_shows_the_older_state_or_is_refused(h: Harness) -> None:
    h.commit(_up("a", 10, 1), _up("b", 10, 2))
    h.commit(_up("a", 12, 3), _delete("b", 12, 4))
    h.reopen()
    if not h.impl.epochs:
        with pytest.raises(QueryError):
            h.index.search_many(unit(1, DIM)[None], 5, SearchFilter(epoch=1))
        return
    assert h.docs(SearchFilter(epoch=1)) == [("a", 10), ("b", 10)]
    assert h.docs(SearchFilter(epoch=2)) == [("a", 12)]
    assert h.index.search_many(unit(1, DIM)[None], 5, SearchFilter(epoch=1))[0] == 1
    with pytest.raises(QueryError):
        h.index.search_many(unit(1, DIM)[None], 5, SearchFilter(epoch=3))


def test_as_of_shows_the_documents_at_that_time_or_is_refused(h: Harness) -> None:
    h.commit(_up("a", 12, 3))
    h.commit(_up("a", 10, 1))  # late: with history, it is the past of a
    h.reopen()
    if not h.impl.history:
        with pytest.raises(QueryError):
            h.index.search_many(unit(1, DIM)[None], 5, SearchFilter(as_of_us=11 * DAY))
        return
    assert h.docs(SearchFilter(as_of_us=11 * DAY)) == [("a", 10)]
    assert h.docs(SearchFilter(as_of_us=9 * DAY)) == []
    assert h.docs() == [("a", 12)]


def test_a_pinned_epoch_does_not_see_later_commits(h: Harness) -> None:
    h.commit(_up("a", 10, 1))
    pinned = h.index.pin()
    h.commit(_up("a", 12, 2), _up("b", 12, 3))
    epoch, hits = h.index.search_many(unit(1, DIM)[None], 10, SearchFilter(), pinned)
    assert epoch == 1
    assert sorted((x.doc_id, x.event_time // DAY) for x in hits[0]) == [("a", 10)]


def test_the_cursor_round_trips_and_merges_by_key(h: Harness) -> None:
    h.commit(_up("a", 10, 1), cursor={"positions": {"s": 1}, "window": [1, 2]})
    h.commit(_up("b", 10, 2), cursor={"positions": {"s": 2}})
    h.commit(_up("c", 10, 3))  # a commit without a cursor keeps the one held
    ix = h.reopen()
    assert ix.cursor == {"positions": {"s": 2}, "window": [1, 2]}


def test_wants_is_false_for_a_change_already_held(h: Harness) -> None:
    ix = h.index
    assert ix.wants("default", "a", 10 * DAY, 1)
    h.commit(_up("a", 10, 1))
    ix = h.reopen()
    assert not ix.wants("default", "a", 10 * DAY, 1)  # the same change read twice
    assert ix.wants("default", "a", 10 * DAY, 2)  # same time, later offset: newer
    assert ix.wants("default", "a", 11 * DAY, 0)
    assert ix.wants("default", "b", 1 * DAY, 0)  # another document
    # An older change changes an answer only where history is kept.
    assert ix.wants("default", "a", 9 * DAY, 5) is h.impl.history


def test_wrong_dimensions_and_k_are_refused(h: Harness) -> None:
    batch = make_batch([_up("a", 10, 1)], DIM)
    bad = replace(batch, vectors=np.zeros((1, DIM + 1), np.float32))
    with pytest.raises(IndexStoreError):
        h.index.commit(bad)
    assert h.index.epoch == 0  # a refused commit is no epoch
    with pytest.raises(QueryError):
        h.index.search_many(np.zeros((1, DIM + 1), np.float32), 3, SearchFilter())
    with pytest.raises(QueryError):
        h.index.search_many(unit(1, DIM)[None], 0, SearchFilter())


def test_filters_apply_before_ranking(h: Harness) -> None:
    h.commit(
        _up("a", 10, 1, 1, domain="hr"),
        _up("b", 11, 2, 2, domain="it"),
        _up("c", 12, 3, 3, domain="it"),
        _up("d", 12, 4, 1, tenant="other"),
    )
    h.reopen()
    assert h.docs() == [("a", 10), ("b", 11), ("c", 12)]  # the tenant is always applied
    assert h.docs(SearchFilter(tenant="other")) == [("d", 12)]
    assert h.docs(SearchFilter(tenant="nobody")) == []
    assert h.docs(SearchFilter(domains=frozenset({"it"}))) == [("b", 11), ("c", 12)]
    assert h.docs(SearchFilter(doc_ids=frozenset({"a", "c"}))) == [("a", 10), ("c", 12)]
    window = SearchFilter(start_us=11 * DAY, end_us=12 * DAY)
    assert h.docs(window) == [("b", 11)]
    _, hits = h.index.search_many(unit(1, DIM)[None], 1, SearchFilter(domains=frozenset({"it"})))
    assert [x.doc_id for x in hits[0]] == ["b"] or [x.doc_id for x in hits[0]] == ["c"]


def test_results_are_ranked_by_score_and_cut_at_k(h: Harness) -> None:
    h.commit(*[_up(f"d{i}", 10, i, 100 + i) for i in range(20)])
    h.reopen()
    queries = np.stack([unit(105, DIM), unit(117, DIM)])
    epoch, hits = h.index.search_many(queries, 5, SearchFilter())
    assert epoch == 1
    assert [len(row) for row in hits] == [5, 5]
    assert [row[0].doc_id for row in hits] == ["d5", "d17"]
    for row, q in zip(hits, queries, strict=True):
        scores = [x.score for x in row]
        assert scores == sorted(scores, reverse=True)
        exact = sorted((float(unit(100 + i, DIM) @ q) for i in range(20)), reverse=True)[:5]
        assert scores == pytest.approx(exact, abs=1e-5)


def test_vectors_at_gives_the_stored_vectors_of_current_chunks(h: Harness) -> None:
    h.commit(_up("a", 10, 1, 4, 5))
    ix = h.reopen()
    state = ix.doc_state("default", "a")
    assert state is not None
    np.testing.assert_allclose(ix.vectors_at(state.rows), np.stack([unit(4, DIM), unit(5, DIM)]))
    assert state.hashes == [b"4", b"5"]
    exported = sorted((hit.position, vec.tolist()) for hit, vec in ix.export())
    assert [p for p, _ in exported] == [0, 1]
    np.testing.assert_allclose(exported[1][1], unit(5, DIM))


def test_a_commit_does_not_mutate_its_batch(h: Harness) -> None:
    batch = make_batch([_up("a", 10, 1, 1, 2), _up("b", 9, 2, 3)], DIM)
    vectors = batch.vectors.copy()
    docs = list(batch.docs)
    h.index.commit(batch)
    np.testing.assert_array_equal(batch.vectors, vectors)
    assert batch.docs == docs


def test_optional_capabilities_are_declared_by_protocol(h: Harness) -> None:
    ix = h.index
    if isinstance(ix, SupportsRollback):
        h.commit(_up("a", 10, 1))
        h.commit(_up("a", 12, 2), _up("b", 12, 3))
        assert ix.rollback(1) == 3
        assert h.docs() == [("a", 10)]
    if isinstance(ix, SupportsHealth):
        assert ix.health().epoch == h.index.epoch
