"""The heap selection against a full stable sort: the same scores and columns, ties, masks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.index.topk import PARTITION_MAX, top_k


def _by_sort(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: a stable sort of every row, best first, ties to the lower column."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    picked = np.take_along_axis(scores, order, axis=1)
    order = np.where(np.isneginf(picked), 0, order)  # missing: column 0, as documented
    return order, picked


@settings(max_examples=200, deadline=None)
@given(
    m=st.integers(1, 6),
    n=st.integers(1, 300),
    k=st.integers(1, 20),
    levels=st.integers(1, 8),
    masked=st.floats(0, 1),
    seed=st.integers(0, 2**31),
)
def test_the_heap_picks_what_a_stable_sort_picks(
    m: int, n: int, k: int, levels: int, masked: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    # Few distinct values: many ties, at the boundary and inside the top k.
    scores = (rng.integers(0, levels, (m, n)) / levels - 0.5).astype(np.float32)
    scores[rng.random((m, n)) < masked] = -np.inf
    kk = min(k, n)
    cols, picked = top_k(scores, kk)
    want_cols, want_scores = _by_sort(scores, kk)
    assert picked.dtype == np.float32
    assert cols.dtype == np.int64
    # The same scores, best first; each column really has its score, none twice.
    np.testing.assert_array_equal(picked, want_scores)
    seen = np.isfinite(picked)
    np.testing.assert_array_equal(np.take_along_axis(scores, cols, axis=1)[seen], picked[seen])
    assert (cols[~seen] == 0).all()
    for row, ok in zip(cols, seen, strict=True):
        assert len(set(row[ok].tolist())) == int(ok.sum())
    # Equal scores come in column order; where no tie crosses the k-th score, the sort's columns.
    same = (picked[:, 1:] == picked[:, :-1]) & seen[:, 1:]
    assert (cols[:, 1:][same] > cols[:, :-1][same]).all()
    if m == 1:  # a lone row is partitioned: of columns tied at the k-th score, the lower
        np.testing.assert_array_equal(cols, want_cols)
    for i in range(m):
        if (
            seen[i].all()
            and (scores[i] == picked[i, -1]).sum() == (picked[i] == picked[i, -1]).sum()
        ):
            np.testing.assert_array_equal(cols[i], want_cols[i])


def test_real_valued_scores_of_a_batch() -> None:
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((8, 21_200)).astype(np.float32)
    cols, picked = top_k(scores, 10)
    want_cols, want_scores = _by_sort(scores, 10)
    np.testing.assert_array_equal(cols, want_cols)
    np.testing.assert_array_equal(picked, want_scores)
    # A row where only two entries may be seen: the rest is column 0 at -inf.
    row = np.full((1, 50), -np.inf, dtype=np.float32)
    row[0, 7], row[0, 40] = 0.5, 0.9
    cols, picked = top_k(row, 4)
    assert cols.tolist() == [[40, 7, 0, 0]]
    assert picked[0, :2].tolist() == [np.float32(0.9), np.float32(0.5)]
    assert np.isneginf(picked[0, 2:]).all()


def test_a_lone_row_either_side_of_the_partition_bound() -> None:
    """One query's row: partitioned up to ``PARTITION_MAX`` scores, through the heaps above."""
    rng = np.random.default_rng(5)
    for n in (1_000, PARTITION_MAX, PARTITION_MAX + 1, 21_200):
        scores = rng.standard_normal((1, n)).astype(np.float32)
        scores[0, rng.random(n) < 0.3] = -np.inf
        # Ties across the tenth score: six columns share it and four are kept.
        scores[0, rng.choice(n, 6, replace=False)] = np.float32(50.0)
        scores[0, rng.choice(n, 6, replace=False)] = np.float32(60.0)
        cols, picked = top_k(scores, 10)
        want_cols, want_scores = _by_sort(scores, 10)
        np.testing.assert_array_equal(picked, want_scores)
        np.testing.assert_array_equal(scores[0, cols[0]], picked[0])
        if n <= PARTITION_MAX:  # partitioned: of the tied columns, the lower are kept
            np.testing.assert_array_equal(cols, want_cols)
        assert len(set(cols[0].tolist())) == 10
        assert cols.dtype == np.int64
        assert picked.dtype == np.float32
