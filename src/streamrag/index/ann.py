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

Neither structure knows about tombstones: a search asks for more candidates
than it needs and drops those the query may not see (see :mod:`.search`). All
structures run single-threaded per call; parallelism comes from concurrent
queries.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from streamrag.errors import MissingDependencyError

__all__ = ["Ann", "AnnSpec", "HnswAnn", "IvfPqAnn", "build_ann", "choose_ann", "load_hnsw"]

AnnKind = Literal["hnsw", "ivfpq"]


@dataclass(frozen=True, slots=True)
class AnnSpec:
    """When to build which structure, and its parameters."""

    min_rows: int = 8192
    ivfpq_min_rows: int = 2_000_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 100
    hnsw_ef_search: int = 64
    ivf_nprobe: int = 16
    pq_m: int = 48
    refine: int = 4
    seed: int = 0


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


def choose_ann(rows: int, spec: AnnSpec) -> AnnKind | None:
    """The structure a sealed segment of ``rows`` gets (None: searched exactly)."""
    if rows < spec.min_rows:
        return None
    return "ivfpq" if rows >= spec.ivfpq_min_rows else "hnsw"


def build_ann(kind: AnnKind, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> Ann:
    """Build a structure over ``vectors`` (unit rows); slow — never on the commit path."""
    if kind == "hnsw":
        return HnswAnn.build(vectors, spec)
    return IvfPqAnn.build(vectors, spec)


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

    def __init__(self, index: Any, rows: int, m: int) -> None:
        self.index = index
        self.rows = rows
        self._m = m

    @classmethod
    def build(cls, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> HnswAnn:
        """Insert every row, one thread, deterministic under ``spec.seed``."""
        n, dim = vectors.shape
        index = _hnswlib().Index(space="ip", dim=dim)
        index.init_index(
            max_elements=max(n, 1),
            M=spec.hnsw_m,
            ef_construction=spec.hnsw_ef_construction,
            random_seed=spec.seed,
        )
        index.set_num_threads(1)
        index.add_items(np.ascontiguousarray(vectors), np.arange(n), num_threads=1)
        index.set_ef(spec.hnsw_ef_search)
        return cls(index, n, spec.hnsw_m)

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


def load_hnsw(path: str, dim: int, rows: int, spec: AnnSpec) -> HnswAnn:
    """Read a graph written by :meth:`HnswAnn.save`."""
    index = _hnswlib().Index(space="ip", dim=dim)
    index.load_index(path, max_elements=max(rows, 1))
    index.set_num_threads(1)
    index.set_ef(spec.hnsw_ef_search)
    return HnswAnn(index, rows, spec.hnsw_m)


class IvfPqAnn:
    """A FAISS IVF-PQ index; candidates are re-scored exactly by the search path."""

    kind = "ivfpq"

    def __init__(self, index: Any, rows: int, refine: int) -> None:
        self.index = index
        self.rows = rows
        self.refine = refine

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
