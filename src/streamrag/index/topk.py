"""The best ``k`` columns of each row of a score matrix, with FAISS's heaps.

An exact scan scores every row of the index for every query, then keeps each
query's best ``k``. ``np.argpartition`` does that by copying and partitioning
the whole row: over 21,200 rows it took ~250 µs a query on a 2-core AMD EPYC
host, a quarter of the scan's time in a batch of eight (the product 6.2 ms,
the selection 1.9–2.2 ms). A bounded heap per row reads each score once and
keeps it only if it beats the heap's worst, which after the first few rows it
seldom does: FAISS's ``HeapArray.addn`` (the selection its own flat search
uses, in C++) took 64–68 µs for the same eight rows. As with
``np.argpartition``, which of several columns tied at the ``k``-th score is
kept is not specified; the columns returned are ordered by score, then column.

A lone query's row of up to :data:`PARTITION_MAX` scores is the exception:
there setting up the heaps through FAISS's Python wrapper costs more than the
selection. On a 2-core Intel Xeon host (best of five runs of 2,000): 212
scores 23.2 µs through the heaps against 8.5 µs partitioned with
``np.argpartition``, 2,048 scores 24.0 against 11.5, 4,096 scores 25.5 against
16.1; past that the partition slowed (6,000 scores 53 µs), and the heaps stay.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from streamrag.index.ann import _faiss

__all__ = ["PARTITION_MAX", "top_k"]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

PARTITION_MAX = 4_096
"""Up to this many scores, a single row is selected with ``np.argpartition``, not the heaps."""


def top_k(scores: F32, k: int) -> tuple[I64, F32]:
    """The ``k`` best columns of each row of ``scores`` and their scores, best first.

    ``scores`` is ``(m, n)`` float32 with ``0 < k <= n``; masked entries are
    ``-inf`` and never chosen. Where a row has fewer than ``k`` finite scores
    it ends in column 0 scored ``-inf``. Among equal scores returned the lower
    column comes first.
    """
    m, n = scores.shape
    if m == 1 and n <= PARTITION_MAX:
        return _one_row(np.asarray(scores[0], dtype=np.float32), k)
    faiss = _faiss()  # OpenMP at one thread in this thread
    s = np.ascontiguousarray(scores, dtype=np.float32)
    vals = np.empty((m, k), dtype=np.float32)
    cols = np.empty((m, k), dtype=np.int64)
    heaps = faiss.float_minheap_array_t()  # a min-heap of the k largest, per row
    heaps.nh, heaps.k = m, k
    heaps.val, heaps.ids = faiss.swig_ptr(vals), faiss.swig_ptr(cols)
    heaps.heapify()
    heaps.addn(n, faiss.swig_ptr(s))
    heaps.reorder()  # best first; ties in no set order
    missing = cols < 0
    if missing.any():
        cols[missing] = 0
        vals[missing] = -np.inf
    order = np.lexsort((cols, -vals), axis=1)
    return np.take_along_axis(cols, order, axis=1), np.take_along_axis(vals, order, axis=1)


def _one_row(scores: F32, k: int) -> tuple[I64, F32]:
    """:func:`top_k` of one row, by partitioning it: the ``k`` largest, then sorted.

    The partition also puts the best score left out in its place, so a tie
    across the ``k``-th score shows without another pass over the row; then,
    as a stable sort would, the lower of the tied columns are kept (the
    partition's choice among them is arbitrary).
    """
    n = scores.shape[0]
    if n == k:
        cols = np.arange(n, dtype=np.int64)
    else:
        idx = np.argpartition(scores, (n - k - 1, n - k))
        cols = idx[n - k :].astype(np.int64, copy=False)
        kth = scores[idx[n - k]]
        if kth == scores[idx[n - k - 1]] and kth != -np.inf:
            above = np.flatnonzero(scores > kth)
            tied = np.flatnonzero(scores == kth)[: k - above.size]
            cols = np.concatenate((above, tied)).astype(np.int64, copy=False)
    vals = scores[cols]
    order = np.lexsort((cols, -vals))  # best first, then the lower column
    cols, vals = cols[order], vals[order]
    missing = np.isneginf(vals)
    if missing.any():
        cols[missing] = 0
    return cols[None, :], vals[None, :]
