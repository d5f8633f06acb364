"""Approximate nearest-neighbour structures for sealed segments.

A sealed segment's rows never change, so an ANN structure is built for it once,
in the background, and then only read. Which one is chosen by size
(:func:`choose_ann`, thresholds in :class:`AnnSpec`), and the libraries were
chosen by measurement at 100k × 384 clustered vectors:

- **HNSW** (FAISS ``IndexHNSWFlat``, inner product) for mid-size segments.
  Against hnswlib and usearch with the same M and ef_construction, at the
  smallest ef reaching recall@10 ≥ 0.95 and one query per call on one thread
  (benchmarks/results/ann-libraries.md, 2 shared cores): M=32, ef 16, FAISS ran
  3,500 queries/s, hnswlib 2,750 (0.78–0.80× FAISS's in each pass) and usearch
  1,400; M=16 (ef 32–40) kept that order. FAISS also inserted fastest on one
  thread (1,900 vectors/s against 1,500–1,700 and 900–1,000), and its ``IDSelector``
  filtered search was the fastest filter. hnswlib has no wheel for any platform
  (installing it needs a C++ compiler) and FAISS is here for IVF-PQ anyway. The
  host was loaded (1-min load 2–3 on 2 cores): on a quiet one hnswlib's own
  graph ran ~10,000 queries/s at ef 16 (benchmarks/results/index.md); compare
  the libraries within one run. At ~2,000 inserts/s on one core nothing is ever
  inserted on the commit path: graphs are built for sealed segments by the
  maintenance thread.
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
on the data: on clustered vectors an HNSW graph at ef 64 finds 97–99.6 % of the
true top 10 (hnswlib's, 100k and 1M rows, as measured for this kind of host;
FAISS's finds as many at every ef, ann-libraries.md), but on vectors with little
structure — the hashing embedder's, queried with short keyword queries — a
graph over 16k rows found only 68–84 % at ef 64–256 (measured here). So every structure
is checked after it is built (:func:`calibrate`): leave-one-out recall@10 on a
sample of the segment's own rows, raising ef (HNSW) or nprobe (IVF-PQ) until it
reaches ``target_recall``. A structure that cannot is dropped and the segment is
scanned exactly: slower, never wrong. A segment's own rows are not the queries
users send, so the check is repeated on live traffic: the index keeps a sample of
recent query vectors and, every ``probe_every`` queries, the maintenance thread
measures each structure's recall@10 on them and widens or drops it the same way.
A re-check costs an exact scan of every structure's rows for the whole sample
(~100 ms for 128 queries over a 32,768-row graph on one core, about 15 % of the
queries' own time at every 512), so while re-checks change nothing the interval
doubles, up to ``probe_every_max``; a structure built, widened or dropped brings
it back to ``probe_every``.

Neither structure knows about tombstones: a search asks for more candidates
than it needs and drops those the query may not see (see :mod:`.search`). (A
FAISS ``IDSelectorBitmap`` over the same mask measured 9–18 % faster than that
with 10 % or 50 % of rows excluded: not yet worth a second search path.) All
structures run single-threaded per call, OpenMP set to one thread in every
thread that calls FAISS (:func:`_faiss`); parallelism comes from concurrent
queries.

**Files.** A graph is saved beside its sealed segment (:meth:`HnswAnn.save`): a
header naming the format, then FAISS's own bytes. A file of any other format —
the hnswlib graphs of earlier versions — or over other rows is never read as
the segment's graph: :func:`load_hnsw` builds the graph again. IVF-PQ
structures are not saved (they are rebuilt on open).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from streamrag.cpus import thread_cpus
from streamrag.errors import ForeignFileError, MissingDependencyError, QueryError

_BUILD_PART = 1024
"""Rows an HNSW build inserts between two looks at whether it was cancelled (~0.5 s)."""

__all__ = [
    "Ann",
    "AnnSpec",
    "BuildCancelled",
    "HnswAnn",
    "IvfPqAnn",
    "build_ann",
    "build_threads",
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
    build_threads: int = 0
    """Threads that insert into one HNSW graph while the index is idle (0: every CPU the
    building thread may use; see :func:`build_threads`). With more than one the graph depends on
    their timing."""
    target_recall: float = 0.95
    max_ef: int = 512
    calibration_rows: int = 128
    probe_queries: int = 128
    """Recent real queries kept to re-check each structure's recall as traffic changes."""
    probe_every: int = 512
    """Queries between two re-checks while structures are new or traffic changes them."""
    probe_every_max: int = 16_384
    """The longest interval: each re-check that changes nothing doubles it up to this."""


class Ann(Protocol):
    """An immutable ANN structure over a segment's rows ``[0, n)``; labels are row numbers."""

    kind: str
    rows: int

    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
        """Candidate rows per query, best first (-1 pads), with exact scores if it has them."""
        ...

    def top_k(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        """The hot path: each query's ``k`` best rows and their exact scores, best first.

        ``queries`` are checked already (a C-contiguous float32 ``(m, d)`` block)
        and ``0 < k <= rows``. None when the structure's scores are approximate
        or it reached fewer than ``k`` rows for some query: then :meth:`search`.
        """
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
    busy: Callable[[], bool] | None = None,
) -> Ann | None:
    """Build and calibrate a structure over ``vectors`` (unit rows).

    Returns None when it is not accurate enough on them. Slow — never on the
    commit path. ``cancelled`` is asked between parts of an HNSW build; when it
    says so the build stops with :class:`BuildCancelled` (a stop need not wait
    for a minute-long build). ``busy`` too: while it says so, the next part is
    built on one thread (:meth:`HnswAnn.build`).
    """
    if kind == "hnsw":
        ann: Ann = HnswAnn.build(vectors, spec, cancelled, busy)
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


_faiss_ready = threading.Lock()
_faiss_module: Any = None
_one_thread = threading.local()


def all_found(labels: npt.NDArray[np.int64]) -> bool:
    """Whether every query got all its candidates: FAISS puts missing ones (-1) last.

    One query (the common call) is read as a Python int: a numpy reduction over
    a handful of labels costs more than the rest of this check.
    """
    if labels.size == 0:
        return True
    if labels.shape[0] == 1:
        return int(labels.item(labels.size - 1)) >= 0
    return int(labels[:, -1].min()) >= 0


def faiss_search(
    faiss: Any, index: Any, queries: npt.NDArray[np.float32], k: int, params: Any = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """FAISS's ``index.search(queries, k)``: ``(scores, labels)``, each ``(n, k)``.

    Called at FAISS's C++ entry point, into arrays made here: its Python
    ``search`` does the same with more checks, which cost ~12 us a lone query
    (of ~120-140) on the 100k-row benchmark graph. The pointers must be to a
    C-contiguous float32 ``(n, d)`` block: that is checked here, not by FAISS.
    """
    x = np.ascontiguousarray(queries, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != index.d:
        msg = f"queries must have shape (n, {index.d}); found {x.shape}"
        raise QueryError(msg)
    return _search_c(faiss, index, x, k, params)


def _search_c(
    faiss: Any, index: Any, x: npt.NDArray[np.float32], k: int, params: Any = None
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """:func:`faiss_search` for a block known to be C-contiguous float32 of the index's width."""
    m = x.shape[0]
    scores = np.empty((m, k), dtype=np.float32)
    labels = np.empty((m, k), dtype=np.int64)
    ptr = faiss.swig_ptr
    index.search_c(m, ptr(x), k, ptr(scores), ptr(labels), params)
    return scores, labels


def build_threads(spec: AnnSpec) -> int:
    """Threads that build a graph while the index is idle: ``spec.build_threads`` or CPUs.

    0 stands for every CPU the building thread may use
    (:func:`streamrag.cpus.thread_cpus`): OpenMP's threads inherit its
    affinity, so a thread pinned to one CPU gains nothing from more.

    A bulk load leaves minutes of graph building behind it (1M rows: one core
    busy for more than ten minutes, docs/performance.md), while a job that has
    caught up and takes no queries leaves the other cores idle. While queries
    or commits come in, a build stays on one thread: measured, a second
    building thread at the maintenance thread's lower priority (which OpenMP's
    threads inherit from the thread that starts them) still raised query p99
    during ingest by a quarter to a third.
    """
    if spec.build_threads > 0:
        return spec.build_threads
    return len(thread_cpus())


def _faiss() -> Any:
    """FAISS, with OpenMP set to one thread in the calling thread.

    OpenMP keeps its thread count per thread: set once in the main thread, it
    would not hold in the maintenance thread or in the threads serving queries,
    where a batched search would then use every core. So each thread that
    builds or searches sets it, once.
    """
    faiss = _faiss_module if _faiss_module is not None else _import_faiss()
    if not getattr(_one_thread, "set", False):
        faiss.omp_set_num_threads(1)
        _one_thread.set = True
    return faiss


def _import_faiss() -> Any:
    global _faiss_module
    with _faiss_ready:
        if _faiss_module is None:
            try:
                import faiss
            except ImportError:  # pragma: no cover - a dependency
                purpose = "The HNSW and IVF-PQ indexes"
                raise MissingDependencyError("faiss-cpu", None, purpose) from None  # noqa: EM101
            # BLAS for batched distance computations (the shipped threshold is 128,000).
            faiss.cvar.distance_compute_blas_threshold = 20
            _faiss_module = faiss
    return _faiss_module


_HNSW_HEADER = b"streamrag hnsw: faiss 1\n"
"""What an HNSW file starts with: the format of what follows (FAISS's ``write_index``).

Files written by hnswlib (streamrag before FAISS) start with eight zero bytes
(their level-0 offset), so neither is ever read as the other.
"""


class HnswAnn:
    """A FAISS HNSW graph (``IndexHNSWFlat``, inner product) over a sealed segment."""

    kind = "hnsw"

    def __init__(self, index: Any, rows: int, ef: int) -> None:
        self.index = index
        self.rows = rows
        self.ef = ef
        index.hnsw.efSearch = ef
        hnsw = index.hnsw
        # Vectors, then links: ids per level of every row, offsets and levels.
        links = hnsw.neighbors.size() * 4 + hnsw.offsets.size() * 8 + hnsw.levels.size() * 4
        self._nbytes = int(rows * index.d * 4 + links)

    def widen(self, spec: AnnSpec) -> bool:
        """Double ef, up to ``spec.max_ef``."""
        if self.ef >= spec.max_ef:
            return False
        self.ef = min(spec.max_ef, self.ef * 2)
        self.index.hnsw.efSearch = self.ef
        return True

    @classmethod
    def build(
        cls,
        vectors: npt.NDArray[np.float32],
        spec: AnnSpec,
        cancelled: Callable[[], bool] | None = None,
        busy: Callable[[], bool] | None = None,
    ) -> HnswAnn:
        """Insert every row; levels drawn under ``spec.seed``.

        Rows go in parts of ``_BUILD_PART``, so that ``cancelled`` can stop the
        build between parts. (FAISS inserts the rows of one call highest level
        first, so the graph differs from a one-call build's; it is as good.)
        Each part goes in on :func:`build_threads` threads, or on one while
        ``busy()`` says the index is in use (asked before each part). With one
        thread the graph is the same every time; with more, FAISS inserts a
        part's rows in parallel, each under its own lock, and the links depend
        on their timing (the recall is calibrated either way).
        """
        faiss = _faiss()
        n, dim = vectors.shape
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.hnsw_ef_construction
        index.hnsw.rng = faiss.RandomGenerator(spec.seed)  # the rows' levels
        data = np.ascontiguousarray(vectors, dtype=np.float32)
        wide, threads = build_threads(spec), 1
        try:
            for lo in range(0, n, _BUILD_PART):
                if cancelled is not None and cancelled():
                    raise BuildCancelled
                want = 1 if wide == 1 or (busy is not None and busy()) else wide
                if want != threads:
                    faiss.omp_set_num_threads(want)
                    threads = want
                index.add(data[lo : lo + _BUILD_PART])
        finally:
            faiss.omp_set_num_threads(1)  # searches in this thread stay on one core
        return cls(index, n, spec.hnsw_ef_search)

    def search(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32] | None]:
        """Up to ``k`` rows per query and their inner products (the graph stores full vectors).

        Where the graph reaches fewer than ``k`` rows the rest are -1, scored -inf.
        """
        faiss = _faiss()
        k = min(k, self.rows)
        m = queries.shape[0]
        if k <= 0 or m == 0:
            return np.full((m, max(k, 0)), -1, dtype=np.int64), np.zeros((m, max(k, 0)), np.float32)
        scores, labels = faiss_search(faiss, self.index, queries, k)
        if not all_found(labels):
            scores = np.where(labels >= 0, scores, np.float32(-np.inf))
        return labels, scores

    def top_k(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        """The graph's ``k`` best for checked queries; None if it reached fewer for one."""
        scores, labels = _search_c(_faiss(), self.index, queries, k)
        return (labels, scores) if all_found(labels) else None

    def save(self, path: str) -> None:
        """Write the graph to ``path``: :data:`_HNSW_HEADER`, then FAISS's own bytes."""
        faiss = _faiss()
        with open(path, "wb") as fh:
            fh.write(_HNSW_HEADER)
            faiss.write_index(self.index, faiss.PyCallbackIOWriter(fh.write))

    def nbytes(self) -> int:
        """Vectors plus links (level 0: 2·M ids per row, upper levels ~1/M of that)."""
        return self._nbytes


def load_hnsw(path: str, vectors: npt.NDArray[np.float32], spec: AnnSpec) -> Ann | None:
    """Read a graph written by :meth:`HnswAnn.save` over ``vectors``, and calibrate it.

    A file of another format (an hnswlib graph, written before streamrag moved
    to FAISS) or over other rows is never read as this segment's graph: it
    raises :class:`~streamrag.errors.ForeignFileError`, and the index builds the
    graph again in the background (the segment is scanned exactly meanwhile).
    """
    rows, dim = vectors.shape
    index = _read_hnsw(path)
    if index is None or int(index.ntotal) != rows or int(index.d) != dim:
        msg = (
            f"{path} is not a FAISS HNSW graph of these {rows} rows (an hnswlib graph of an "
            "earlier streamrag?)"
        )
        raise ForeignFileError(msg)
    return calibrate(HnswAnn(index, rows, spec.hnsw_ef_search), vectors, spec)


def _read_hnsw(path: str) -> Any:
    """The FAISS inner-product HNSW graph in ``path``, or None if it holds something else."""
    faiss = _faiss()
    with open(path, "rb") as fh:
        if fh.read(len(_HNSW_HEADER)) != _HNSW_HEADER:
            return None
        try:
            index = faiss.read_index(faiss.PyCallbackIOReader(fh.read))
        except RuntimeError:
            return None
    if not isinstance(index, faiss.IndexHNSWFlat):
        return None
    return index if index.metric_type == faiss.METRIC_INNER_PRODUCT else None


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
        faiss = _faiss()
        kk = min(self.rows, k * self.refine)
        _, labels = faiss_search(faiss, self.index, queries, kk)
        return labels, None

    def top_k(
        self, queries: npt.NDArray[np.float32], k: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        """None: product-quantized scores are approximate (:meth:`search`, then re-score)."""
        return None

    def nbytes(self) -> int:
        """Codes and ids per row, plus centroids and codebooks."""
        idx = self.index
        return int(self.rows * (idx.code_size + 8) + idx.nlist * idx.d * 4 + idx.d * 256 * 4)


def _divisor(dim: int, want: int) -> int:
    for m in range(min(want, dim), 0, -1):
        if dim % m == 0:
            return m
    return 1
