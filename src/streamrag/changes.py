"""The unit of data: a change to one document.

A stream is a changelog. Each entry says that, at ``event_time``, document
``doc_id`` of ``tenant`` was upserted (with ``payload``) or deleted. ``source``
and ``offset`` say where the change was read, so every indexed chunk can be
traced back to its input and a restart can resume exactly there.

Per ``(tenant, doc_id)`` the newest event time wins; ties break on the source
offset (:meth:`Change.version`). A late, older upsert never overwrites a newer
version, and a delete keeps its event time so that an older upsert arriving
after it cannot bring the document back.

On the hot path changes travel as a :class:`ChangeBatch`: one column per field
(numpy arrays for numbers and ops, lists for strings and payloads).

>>> c = Change("acme", "doc-1", Op.UPSERT, 1_000_000, {"text": "hello"}, "a.jsonl", 0)
>>> c.text, c.version
('hello', (1000000, 0))
>>> batch = ChangeBatch.from_changes([c])
>>> len(batch), batch.doc_ids, batch.to_changes()[0] == c
(1, ['doc-1'], True)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import ArgumentError
from streamrag.timing import Timestamp

__all__ = ["DEFAULT_TENANT", "Change", "ChangeBatch", "Op"]

DEFAULT_TENANT = "default"
"""Tenant of records that name none."""


class Op(IntEnum):
    """What a change does to its document."""

    UPSERT = 0
    DELETE = 1


@dataclass(frozen=True, slots=True)
class Change:
    """One change to one document, as read from a source.

    ``payload`` holds the document body for an upsert (``text``, optional
    ``title``, ``domain`` and ``metadata``) and is empty for a delete.
    """

    tenant: str
    doc_id: str
    op: Op
    event_time: Timestamp
    payload: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    offset: int = 0

    @property
    def version(self) -> tuple[Timestamp, int]:
        """Ordering of versions of one document: event time, then source offset."""
        return (self.event_time, self.offset)

    @property
    def text(self) -> str:
        """The document body ("" for a delete)."""
        return str(self.payload.get("text", ""))

    @property
    def domain(self) -> str:
        """The document's domain ("" when the record names none)."""
        return str(self.payload.get("domain", ""))


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """A columnar batch of changes: one column per :class:`Change` field.

    All columns have the same length. Build one with :meth:`from_changes`; go
    back with :meth:`to_changes` or iterate.
    """

    tenants: list[str]
    doc_ids: list[str]
    ops: npt.NDArray[np.int8]
    event_times: npt.NDArray[np.int64]
    payloads: list[Mapping[str, Any]]
    sources: list[str]
    offsets: npt.NDArray[np.int64]

    def __post_init__(self) -> None:
        n = len(self.doc_ids)
        lengths = {
            len(self.tenants),
            len(self.ops),
            len(self.event_times),
            len(self.payloads),
            len(self.sources),
            len(self.offsets),
        }
        if lengths != {n}:
            msg = f"ChangeBatch columns must have one length; found lengths {sorted(lengths | {n})}"
            raise ArgumentError(msg)

    @classmethod
    def empty(cls) -> ChangeBatch:
        """A batch with no changes."""
        return cls.from_changes([])

    @classmethod
    def from_changes(cls, changes: Sequence[Change]) -> ChangeBatch:
        """Pack changes into columns."""
        return cls(
            tenants=[c.tenant for c in changes],
            doc_ids=[c.doc_id for c in changes],
            ops=np.fromiter((c.op for c in changes), dtype=np.int8, count=len(changes)),
            event_times=np.fromiter(
                (c.event_time for c in changes), dtype=np.int64, count=len(changes)
            ),
            payloads=[c.payload for c in changes],
            sources=[c.source for c in changes],
            offsets=np.fromiter((c.offset for c in changes), dtype=np.int64, count=len(changes)),
        )

    @classmethod
    def concat(cls, batches: Sequence[ChangeBatch]) -> ChangeBatch:
        """Join batches end to end, in order."""
        if len(batches) == 1:
            return batches[0]
        if not batches:
            return cls.empty()
        return cls(
            tenants=[t for b in batches for t in b.tenants],
            doc_ids=[d for b in batches for d in b.doc_ids],
            ops=np.concatenate([b.ops for b in batches]),
            event_times=np.concatenate([b.event_times for b in batches]),
            payloads=[p for b in batches for p in b.payloads],
            sources=[s for b in batches for s in b.sources],
            offsets=np.concatenate([b.offsets for b in batches]),
        )

    def slice(self, start: int, stop: int) -> ChangeBatch:
        """Rows ``start`` up to ``stop`` as a new batch."""
        return ChangeBatch(
            tenants=self.tenants[start:stop],
            doc_ids=self.doc_ids[start:stop],
            ops=self.ops[start:stop],
            event_times=self.event_times[start:stop],
            payloads=self.payloads[start:stop],
            sources=self.sources[start:stop],
            offsets=self.offsets[start:stop],
        )

    def take(self, rows: Sequence[int]) -> ChangeBatch:
        """The given rows, in the given order, as a new batch."""
        idx = np.asarray(rows, dtype=np.intp)
        return ChangeBatch(
            tenants=[self.tenants[i] for i in rows],
            doc_ids=[self.doc_ids[i] for i in rows],
            ops=self.ops[idx],
            event_times=self.event_times[idx],
            payloads=[self.payloads[i] for i in rows],
            sources=[self.sources[i] for i in rows],
            offsets=self.offsets[idx],
        )

    def __len__(self) -> int:
        return len(self.doc_ids)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.to_changes())

    def to_changes(self) -> list[Change]:
        """Unpack into :class:`Change` objects (a convenience, not for hot loops)."""
        return [
            Change(t, d, Op(int(o)), int(e), p, s, int(f))
            for t, d, o, e, p, s, f in zip(
                self.tenants,
                self.doc_ids,
                self.ops,
                self.event_times,
                self.payloads,
                self.sources,
                self.offsets,
                strict=True,
            )
        ]
