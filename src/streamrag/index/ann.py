"""Approximate nearest-neighbour structures for sealed segments.

A sealed segment's rows never change, so an ANN structure is built for it once,
in the background, and then only read. Which one is chosen by size
(:func:`choose_ann`, thresholds in :class:`AnnSpec`), and the libraries were
chosen by measurement on a 2-core host at 100k × 384 clustered vectors:

- **HNSW** (hnswlib) for mid-size segments: ~6,800 single queries/s at
  recall@10 0.97–0.98 (M=32, ef=32), against ~4,700 for FAISS HNSW at the same
  recall. Inserts run at only ~1,000–5,000 vectors/s on one core, which is why
  nothing is ever inserted on the commit path: graphs are built for sealed
  segments by the maintenance thread.
- **IVF-PQ** (FAISS) for large segments: 76 bytes per vector instead of HNSW's
  ~1.8 KB, trained and filled at 9,500–58,000 vectors/s. Product quantization
  alone caps recall at 0.70–0.84, so its candidates are re-scored exactly
  against the segment's own float vectors (``refine`` × k of them).

**Which segments get one.** An exact scan is never wrong and, below
``min_rows`` (32k rows), cheap: measured here, one query over 8k / 32k / 131k
rows of 384 floats takes 0.19 / 1.5 / 6.1 ms (0.08 / 0.35 / 1.5 ms per query in
batches of 32), small beside embedding the query with MiniLM (p50 19.6 ms with
torch on one thread, as measured for this kind of host).

**Measured recall, per segment.** How well a graph or a quantizer works depends
on the data: on clustered vectors hnswlib at ef 64 finds 97–99.6 % of the true
top 10 (100k and 1M rows, as measured for this kind of host), but on vectors
with little structure — the hashing embedder's, queried with short keyword
queries — a graph over 16k rows found only 68–84 % at ef 64–256 (measured here). So every structure
is checked after it is built (:func:`calibrate`): leave-one-out recall@10 on a
sample of the segment's own rows, raising ef (HNSW) or nprobe (IVF-PQ) until it
reaches ``target_recall``. A structure that cannot is dropped and the segment is
scanned exactly: slower, never wrong. A segment's own rows are not the queries
users send, so the check is repeated on live traffic: the index keeps a sample of
recent query vectors and, every ``probe_every`` queries, the maintenance thread
measures each structure's recall@10 on them and widens or drops it the same way.

Neither structure knows about tombstones: a search asks for more candidates
than it needs and drops those the query may not see (see :mod:`.search`). All
structures run single-threaded per call; parallelism comes from concurrent
queries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from streamrag.errors import MissingDependencyError

_BUILD_PART = 1024
"""Rows an HNSW build inserts between two looks at whether it was cancelled (~0.5 s)."""

__all__ = [
    "Ann",
    "AnnSpec",
    "BuildCancelled",
    "HnswAnn",
    "IvfPqAnn",
    "build_ann",
    "calibrate",
    "choose_ann",
    "load_hnsw",
    "recall_at_10",
    "recall_on",
]

AnnKind = Literal["hnsw", "ivfpq"]


@dataclass(frozen=True, slots=True)
class AnnSpec:
    """When to build which structure, and its parameters."""

    min_rows: int = 32_768
    ivfpq_min_rows: int = 2_000_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 100
    hnsw_ef_search: int = 64
    ivf_nprobe: int = 16
    pq_m: int = 48
    refine: int = 4
    seed: int = 0
    target_recall: float = 0.95
    max_ef: int = 512
    calibration_rows: int = 128
    probe_queries: int = 128
    """Recent real queries kept to re-check each structure's recall as traffic changes."""
    probe_every: int = 512
    """Queries between two re-checks."""


class Ann(Protocol):
    """An immutable ANN structure over a segment's rows ``[0, n)``; labels are row numbers."""

    kind: str
    rows: int

    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
        """Candidate rows per query, best first (-1 pads), with exact scores if it has them."""
        ...

    def nbytes(self) -> int:
        """Memory held by the structure."""
        ...

    def widen(self, spec: AnnSpec) -> bool:
        """Search more of the structure per query (slower, more accurate); False at the limit."""
        ...


def choose_ann(rows: int, spec: AnnSpec) -> AnnKind | None:
    """The structure a sealed segment of ``rows`` gets (None: searched exactly)."""
    if rows < spec.min_rows:
        return None
    return "ivfpq" if rows >= spec.ivfpq_min_rows else "hnsw"


class BuildCancelled(Exception):
    """A build was given up because the index is closing (nothing is lost: it is rebuilt)."""


def build_ann(
    kind: AnnKind,
    vectors: npt.NDArray[np.float32],
    spec: AnnSpec,
    cancelled: Callable[[], bool] | None = None,
) -> Ann | None:
    """Build and calibrate a structure over ``vectors`` (unit rows).

    Returns None when it is not accurate enough on them. Slow — never on the
    commit path. ``cancelled`` is asked between parts of an HNSW build; when it
    says so the build stops with :class:`BuildCancelled` (a stop need not wait
    for a minute-long build).
    """
    if kind == "hnsw":
        ann: Ann = HnswAnn.build(vectors, spec, cancelled)
    else:
        ann = IvfPqAnn.build(vectors, spec)
    return calibrate(ann, vectors, spec)


def recall_at_10(
    ann: Ann, vectors: npt.NDArray[np.float32], sample: npt.NDArray[np.int64]
) -> float:
    """Leave-one-out recall@10 of ``ann`` with the sampled rows as queries."""
    return recall_on(ann, vectors, vectors[sample], exclude=sample)


def recall_on(
    ann: Ann,
    vectors: npt.NDArray[np.float32],
    queries: npt.NDArray[np.float32],
    exclude: npt.NDArray[np.int64] | None = None,
) -> float:
    """Recall@10 of ``ann`` over ``vectors`` for ``queries``.

    ``exclude`` names one row per query to leave out (leave-one-out). A
    candidate counts when its exact score reaches the true 10th-best score, so
    duplicate rows (ties) are not held against the structure.
    """
    k = min(10, vectors.shape[0] - (1 if exclude is not None else 0))
    if k <= 0 or queries.shape[0] == 0:
        return 1.0
    q = queries
    exact = q @ vectors.T
    if exclude is not None:
        exact[np.arange(len(exclude)), exclude] = -np.inf  # leave the query's own row out
    kth = -np.partition(-exact, k - 1, axis=1)[:, k - 1]
    labels, scores = ann.search(q, k + (1 if exclude is not None else 0))
    if scores is None:  # approximate candidates: rank them exactly, as the search path does
        safe = np.where(labels >= 0, labels, 0)
        scores = np.where(labels >= 0, np.take_along_axis(exact, safe, axis=1), -np.inf)
        order = np.argsort(-scores, axis=1, kind="stable")
        labels = np.take_along_axis(labels, order, axis=1)
    hits = 0
    for i, row in enumerate(labels.tolist()):
        own = int(exclude[i]) if exclude is not None else -1
        found = [c for c in row if c >= 0 and c != own][:k]
        hits += int(np.count_nonzero(exact[i, found] >= kth[i] - 1e-6))
    return float(hits / (k * q.shape[0]))


def calibrate(ann: Ann, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> Ann | None:
    """Widen the search until recall@10 reaches ``spec.target_recall``; None if it cannot."""
    n = vectors.shape[0]
    rng = np.random.default_rng(spec.seed)
    sample = np.sort(rng.choice(n, size=min(n, spec.calibration_rows), replace=False))
    while True:
        if recall_at_10(ann, vectors, sample) >= spec.target_recall:
            return ann
        if not ann.widen(spec):
            return None


def _hnswlib() -> Any:
    try:
        import hnswlib
    except ImportError:  # pragma: no cover - a dependency
        purpose = "The HNSW index"
        raise MissingDependencyError("hnswlib", None, purpose) from None  # noqa: EM101
    return hnswlib


_faiss_ready = threading.Lock()
_faiss_module: Any = None


def _faiss() -> Any:
    global _faiss_module
    with _faiss_ready:
        if _faiss_module is None:
            try:
                import faiss
            except ImportError:  # pragma: no cover - a dependency
                purpose = "The IVF-PQ index"
                raise MissingDependencyError("faiss-cpu", None, purpose) from None  # noqa: EM101
            # One thread per call (parallelism comes from concurrent queries), and
            # BLAS for batched distance computations (the shipped threshold is 128,000).
            faiss.omp_set_num_threads(1)
            faiss.cvar.distance_compute_blas_threshold = 20
            _faiss_module = faiss
    return _faiss_module


class HnswAnn:
    """An hnswlib graph (inner product) over a sealed segment."""

    kind = "hnsw"

    def __init__(self, index: Any, rows: int, m: int, ef: int) -> None:
        self.index = index
        self.rows = rows
        self._m = m
        self.ef = ef
        index.set_ef(ef)

    def widen(self, spec: AnnSpec) -> bool:
        """Double ef, up to ``spec.max_ef``."""
        if self.ef >= spec.max_ef:
            return False
        self.ef = min(spec.max_ef, self.ef * 2)
        self.index.set_ef(self.ef)
        return True

    @classmethod
    def build(
        cls,
        vectors: npt.NDArray[np.float32],
        spec: AnnSpec,
        cancelled: Callable[[], bool] | None = None,
    ) -> HnswAnn:
        """Insert every row, one thread, deterministic under ``spec.seed``.

        Rows go in parts of ``_BUILD_PART`` (the same graph as one call: inserts
        are sequential), so that ``cancelled`` can stop the build between parts.
        """
        n, dim = vectors.shape
        index = _hnswlib().Index(space="ip", dim=dim)
        index.init_index(
            max_elements=max(n, 1),
            M=spec.hnsw_m,
            ef_construction=spec.hnsw_ef_construction,
            random_seed=spec.seed,
        )
        index.set_num_threads(1)
        data = np.ascontiguousarray(vectors)
        for lo in range(0, n, _BUILD_PART):
            if cancelled is not None and cancelled():
                raise BuildCancelled
            hi = min(n, lo + _BUILD_PART)
            index.add_items(data[lo:hi], np.arange(lo, hi), num_threads=1)
        return cls(index, n, spec.hnsw_m, spec.hnsw_ef_search)

    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
        """Up to ``k`` rows per query and their inner products (the graph stores full vectors)."""
        k = min(k, self.rows)
        try:
            labels, distances = self.index.knn_query(queries, k=k, num_threads=1)
        except RuntimeError:
            # The graph could not produce k neighbours (tiny or disconnected):
            # the caller falls back to an exact scan.
            return np.full((queries.shape[0], k), -1, dtype=np.int64), None
        # hnswlib's inner-product distance is 1 - <q, v>.
        return labels.astype(np.int64), 1.0 - distances

    def save(self, path: str) -> None:
        """Write the graph to ``path``."""
        self.index.save_index(path)

    def nbytes(self) -> int:
        """Vectors plus links (level 0: 2·M ids per row, upper levels ~1/M of that)."""
        dim = int(self.index.dim)
        return self.rows * (dim * 4 + 2 * self._m * 4 + 8 + 16)


def load_hnsw(path: str, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> Ann | None:
    """Read a graph written by :meth:`HnswAnn.save` over ``vectors``, and calibrate it."""
    rows, dim = vectors.shape
    index = _hnswlib().Index(space="ip", dim=dim)
    index.load_index(path, max_elements=max(rows, 1))
    index.set_num_threads(1)
    return calibrate(HnswAnn(index, rows, spec.hnsw_m, spec.hnsw_ef_search), vectors, spec)


class IvfPqAnn:
    """A FAISS IVF-PQ index; candidates are re-scored exactly by the search path."""

    kind = "ivfpq"

    def __init__(self, index: Any, rows: int, refine: int) -> None:
        self.index = index
        self.rows = rows
        self.refine = refine

    def widen(self, spec: AnnSpec) -> bool:
        """Probe twice as many lists and re-score twice as many candidates, up to all lists."""
        idx = self.index
        if idx.nprobe >= idx.nlist and self.refine >= 64:
            return False
        idx.nprobe = min(idx.nlist, idx.nprobe * 2)
        self.refine = min(64, self.refine * 2)
        return True

    @classmethod
    def build(cls, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> IvfPqAnn:
        """Train coarse centroids and codebooks on a sample, then encode every row."""
        faiss = _faiss()
        n, dim = vectors.shape
        nlist = max(1, min(int(4 * np.sqrt(n)), n // 39))
        pq_m = spec.pq_m if dim % spec.pq_m == 0 else _divisor(dim, spec.pq_m)
        nbits = 8 if n >= 256 * 39 else max(1, int(np.log2(max(2, n // 39))))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(spec.seed)
        sample = vectors[
            np.sort(rng.choice(n, size=min(n, 256 * max(nlist, 2**nbits)), replace=False))
        ]
        index.train(np.ascontiguousarray(sample))
        index.add(np.ascontiguousarray(vectors))
        index.nprobe = spec.ivf_nprobe
        return cls(index, n, spec.refine)

    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
        """``refine × k`` candidates per query; their scores are approximate, so none are given."""
        kk = min(self.rows, k * self.refine)
        _, labels = self.index.search(np.ascontiguousarray(queries), kk)
        return np.asarray(labels, dtype=np.int64), None

    def nbytes(self) -> int:
        """Codes and ids per row, plus centroids and codebooks."""
        idx = self.index
        return int(self.rows * (idx.code_size + 8) + idx.nlist * idx.d * 4 + idx.d * 256 * 4)


def _divisor(dim: int, want: int) -> int:
    for m in range(min(want, dim), 0, -1):
        if dim % m == 0:
            return m
    return 1
