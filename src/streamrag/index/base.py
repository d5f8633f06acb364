"""What goes into the index and what comes out: the index contract.

A micro-batch reaches the index as one :class:`CommitBatch`: a row per document
(:class:`DocOp`) and columns for the chunks of the upserted ones, vectors
included. The index applies it all at once and advances its **epoch** by one —
readers see the whole batch or none of it.

Per document the newest version is current: a change whose ``(event_time,
offset)`` is greater than the current version (:class:`DocState`) replaces it.
A delete leaves a tombstone that keeps its version, so an older upsert that
arrives later cannot bring the document back. An index that keeps history
(the LSM index) files an older change in the document's past instead of
ignoring it — see :mod:`streamrag.index.versions`; one that does not (the exact
index) ignores it as stale.

A query says what it may see with a :class:`SearchFilter`: the tenant (always
applied), domains, document ids, a range of event times, predicates on the
documents' own metadata (:class:`MetaPredicate`), and which version of the
index to read: the latest epoch, an exact earlier ``epoch``, or the documents
``as_of`` an event time.

Every index has the :class:`VectorIndex` methods. Some have more, and say so by
their methods alone: :class:`SupportsRollback`, :class:`SupportsHealth`,
:class:`Closeable` and :class:`ReportsRebuild` are ``runtime_checkable``
protocols, so a caller asks ``isinstance(index, SupportsRollback)`` instead of
looking a method up by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import msgspec
import numpy as np
import numpy.typing as npt

from streamrag.changes import Op
from streamrag.errors import IndexStoreError, QueryError
from streamrag.timing import Timestamp, format_timestamp

if TYPE_CHECKING:
    from streamrag.index.hits import Hits
    from streamrag.index.lsm_reads import IndexHealth

__all__ = [
    "Closeable",
    "CommitBatch",
    "CommitResult",
    "DocOp",
    "DocState",
    "Hit",
    "IndexStats",
    "KnowsEmbedders",
    "MetaPredicate",
    "MetaValue",
    "ReportsRebuild",
    "SearchFilter",
    "SupportsHealth",
    "SupportsRollback",
    "VectorIndex",
    "check_commit",
    "check_queries",
    "merge_cursor",
]


class DocOp(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One document's change in a commit.

    Its chunks are rows ``[first_chunk, first_chunk + n_chunks)`` of the batch.
    ``metadata`` is the document's own metadata (JSON scalars by key), which
    queries can filter on with :class:`MetaPredicate`.

    A ``msgspec`` struct: made once per change on the commit path, it is built
    in C, untracked by the garbage collector (it holds no cycle), and encodes
    as the array of its fields — the write-ahead log's layout of a document.
    """

    tenant: str
    doc_id: str
    op: Op
    event_time: Timestamp
    offset: int
    source: str
    domain: str = ""
    first_chunk: int = 0
    n_chunks: int = 0
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """Everything one micro-batch writes, in columns."""

    docs: list[DocOp]
    chunk_ids: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int32]
    texts: list[str]
    hashes: list[bytes]
    vectors: npt.NDArray[np.float32]
    embedder_version: str = ""
    chunk_embedders: Sequence[str] | None = None
    """Which embedder made each chunk's vector, when not all were made by ``embedder_version``
    (a fallback stood in for part of the batch, or a reused vector came from another)."""
    cursor: Mapping[str, Any] | None = None
    """Where the stream stands once this batch is in (see :func:`merge_cursor`).

    Written in the same log record as the batch, so the index and the stream
    position it reflects are durable together or not at all.
    """

    def embedders(self, rows: Sequence[int]) -> list[str]:
        """The embedder version of each of ``rows`` (chunks of this batch)."""
        per = self.chunk_embedders
        if per is None:
            return [self.embedder_version] * len(rows)
        return [per[i] for i in rows]


def merge_cursor(
    held: Mapping[str, Any] | None, update: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The cursor after a commit: ``update``'s keys replace those held, others stay.

    The pipeline writes every key that changed with each commit and leaves out
    the large ones that did not (a window whose state is unchanged), so a commit
    log stays small while the latest value of every key is always recoverable.

    >>> merge_cursor({"positions": {"a": 1}, "w": [1]}, {"positions": {"a": 9}})
    {'positions': {'a': 9}, 'w': [1]}
    """
    if update is None:
        return None if held is None else dict(held)
    merged = dict(held or {})
    merged.update(update)
    return merged


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did."""

    epoch: int
    applied_docs: int
    """Changes that became their document's current version."""
    stale_docs: int
    """Changes that changed nothing a read can see (held already, or too old to keep)."""
    chunks_added: int
    past_docs: int = 0
    """Changes older than their document's current version, filed in its history."""


@dataclass(slots=True)
class DocState:
    """The version of a document the index holds, and where its chunks are."""

    version: tuple[Timestamp, int]
    deleted: bool
    rows: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)


MetaValue = str | int | float | bool
"""A metadata value a predicate compares with: a JSON scalar."""


@dataclass(frozen=True, slots=True)
class MetaPredicate:
    """A condition on one key of the documents' metadata.

    Give ``values`` for equality or set membership (one value = equality), or
    ``gte`` / ``lt`` for a half-open numeric range ``[gte, lt)``; a document
    without the key, or with a value of another type, does not match.

    >>> MetaPredicate("lang", values=frozenset({"en"}))
    MetaPredicate(key='lang', values=frozenset({'en'}), gte=None, lt=None)
    >>> MetaPredicate("year", gte=2020, lt=2025).gte
    2020
    """

    key: str
    values: frozenset[MetaValue] | None = None
    gte: float | None = None
    lt: float | None = None

    def __post_init__(self) -> None:
        ranged = self.gte is not None or self.lt is not None
        if (self.values is None) == (not ranged) or (self.values is not None and ranged):
            msg = (
                f"metadata predicate on {self.key!r} needs either values (equality or a set) "
                f"or a range (gte and/or lt), not both and not neither"
            )
            raise QueryError(msg)
        if self.values is not None and not self.values:
            msg = f"metadata predicate on {self.key!r} has an empty set of values; give one or more"
            raise QueryError(msg)
        if self.gte is not None and self.lt is not None and self.gte >= self.lt:
            msg = (
                f"metadata range on {self.key!r} is empty: gte={self.gte} is not below "
                f"lt={self.lt}; give gte < lt"
            )
            raise QueryError(msg)


@dataclass(frozen=True, slots=True)
class SearchFilter:
    """Which chunks a query may see. The tenant is always applied.

    ``domains`` and ``doc_ids`` are sets (None = any); ``time_range`` is
    ``[start_us, end_us)`` on the document's event time, either end open (None);
    ``metadata`` predicates must all hold. Filters are applied before ranking,
    so a filtered query returns ``k`` results whenever ``k`` matching chunks exist.

    Which version is read: ``epoch`` pins an exact committed epoch (None = the
    latest); ``as_of_us`` answers with the documents as they were at that event
    time (None = as they are now). Both must lie within the index's history
    retention, else the search raises :class:`~streamrag.errors.QueryError`.
    """

    tenant: str = "default"
    domains: frozenset[str] | None = None
    doc_ids: frozenset[str] | None = None
    start_us: Timestamp | None = None
    end_us: Timestamp | None = None
    as_of_us: Timestamp | None = None
    epoch: int | None = None
    metadata: tuple[MetaPredicate, ...] = ()

    def __post_init__(self) -> None:
        if self.start_us is not None and self.end_us is not None and self.start_us >= self.end_us:
            msg = (
                f"time_range is empty: its start {format_timestamp(self.start_us)} is not "
                f"before its end {format_timestamp(self.end_us)}; give a start earlier than the end"
            )
            raise QueryError(msg)
        if self.epoch is not None and self.epoch < 0:
            msg = f"epoch must be 0 or more, found {self.epoch}"
            raise QueryError(msg)

    @property
    def reads_history(self) -> bool:
        """True when the query asks for an earlier version (``epoch`` or ``as_of``)."""
        return self.epoch is not None or self.as_of_us is not None


class Hit(msgspec.Struct, frozen=True):
    """One retrieved chunk and where it came from.

    A frozen struct rather than a dataclass: a search builds ``k`` of these per
    query, and a struct is built about 15 times faster.
    """

    score: float
    chunk_id: int
    tenant: str
    doc_id: str
    domain: str
    position: int
    text: str
    event_time: Timestamp
    source: str
    offset: int
    epoch: int
    embedder_version: str
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Sizes of one epoch."""

    epoch: int
    live_chunks: int
    live_docs: int
    deleted_docs: int
    rows: int
    committed_at_us: Timestamp


@runtime_checkable
class VectorIndex(Protocol):
    """A versioned vector index: one writer, any number of readers."""

    @property
    def dim(self) -> int:
        """Vector length."""
        ...

    @property
    def epoch(self) -> int:
        """The latest committed epoch (0 before the first commit)."""
        ...

    @property
    def cursor(self) -> dict[str, Any] | None:
        """The stream position committed with the latest epoch (None before any)."""
        ...

    def doc_state(self, tenant: str, doc_id: str) -> DocState | None:
        """The current version held for a document, or None if never seen."""
        ...

    def wants(self, tenant: str, doc_id: str, event_time: Timestamp, offset: int) -> bool:
        """Whether committing a change with this version would change any answer.

        The pipeline asks before embedding a change, so that a change read twice,
        or one too old to matter, costs no embedding.
        """
        ...

    def vectors_at(self, rows: Sequence[int]) -> npt.NDArray[np.float32]:
        """Copies of stored vectors, for reuse of unchanged chunks."""
        ...

    def commit(self, batch: CommitBatch) -> CommitResult:
        """Apply a micro-batch atomically and advance the epoch by one."""
        ...

    def search_many(
        self, queries: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits]]:
        """Top-``k`` hits per query row from one pinned epoch; returns (epoch, hits).

        Each query's hits are a :class:`~streamrag.index.hits.Hits`: a sequence of
        :class:`Hit`, whose chunk ids and scores can be read without building them.
        """
        ...

    def stats(self) -> IndexStats:
        """Sizes of the latest epoch."""
        ...

    def export(self) -> list[tuple[Hit, npt.NDArray[np.float32]]]:
        """Every live chunk of the latest epoch with its vector (for replays and audits)."""
        ...


@runtime_checkable
class KnowsEmbedders(Protocol):
    """An index that can say which embedder made a stored vector (chunk reuse keeps it)."""

    def embedders_at(self, rows: Sequence[int]) -> list[str]:
        """The embedder version of each row that :meth:`VectorIndex.doc_state` gives."""
        ...


@runtime_checkable
class SupportsRollback(Protocol):
    """An index that can make an earlier epoch's documents current again."""

    def rollback(self, epoch: int) -> int:
        """Publish epoch ``epoch``'s documents as a new epoch; returns the new epoch."""
        ...


@runtime_checkable
class SupportsHealth(Protocol):
    """An index with maintenance gauges (segments, tombstones, ANN builds, compactions)."""

    def health(self) -> IndexHealth:
        """The gauges of the latest epoch."""
        ...


@runtime_checkable
class Closeable(Protocol):
    """An index that holds threads or files: close it when done (it checkpoints first)."""

    def close(self) -> None:
        """Stop background work, write what must persist and release files."""
        ...


@runtime_checkable
class ReportsRebuild(Protocol):
    """An index that may have been rebuilt from its sources because its files were damaged."""

    rebuilt: dict[str, str] | None
    """None, or why it was rebuilt: ``reason``, ``damaged_file`` and ``moved_to``."""


def check_commit(batch: CommitBatch, dim: int) -> None:
    """Refuse a commit whose vectors do not match its chunks and the index's dimension."""
    if batch.vectors.shape != (len(batch.texts), dim):
        msg = (
            f"commit carries vectors of shape {batch.vectors.shape} for "
            f"{len(batch.texts)} chunks; expected ({len(batch.texts)}, {dim})"
        )
        raise IndexStoreError(msg)


def check_queries(queries: npt.NDArray[np.float32], dim: int, k: int) -> npt.NDArray[np.float32]:
    """Query vectors as a C-contiguous float32 ``(n, dim)`` matrix; refuse a wrong shape or ``k``.

    (Contiguous, so that FAISS may be handed its pointer as it is.)
    """
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if q.ndim != 2 or q.shape[1] != dim:
        msg = f"queries must have shape (n, {dim}); found {q.shape}"
        raise QueryError(msg)
    if k <= 0:
        msg = f"k must be positive, found {k}"
        raise QueryError(msg)
    return q
