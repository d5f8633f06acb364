"""Model-based test: random histories against the brute-force reference.

Hypothesis drives upserts and deletes (in and out of event-time order, several
versions of a document in one commit, equal event times, several tenants,
domains and metadata), seals, compactions, rollbacks, clean restarts and
crashes (reopening without closing), and queries with filters, time ranges,
``as_of`` and ``epoch``. The exact configuration must return exactly the
reference's top-k, and refuse exactly the reads the reference refuses — with
every change kept as a version, and with the newest only (``history=False``).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streamrag.changes import Op
from streamrag.errors import IndexStoreError, QueryError
from streamrag.index import LsmIndex, LsmSpec, MetaPredicate, SearchFilter
from streamrag.index.ann import AnnSpec
from streamrag.index.compaction import CompactionSpec
from streamrag.index.search import SearchTuning

from .reference import Change, Reference, as_keys, assert_same_topk, make_batch, unit

DIM = 8
RETENTION = 25
DOCS = [f"d{i}" for i in range(8)]
TENANTS = ["default", "acme"]

SPEC = LsmSpec(
    seal_rows=3,
    ann=AnnSpec(min_rows=2**62),  # the exact configuration
    compaction=CompactionSpec(fanout=2, seal_rows=3, drop_ratio=0.2),
    retention_us=RETENTION,
    checkpoint_every=3,
    wal_fsync=False,
    tuning=SearchTuning(),
)

changes = st.builds(
    lambda doc, op, time, n, tenant, domain, lang, num: (
        doc,
        op,
        time,
        n,
        tenant,
        domain,
        lang,
        num,
    ),
    st.sampled_from(DOCS),
    st.sampled_from([Op.UPSERT, Op.UPSERT, Op.UPSERT, Op.DELETE]),
    # An event time anywhere, or a little behind (or ahead of) a clock that moves on:
    # late changes within the retention, which split the intervals they land in.
    st.integers(0, 80) | st.tuples(st.just("late"), st.integers(-12, 2)),
    st.integers(0, 3),
    st.sampled_from(TENANTS),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["en", "de", None]),
    st.integers(0, 5),
)


class IndexMachine(RuleBasedStateMachine):
    HISTORY = True

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="streamrag-model-"))
        self.seed = 0
        self.offset = 0
        self.now = 20

    @initialize(persistent=st.booleans())
    def start(self, persistent: bool) -> None:
        self.persistent = persistent
        self.spec = replace(SPEC, history=self.HISTORY)
        self.index = self._open()
        self.ref = Reference(DIM, RETENTION, history=self.HISTORY)

    def _open(self) -> LsmIndex:
        return LsmIndex(DIM, self.spec, path=self.dir / "idx" if self.persistent else None)

    def teardown(self) -> None:
        index = getattr(self, "index", None)
        if index is not None:
            index.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(batch=st.lists(changes, min_size=1, max_size=4))
    def commit(self, batch: list[tuple]) -> None:  # type: ignore[type-arg]
        out = []
        self.now += 2
        for doc, op, when, n, tenant, domain, lang, num in batch:
            time = when if isinstance(when, int) else max(0, self.now + when[1])
            self.offset += 1
            seeds = []
            for _ in range(n if op == Op.UPSERT else 0):
                self.seed += 1
                seeds.append(self.seed)
            md = {"num": num, **({"lang": lang} if lang else {})}
            out.append(Change(doc, op, time, self.offset, tuple(seeds), tenant, domain, md))
        self.index.commit(make_batch(out, DIM))
        self.ref.commit(out)

    @rule()
    def seal(self) -> None:
        self.index.seal_all()

    @rule(force=st.booleans())
    def compact(self, force: bool) -> None:
        self.index.compact(force=force)

    @rule()
    def maintain(self) -> None:
        self.index.maintain()

    @precondition(lambda self: self.persistent)
    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        if clean:
            self.index.close()
        else:
            # A crash: no final checkpoint; the reopened index must rebuild from its
            # last checkpoint and the log. (Only the file handle is released.)
            assert self.index._wal is not None
            self.index._wal.close()
        self.index = self._open()

    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(0, self.ref.epoch))
        try:
            want = self.ref.rollback(target)
        except IndexStoreError:
            with pytest.raises(IndexStoreError):
                self.index.rollback(target)
            return
        assert self.index.rollback(target) == want

    @rule(
        seed=st.integers(0, 10_000),
        k=st.integers(1, 6),
        tenant=st.sampled_from(TENANTS),
        domains=st.none() | st.sets(st.sampled_from(["a", "b", "zz"]), min_size=1),
        doc_ids=st.none() | st.sets(st.sampled_from(DOCS), min_size=1, max_size=3),
        time_range=st.none() | st.tuples(st.integers(0, 80), st.integers(1, 40)),
        as_of=st.none() | st.integers(-10, 90),
        epoch_back=st.none() | st.integers(0, 12),
        meta=st.sampled_from(
            [
                (),
                (MetaPredicate("lang", values=frozenset({"en"})),),
                (MetaPredicate("num", gte=1, lt=4),),
                (MetaPredicate("num", values=frozenset({2, 3})),),
            ]
        ),
    )
    def query(
        self,
        seed: int,
        k: int,
        tenant: str,
        domains: set[str] | None,
        doc_ids: set[str] | None,
        time_range: tuple[int, int] | None,
        as_of: int | None,
        epoch_back: int | None,
        meta: tuple[MetaPredicate, ...],
    ) -> None:
        flt = SearchFilter(
            tenant=tenant,
            domains=None if domains is None else frozenset(domains),
            doc_ids=None if doc_ids is None else frozenset(doc_ids),
            start_us=None if time_range is None else time_range[0],
            end_us=None if time_range is None else time_range[0] + time_range[1],
            as_of_us=as_of,
            epoch=None if epoch_back is None else max(0, self.ref.epoch - epoch_back),
            metadata=meta,
        )
        q = unit(seed + 1_000_000, DIM)[None, :]
        try:
            want_epoch, want = self.ref.search(q[0], k, flt)
        except QueryError:
            with pytest.raises(QueryError):
                self.index.search_many(q, k, flt)
            return
        epoch, hits = self.index.search_many(q, k, flt)
        assert epoch == want_epoch
        assert_same_topk(as_keys(hits[0]), want)

    @invariant()
    def same_documents(self) -> None:
        if not hasattr(self, "index"):
            return
        assert self.index.epoch == self.ref.epoch
        stats = self.index.stats()
        docs = self.ref.docs
        live = sum(1 for _, deleted, _ in docs.values() if not deleted)
        assert stats.live_docs == live
        assert stats.deleted_docs == len(docs) - live
        assert stats.live_chunks == sum(len(rows) for _, _, rows in docs.values())
        for (tenant, doc), (version, deleted, rows) in docs.items():
            state = self.index.doc_state(tenant, doc)
            assert state is not None
            assert (state.version, state.deleted, len(state.rows)) == (version, deleted, len(rows))
            if rows:
                got = self.index.vectors_at(state.rows)
                assert np.array_equal(got, np.stack(rows))


class CurrentOnlyMachine(IndexMachine):
    HISTORY = False


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


IndexMachine.TestCase.settings = _settings(150)
test_index_matches_the_reference = IndexMachine.TestCase
CurrentOnlyMachine.TestCase.settings = _settings(60)
test_current_only_index_matches_the_reference = CurrentOnlyMachine.TestCase
