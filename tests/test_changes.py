from __future__ import annotations

import numpy as np
import pytest

from streamrag.changes import Change, ChangeBatch, Op


def _changes(n: int) -> list[Change]:
    return [
        Change("t", f"d{i}", Op(i % 2), i * 10, {"text": f"x{i}"} if i % 2 == 0 else {}, "s", i)
        for i in range(n)
    ]


def test_batch_roundtrip_and_columns() -> None:
    changes = _changes(5)
    batch = ChangeBatch.from_changes(changes)
    assert batch.to_changes() == changes
    assert batch.event_times.dtype == np.int64
    assert batch.ops.tolist() == [0, 1, 0, 1, 0]


def test_concat_and_slice_keep_order() -> None:
    changes = _changes(7)
    batch = ChangeBatch.concat(
        [ChangeBatch.from_changes(changes[:3]), ChangeBatch.from_changes(changes[3:])]
    )
    assert batch.to_changes() == changes
    assert batch.slice(2, 5).to_changes() == changes[2:5]
    assert len(ChangeBatch.concat([])) == 0


def test_columns_must_agree() -> None:
    with pytest.raises(ValueError, match="one length"):
        ChangeBatch(
            ["t"],
            ["a", "b"],
            np.zeros(2, np.int8),
            np.zeros(2, np.int64),
            [{}, {}],
            ["s", "s"],
            np.zeros(2, np.int64),
        )


def test_version_orders_by_event_time_then_offset() -> None:
    a = Change("t", "d", Op.UPSERT, 5, {}, "s", 9)
    b = Change("t", "d", Op.UPSERT, 5, {}, "s", 10)
    c = Change("t", "d", Op.UPSERT, 6, {}, "s", 0)
    assert a.version < b.version < c.version
