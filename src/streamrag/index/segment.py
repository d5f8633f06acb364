"""Segments: the unit of storage of the LSM index.

A segment holds chunk rows: their vectors and their columns (ids, event times,
tenant, domain, text, metadata, ...). Rows are only ever appended. A
**growing** segment takes the rows of new commits and is searched exactly;
when it holds ``seal_rows`` rows it is **sealed**: its rows never change
again, and an ANN structure is built for it in the background. Segments are
sized by rows, not by time: one covers as much event time as its rows span,
and a query skips it from the bounds it keeps (the event times it holds, the
epochs that wrote it, how much of it is history).

Every row is one chunk of one version of a document and *bitemporal*: it has a
valid time (``valid_from`` … ``valid_to``: when the version was the
document's state, in event time) and a transaction time (the epochs in which
the index knew it so). What changes after a row is written are its stamps:

- ``sup`` — the epoch from which the row has an end in valid time
  (:data:`NEVER` while its version is the document's newest), and
- ``valid_to`` — that end: the event time of the next version or delete.
- ``dead`` — the epoch from which the row is not read at all (:data:`NEVER`
  unless a later change replaced it with a copy, see below).

A read at epoch ``N``, as of event time ``T``, sees a row iff::

    created ≤ N < dead  and  valid_from ≤ T  and  not (sup ≤ N and valid_to ≤ T)

(``T`` = +∞ for "as things are now": then the last clause is ``sup > N``, and
``dead`` never matters because a row is only ever killed after it was stamped).
A stamp is only ever written with an epoch later than every epoch published so
far, so writing it in place never changes what a reader of an earlier epoch
sees: one set of arrays holds the versions of every epoch at once, and a commit
costs no copy.

A row's end in valid time can only move earlier as more changes arrive (a late
change splits the interval it falls in). The first end is stamped in place;
for a later one the row is killed (``dead``) and a copy carrying the new end is
appended — rare, since it takes a late change landing inside an interval that
was already closed. A copy's ``created`` is the epoch that made it; its
``committed`` stays the epoch that committed the version (what a hit cites).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from streamrag.index.base import MetaPredicate, MetaValue

if TYPE_CHECKING:
    from streamrag.index.ann import Ann
    from streamrag.index.half import HalfScan

__all__ = ["NEVER", "ReadSpec", "Rows", "Segment"]

NEVER = int(np.iinfo(np.int64).max)
"""The stamp of a row nothing has superseded (and the open end of time)."""

I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]


class ReadSpec(NamedTuple):
    """One query's view, compiled once: which epoch, which event time, which rows.

    A named tuple: immutable, and made once per search at a third of a frozen
    dataclass's cost (0.6 against 1.8 us here, on every query's path).
    """

    epoch: int
    as_of: int  # NEVER = as things are now
    tenant: str
    domains: frozenset[str] | None = None
    doc_ids: frozenset[str] | None = None
    start_us: int | None = None
    end_us: int | None = None
    metadata: tuple[MetaPredicate, ...] = ()

    @property
    def narrows(self) -> bool:
        """True when anything beyond tenant and version restricts the rows."""
        return bool(
            self.domains is not None
            or self.doc_ids is not None
            or self.start_us is not None
            or self.end_us is not None
            or self.metadata
        )


@dataclass(slots=True)
class Rows:
    """A block of chunk rows in columns: what is appended to or read from a segment."""

    vectors: F32
    rids: I64
    chunk_ids: I64
    positions: npt.NDArray[np.int32]
    valid_from: I64
    offsets: I64
    created: I64
    committed: I64
    sup: I64
    valid_to: I64
    dead: I64
    tenants: list[str]
    doc_ids: list[str]
    domains: list[str]
    sources: list[str]
    embedders: list[str]
    texts: list[str]
    hashes: list[bytes]
    metadata: list[Mapping[str, Any] | None]

    def __len__(self) -> int:
        return int(self.rids.shape[0])

    def select(self, idx: I64) -> Rows:
        """The rows at positions ``idx``, as a new block."""
        picks = idx.tolist()
        cols: dict[str, Any] = {name: getattr(self, name)[idx] for name in _ARRAYS}
        for name in _LISTS:
            col = getattr(self, name)
            cols[name] = [col[i] for i in picks]
        return Rows(vectors=self.vectors[idx], **cols)

    @staticmethod
    def concat(blocks: Sequence[Rows]) -> Rows:
        """Blocks end to end, in order (at least one)."""
        if len(blocks) == 1:
            return blocks[0]
        cols: dict[str, Any] = {
            name: np.concatenate([getattr(b, name) for b in blocks]) for name in _ARRAYS
        }
        for name in _LISTS:
            cols[name] = [v for b in blocks for v in getattr(b, name)]
        return Rows(vectors=np.concatenate([b.vectors for b in blocks]), **cols)


_ARRAYS = (
    "rids",
    "chunk_ids",
    "positions",
    "valid_from",
    "offsets",
    "created",
    "committed",
    "sup",
    "valid_to",
    "dead",
)
_NEVER_FILLED = frozenset({"created", "sup", "valid_to", "dead"})
_FIRST_ROWS = 256
"""Rows a new segment allocates; it doubles from there up to its capacity."""
_LISTS = ("tenants", "doc_ids", "domains", "sources", "embedders", "texts", "hashes", "metadata")


class _Codes:
    """A string column as small integer codes, for vectorized equality and set filters."""

    __slots__ = ("codes", "column", "counts", "names")

    def __init__(self, capacity: int) -> None:
        self.codes: dict[str, int] = {}
        self.names: list[str] = []
        self.counts: list[int] = []
        self.column: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)

    def extend(self, lo: int, values: Sequence[str]) -> None:
        codes, column = self.codes, self.column
        out = np.empty(len(values), dtype=np.int32)
        for i, v in enumerate(values):
            c = codes.get(v)
            if c is None:
                c = codes[v] = len(self.names)
                self.names.append(v)
                self.counts.append(0)
            self.counts[c] += 1
            out[i] = c
        column[lo : lo + len(values)] = out

    def wanted(self, values: frozenset[str]) -> list[int]:
        return [self.codes[v] for v in values if v in self.codes]


class Segment:
    """Rows of chunk versions; growing (appended to) until sealed.

    One writer appends and stamps; readers see rows ``[0, n)`` of the manifest
    they pinned, so rows appended later are invisible to them.
    """

    def __init__(self, seg_id: int, dim: int, capacity: int) -> None:
        self.id = seg_id
        self.dim = dim
        self.capacity = capacity  # rows it may hold before it is sealed
        # Columns start small and double as rows arrive: a small index, or one
        # that commits rarely, need not hold a whole segment's worth of memory.
        alloc = min(capacity, _FIRST_ROWS)
        self.alloc = alloc
        self.n = 0
        self.sealed = False
        self.ann: Ann | None = None
        # A segment searched exactly may get a half-precision copy (.half): of all its
        # rows once sealed, of its first rows while growing.
        self.half: HalfScan | None = None
        self.file: str | None = None  # the sealed body's file name, once written
        self.ann_file: str | None = None  # the ANN structure's file name, once written
        self.vectors: F32 = np.zeros((alloc, dim), dtype=np.float32)
        self.rids: I64 = np.zeros(alloc, dtype=np.int64)
        self.chunk_ids: I64 = np.zeros(alloc, dtype=np.int64)
        self.positions: npt.NDArray[np.int32] = np.zeros(alloc, dtype=np.int32)
        self.valid_from: I64 = np.zeros(alloc, dtype=np.int64)
        self.offsets: I64 = np.zeros(alloc, dtype=np.int64)
        self.created: I64 = np.full(alloc, NEVER, dtype=np.int64)
        self.committed: I64 = np.zeros(alloc, dtype=np.int64)
        self.sup: I64 = np.full(alloc, NEVER, dtype=np.int64)
        self.valid_to: I64 = np.full(alloc, NEVER, dtype=np.int64)
        self.dead: I64 = np.full(alloc, NEVER, dtype=np.int64)
        self.tenants: list[str] = []
        self.doc_ids: list[str] = []
        self.domains: list[str] = []
        self.sources: list[str] = []
        self.embedders: list[str] = []
        self.texts: list[str] = []
        self.hashes: list[bytes] = []
        self.metadata: list[Mapping[str, Any] | None] = []
        self.tenant_codes = _Codes(alloc)
        self.domain_codes = _Codes(alloc)
        self.doc_codes = _Codes(alloc)
        self.min_created = NEVER
        self.max_created = -1
        self.min_valid_from = NEVER
        self.max_valid_from = -(2**63)
        self.stamped = 0  # rows with an end in valid time so far (at the latest epoch)
        self.killed = 0  # rows replaced by a copy (``dead`` set)
        self.last_stamp = -1  # the latest epoch any stamp carries
        self.max_valid_to = -(2**63)  # the latest end any stamped row has
        self.text_bytes = 0
        self._meta_cache: dict[tuple[str, int], tuple[dict[tuple[str, Any], int], Any, Any]] = {}

    # -- writing (one writer) --------------------------------------------------

    @property
    def room(self) -> int:
        """Rows that can still be appended."""
        return 0 if self.sealed else self.capacity - self.n

    def append(self, rows: Rows) -> None:
        """Write rows past the end readers can see, then extend ``n``."""
        m = len(rows)
        if m == 0:
            return
        lo, hi = self.n, self.n + m
        if hi > self.capacity or self.sealed:
            msg = f"segment {self.id} has room for {self.room} rows, not {m}"
            raise AssertionError(msg)
        if hi > self.alloc:
            self._grow(hi)
        self.vectors[lo:hi] = rows.vectors
        for name in _ARRAYS:
            getattr(self, name)[lo:hi] = getattr(rows, name)
        for name in _LISTS:
            getattr(self, name).extend(getattr(rows, name))
        self.tenant_codes.extend(lo, rows.tenants)
        self.domain_codes.extend(lo, rows.domains)
        self.doc_codes.extend(lo, rows.doc_ids)
        self.min_created = min(self.min_created, int(rows.created.min()))
        self.max_created = max(self.max_created, int(rows.created.max()))
        self.min_valid_from = min(self.min_valid_from, int(rows.valid_from.min()))
        self.max_valid_from = max(self.max_valid_from, int(rows.valid_from.max()))
        self.text_bytes += sum(map(len, rows.texts))
        # Bounds first, then ``n``, then the counts: a reader judging "every row
        # has an end" from ``stamped == n`` never sees the count of rows it lacks.
        stamped = rows.sup != NEVER
        killed = rows.dead != NEVER
        if stamped.any():
            self.last_stamp = max(self.last_stamp, int(rows.sup[stamped].max()))
            self.max_valid_to = max(self.max_valid_to, int(rows.valid_to[stamped].max()))
        if killed.any():
            self.last_stamp = max(self.last_stamp, int(rows.dead[killed].max()))
        self.n = hi
        self.stamped += int(np.count_nonzero(stamped))
        self.killed += int(np.count_nonzero(killed))

    def _grow(self, rows: int) -> None:
        """Reallocate the columns for at least ``rows`` rows (doubling, up to capacity).

        Readers keep whichever arrays they already hold: rows ``[0, n)`` are the
        same in both, and stamps written to the new arrays only ever carry epochs
        newer than any reader of the old ones can see.
        """
        new = min(self.capacity, max(rows, 2 * self.alloc))
        old_n = self.alloc
        vectors = np.zeros((new, self.dim), dtype=np.float32)
        vectors[:old_n] = self.vectors
        self.vectors = vectors
        for name in _ARRAYS:
            col = getattr(self, name)
            grown = np.full(new, NEVER if name in _NEVER_FILLED else 0, dtype=col.dtype)
            grown[:old_n] = col
            setattr(self, name, grown)
        for codes in (self.tenant_codes, self.domain_codes, self.doc_codes):
            column = np.zeros(new, dtype=np.int32)
            column[:old_n] = codes.column
            codes.column = column
        self.alloc = new

    def stamp(self, local: I64, epoch: int, valid_to: I64 | int) -> None:
        """Give rows an end in valid time from ``epoch`` on (in place; module doc).

        Rows stamped before ``epoch`` must not be given another end here: that
        is a kill and a copy (:meth:`kill`). Rows stamped in ``epoch`` itself
        may be: no reader sees that epoch yet.
        """
        fresh = int(np.count_nonzero(self.sup[local] == NEVER))
        self.valid_to[local] = valid_to
        self.sup[local] = epoch
        # The bounds before the count (see :meth:`append`).
        self.last_stamp = max(self.last_stamp, epoch)
        if local.shape[0]:
            self.max_valid_to = max(self.max_valid_to, int(np.max(self.valid_to[local])))
        self.stamped += fresh

    def kill(self, local: I64, epoch: int) -> None:
        """Stop reading rows from ``epoch`` on: a copy with a new end replaces them."""
        self.dead[local] = epoch
        self.killed += int(local.shape[0])
        self.last_stamp = max(self.last_stamp, epoch)

    def refresh_bounds(self) -> None:
        """Recount the stamp bounds from the columns (after stamps were rewritten)."""
        n = self.n
        sup, dead = self.sup[:n], self.dead[:n]
        stamped = sup != NEVER
        killed = dead != NEVER
        self.stamped = int(np.count_nonzero(stamped))
        self.killed = int(np.count_nonzero(killed))
        self.last_stamp = max(
            int(sup[stamped].max()) if self.stamped else -1,
            int(dead[killed].max()) if self.killed else -1,
        )
        self.max_valid_to = int(self.valid_to[:n][stamped].max()) if self.stamped else -(2**63)

    def with_new_stamps(self) -> Segment:
        """A sealed copy that shares every column but has its own stamp arrays.

        A rollback rewrites stamps; doing it on a copy leaves what readers of
        earlier manifests see untouched.
        """
        clone = object.__new__(Segment)
        for name in _SLOTS:
            setattr(clone, name, getattr(self, name))
        clone.sup = self.sup.copy()
        clone.valid_to = self.valid_to.copy()
        clone.dead = self.dead.copy()
        clone.sealed = True
        clone._meta_cache = {}
        return clone

    def seal(self) -> None:
        """No more rows: from now on the segment's rows are immutable."""
        self.sealed = True

    @classmethod
    def from_rows(cls, seg_id: int, rows: Rows, *, sealed: bool, capacity: int = 0) -> Segment:
        """A segment holding ``rows`` (a copy), sealed or growing with room up to ``capacity``."""
        dim = int(rows.vectors.shape[1])
        seg = cls(seg_id, dim, max(capacity, len(rows), 1))
        seg.append(rows)
        seg.sealed = sealed
        return seg

    # -- reading -----------------------------------------------------------------

    def take(self, local: I64) -> Rows:
        """Copies of the given rows, stamps included."""
        picks = local.tolist()
        cols: dict[str, Any] = {name: getattr(self, name)[local] for name in _ARRAYS}
        for name in _LISTS:
            col = getattr(self, name)
            cols[name] = [col[i] for i in picks]
        return Rows(vectors=self.vectors[local], **cols)

    def nbytes(self) -> int:
        """Approximate memory held: vectors, number columns, strings and the ANN."""
        n = self.n
        fixed = n * (self.dim * 4 + 8 * 9 + 4 * 4)
        strings = self.text_bytes + 64 * n
        structures = (self.ann.nbytes() if self.ann is not None else 0) + (
            self.half.nbytes() if self.half is not None else 0
        )
        return fixed + strings + structures

    def mask(self, n: int, spec: ReadSpec, idx: I64 | None = None) -> Mask | None:
        """Which of rows ``idx`` (default ``[0, n)``) the query may see; None if none can.

        This is the pre-filter: version (epoch, as_of), tenant, domains, doc ids,
        time range and metadata, evaluated in columns before any vector is scored.
        """
        tenant = self.tenant_codes.codes.get(spec.tenant)
        if tenant is None:
            return None
        sel: slice | I64 = slice(0, n) if idx is None else idx
        epoch, as_of = spec.epoch, spec.as_of
        if self.max_created <= epoch:
            m = np.ones(n if idx is None else idx.shape[0], dtype=np.bool_)
        else:
            m = self.created[sel] <= epoch
        if as_of == NEVER:
            if self.stamped:
                m &= self.sup[sel] > epoch
        else:
            m &= self.valid_from[sel] <= as_of
            if self.stamped:
                m &= ~((self.sup[sel] <= epoch) & (self.valid_to[sel] <= as_of))
            if self.killed:
                m &= self.dead[sel] > epoch
        if len(self.tenant_codes.names) > 1:
            m &= self.tenant_codes.column[sel] == tenant
        for values, codes in ((spec.domains, self.domain_codes), (spec.doc_ids, self.doc_codes)):
            if values is not None:
                wanted = codes.wanted(values)
                if not wanted:
                    return None
                col = codes.column[sel]
                m &= col == wanted[0] if len(wanted) == 1 else np.isin(col, wanted)
        if spec.start_us is not None:
            m &= self.valid_from[sel] >= spec.start_us
        if spec.end_us is not None:
            m &= self.valid_from[sel] < spec.end_us
        for pred in spec.metadata:
            m &= self._meta_mask(pred, n)[sel]
        return m

    def tenant_share(self, tenant: str) -> float:
        """Fraction of rows that belong to ``tenant`` (for choosing a search path)."""
        code = self.tenant_codes.codes.get(tenant)
        if code is None or self.n == 0:
            return 0.0
        return self.tenant_codes.counts[code] / self.n

    def _meta_mask(self, pred: MetaPredicate, n: int) -> Mask:
        key = (pred.key, n)
        cached = self._meta_cache.get(key)
        if cached is None:
            cached = self._meta_columns(pred.key, n)
            if self.sealed:
                self._meta_cache[key] = cached
        codes, column, numbers = cached
        if pred.values is not None:
            wanted = [codes[k] for k in map(_meta_key, pred.values) if k in codes]
            if not wanted:
                return np.zeros(n, dtype=np.bool_)
            result: Mask = np.isin(column, wanted)
            return result
        out = np.ones(n, dtype=np.bool_)
        if pred.gte is not None:
            out &= numbers >= pred.gte
        if pred.lt is not None:
            out &= numbers < pred.lt
        return out

    def _meta_columns(
        self, key: str, n: int
    ) -> tuple[dict[tuple[str, Any], int], npt.NDArray[np.int32], npt.NDArray[np.float64]]:
        codes: dict[tuple[str, Any], int] = {}
        column = np.full(n, -1, dtype=np.int32)
        numbers = np.full(n, math.nan, dtype=np.float64)
        meta = self.metadata
        for i in range(n):
            md = meta[i]
            if not md or key not in md:
                continue
            v = md[key]
            if isinstance(v, int | float) and not isinstance(v, bool):
                numbers[i] = float(v)
            if isinstance(v, str | int | float | bool):
                k = _meta_key(v)
                c = codes.get(k)
                if c is None:
                    c = codes[k] = len(codes)
                column[i] = c
        return codes, column, numbers

    def __repr__(self) -> str:
        state = "sealed" if self.sealed else "growing"
        ann = f", ann={self.ann.kind}" if self.ann is not None else ""
        return f"Segment(id={self.id}, rows={self.n}, {state}{ann})"


_SLOTS = (
    "id",
    "dim",
    "capacity",
    "alloc",
    "n",
    "sealed",
    "ann",
    "half",
    "file",
    "ann_file",
    "vectors",
    *_ARRAYS,
    *_LISTS,
    "tenant_codes",
    "domain_codes",
    "doc_codes",
    "min_created",
    "max_created",
    "min_valid_from",
    "max_valid_from",
    "stamped",
    "killed",
    "last_stamp",
    "max_valid_to",
    "text_bytes",
    "_meta_cache",
)


def _meta_key(value: MetaValue) -> tuple[str, Any]:
    """Equality key of a metadata value: ``True`` and ``1`` differ, ``1`` and ``1.0`` do not."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        return ("num", float(value))
    return ("str", value)
