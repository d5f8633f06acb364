"""Exact search at half the bytes: a half-precision copy of a segment's vectors.

An exact scan reads every vector of a segment. Past the CPU's cache that is
bound by memory bandwidth, not arithmetic: here one query over 21,200 float32
rows × 384 (33 MB, more than this host's 32 MB L3) took 1.04 ms with numpy's
matrix-vector product, and 0.33 ms over the same rows in IEEE half precision
with FAISS's fp16 scalar quantizer and its SIMD kernel, one thread each; through
the whole search path, 100,000 rows in 13 segments answered 1.57× as many single
queries (``benchmarks/index.py``). A :class:`HalfScan` is that copy, for a sealed
segment searched exactly (one too small for an ANN structure, or whose
structure missed its recall target), and for the rows the growing segment had
when maintenance last copied it: rows are only appended, so a copy of the first
rows stays true, and the rows after it are scanned in float32. A new copy is
made once ``half_min_rows`` rows lack one. Where the growing segment is big,
as after a bulk load (4,616 of the 21,200 rows of ``benchmarks/run.py``'s
20,000 documents), a lone query in process took 0.77–0.96 ms (median 0.81)
with the growing segment's copy against 1.25–1.58 ms (1.35) without it: one
process, the copy switched on and off over eight alternated rounds of 300
queries.

The answer is still exact. Rounding a vector to half precision moves each
coordinate by at most 2⁻¹¹ of itself (2⁻²⁵ in absolute terms below the
normal range), so a half-precision inner product is within

    ε = ‖q‖ · (max‖v‖ · (2⁻¹¹ + 2·d·2⁻²⁴) + √d · 2⁻²⁵)

of the float32 one (the second term bounds float32 rounding in both sums).
Let ``t`` be the k-th best half-precision score. The k rows that reach it all
score at least ``t − ε`` exactly, so the exact k-th best is at least ``t − ε``;
a row below ``t − 2ε`` in half precision scores below ``t − ε`` exactly and
cannot be among the best k. The scan therefore asks FAISS for ``k + margin``
candidates, checks that the last of them is below ``t − 2ε`` (else the list
may have cut off a contender: :meth:`HalfScan.search` returns None, and the
caller scans the float32 vectors), and re-scores the candidates against the
float32 vectors. Many equal vectors near the top (one boilerplate paragraph in
many documents) take that float32 path; the answer is the same either way.

Larger batches are left to the float32 matrix product, which reads the rows
once for all of them where the copy's scan reads them once a query; up to how
many queries a call the copies are worth is measured on the CPU
(:mod:`.half_limit`). On the AMD EPYC host of these figures, through the whole
search of the peer benchmark's 20,000 documents (two sealed segments with
copies, a growing one), one thread, two rounds: 4 queries 3.2–4.2 ms through
the copies against 4.8–4.9 ms in float32, 8 queries 6.6 against 6.4, 12
queries 9.0–9.2 against 6.7–7.1 (the copy's own scan alone, 16,384 rows: 4
queries 1.5 ms against 4.2, where the selection and re-scoring around it cost
less than in the index); on an Intel Xeon host with a far larger cache the
copies tied at one query and lost from two. Segments under 2,048 rows, whose
float32 rows stay in cache, get no copy
(:class:`~streamrag.index.search.SearchTuning` holds both limits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.index.ann import _faiss, faiss_search

__all__ = ["HalfScan"]

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]

_MARGIN = 32
"""Candidates asked for beyond ``k``: room for the half-precision scores' uncertainty."""

_FP16_MAX = 65504.0
"""The largest finite half-precision value: vectors with larger coordinates get no copy."""


class HalfScan:
    """The rows of one sealed segment in half precision, searched exactly (see the module)."""

    __slots__ = ("_index", "_slack", "rows")

    def __init__(self, index: Any, rows: int, slack: float) -> None:
        self._index = index
        self.rows = rows
        self._slack = slack

    @classmethod
    def build(cls, vectors: F32) -> HalfScan | None:
        """A copy of a sealed segment's rows; None if half precision cannot hold them."""
        n, dim = vectors.shape
        if n == 0:
            return None
        data = np.ascontiguousarray(vectors, dtype=np.float32)
        peak = float(np.abs(data).max())
        if not math.isfinite(peak) or peak >= _FP16_MAX:
            return None
        faiss = _faiss()
        index = faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
        )
        index.add(data)
        max_norm = float(np.sqrt(np.einsum("ij,ij->i", data, data).max()))
        slack = max_norm * (2.0**-11 + 2 * dim * 2.0**-24) + math.sqrt(dim) * 2.0**-25
        # A little over the bound, for the rounding of the bound's own arithmetic.
        return cls(index, n, slack * 1.01)

    def nbytes(self) -> int:
        """Two bytes per coordinate."""
        return int(self.rows * self._index.d * 2)

    def search(
        self,
        vectors: F32,
        queries: F32,
        k: int,
        mask: npt.NDArray[np.bool_] | None,
        matching: int,
    ) -> tuple[I64, F32] | None:
        """The exact top ``k`` rows of each query and their float32 scores, best first.

        ``vectors`` are the segment's float32 rows (for re-scoring), ``mask``
        the rows a query may see (None: all ``rows``), ``matching`` how many it
        admits. Where fewer than ``k`` match, the rest are row 0 scored -inf.
        None: a candidate list was too short to prove its answer; scan
        ``vectors`` instead.
        """
        faiss = _faiss()
        m = queries.shape[0]
        kk = min(k, matching)
        if kk <= 0:
            return None
        q = np.ascontiguousarray(queries, dtype=np.float32)
        eps = np.linalg.norm(q.astype(np.float64), axis=1) * self._slack
        # First without the mask: most rows usually pass it, and FAISS checks a
        # selector row by row, outside its fast loop (+40 % here).
        want = min(self.rows, k + _MARGIN)
        approx, labels = faiss_search(faiss, self._index, q, want)
        if m == 1:
            one = _one_query(
                vectors, q, approx, labels, mask, k, kk, float(eps[0]), want >= self.rows
            )
            if one is not None:
                return one
        valid = labels >= 0
        if mask is not None:
            valid &= mask[np.where(valid, labels, 0)]
        if not _proven(approx, valid, kk, eps, complete=want >= self.rows):
            if mask is None:
                return None
            bits = np.packbits(mask[: self.rows], bitorder="little")
            params = faiss.SearchParameters()
            params.sel = faiss.IDSelectorBitmap(self.rows, faiss.swig_ptr(bits))
            want = min(matching, k + _MARGIN)
            approx, labels = faiss_search(faiss, self._index, q, want, params)
            valid = labels >= 0
            if not _proven(approx, valid, kk, eps, complete=want >= matching):
                return None
        safe = np.where(valid, labels, 0)
        exact = np.einsum("tcd,td->tc", vectors[safe], q)
        exact = np.where(valid, exact, -np.inf).astype(np.float32, copy=False)
        order = np.argsort(-exact, axis=1, kind="stable")[:, :kk]
        rows = np.take_along_axis(safe, order, axis=1)
        scores = np.take_along_axis(exact, order, axis=1)
        if kk < k:
            pad = k - kk
            rows = np.hstack([rows, np.zeros((m, pad), dtype=np.int64)])
            scores = np.hstack([scores, np.full((m, pad), -np.inf, dtype=np.float32)])
        return rows.astype(np.int64, copy=False), scores


def _one_query(
    vectors: F32,
    q: F32,
    approx: F32,
    labels: I64,
    mask: npt.NDArray[np.bool_] | None,
    k: int,
    kk: int,
    eps: float,
    complete: bool,
) -> tuple[I64, F32] | None:
    """One query's proof and float32 re-score in a handful of array operations.

    The same answer as the general path (:func:`_proven`, then the re-score of
    every query's list), which takes some twenty numpy calls. Right after the
    scan each call runs with cold caches at four to five times its warm cost
    (``docs/performance.md``), so a lone query — the common call — takes the
    short way. None: not proven from this list (the general path decides).
    """
    lab = labels[0]
    keep = lab >= 0  # FAISS puts missing candidates last, as -1
    if mask is not None:
        keep &= mask[lab]  # a -1 reads the last row's bit; ``keep`` is False there already
    idx = np.flatnonzero(keep)
    if idx.size < kk:
        return None
    app = approx[0]
    if not complete and float(app[-1]) >= float(app[idx[kk - 1]]) - 2 * eps:
        return None
    cand = lab[idx]
    exact = vectors[cand] @ q[0]
    order = np.argsort(-exact, kind="stable")[:kk]
    rows = np.zeros((1, k), dtype=np.int64)
    scores = np.full((1, k), -np.inf, dtype=np.float32)
    rows[0, :kk] = cand[order]
    scores[0, :kk] = exact[order]
    return rows, scores


def _proven(
    approx: F32, valid: npt.NDArray[np.bool_], k: int, eps: npt.NDArray[np.float64], complete: bool
) -> bool:
    """Whether each query's candidate list holds its exact top ``k`` (see the module).

    ``approx``: each query's candidates' half-precision scores, best first;
    ``valid``: which of them the query may see. ``complete``: the list holds
    every row the query may see. Otherwise it needs ``k`` valid candidates, and
    its last score (the best any row left out can have) more than ``2·eps``
    below the k-th valid one.
    """
    if complete:
        return True
    seen = np.cumsum(valid, axis=1)
    if bool((seen[:, -1] < k).any()):
        return False
    at = np.argmax(seen >= k, axis=1)
    kth = approx[np.arange(approx.shape[0]), at].astype(np.float64)
    return not bool((approx[:, -1] >= kth - 2 * eps).any())
