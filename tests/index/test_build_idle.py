"""Background graph builds widen only while the index is idle (no query, no commit)."""

from __future__ import annotations

import numpy as np
import pytest

from streamrag.changes import Op
from streamrag.index import LsmIndex, LsmSpec, SearchFilter
from streamrag.index.ann import _BUILD_PART, AnnSpec
from streamrag.index.compaction import CompactionSpec

from .reference import Change, make_batch, unit

DIM = 16


def test_a_build_hears_of_each_query_and_commit_once() -> None:
    index = LsmIndex(DIM, LsmSpec(), background=False)
    busy = index._in_use()
    assert not busy()  # nothing since it was asked for
    index.commit(make_batch([Change("a", Op.UPSERT, 1, 0, (1,))], DIM))
    assert busy()
    assert not busy()
    index.search_many(unit(2, DIM)[None, :].astype(np.float32), 1, SearchFilter())
    assert busy()
    assert not busy()
    index.close()


@pytest.mark.parametrize("between", ["nothing", "a query", "a late commit"])
def test_maintenance_builds_on_one_thread_while_queries_or_commits_come(between: str) -> None:
    """Between the parts of a graph's build: nothing, a query, or a commit of an older version."""
    import faiss

    ann = AnnSpec(min_rows=1000, hnsw_m=8, hnsw_ef_construction=40, build_threads=2)
    spec = LsmSpec(ann=ann, seal_rows=8192, compaction=CompactionSpec(fanout=8, seal_rows=8192))
    index = LsmIndex(DIM, spec, background=False)
    rows = 4 * _BUILD_PART
    index.commit(
        make_batch([Change(f"d{i}", Op.UPSERT, 1000 + i, i, (i,)) for i in range(rows)], DIM)
    )
    index.seal_all()
    used: list[int] = []  # OpenMP threads of the part before, seen between parts
    late = iter(range(rows))

    def look() -> bool:  # what maintenance asks between parts (whether it is closing)
        used.append(faiss.omp_get_max_threads())
        if between == "a query":
            index.search_many(unit(7, DIM)[None, :].astype(np.float32), 3, SearchFilter())
        elif between == "a late commit":  # an older version of a document being built
            i = next(late)
            index.commit(make_batch([Change(f"d{i}", Op.UPSERT, 1, rows + i, (i + 1,))], DIM))
        return False

    index._closing = look  # type: ignore[method-assign]
    assert index.maintain()
    assert len(used) >= 4  # one look before each of the build's parts at least
    if between == "nothing":
        assert 2 in used
    else:
        assert 2 not in used
    index.close()
