"""Background graph builds widen only while the index is idle (no query, no commit)."""

from __future__ import annotations

import numpy as np

from streamrag.changes import Op
from streamrag.index import LsmIndex, LsmSpec, SearchFilter

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
