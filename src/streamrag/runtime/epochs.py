"""What each epoch changed: the documents a commit touched, kept for a while.

An answer read from epoch ``e`` stays true at a later epoch ``E`` exactly when
no commit in ``(e, E]`` changed what its query could see. The index itself only
says *that* the epoch moved; :class:`EpochLog`, fed by the pipeline's commit
hook, remembers *what* moved: for every epoch, the documents it updated or
deleted and where its new versions landed (tenant, domain, event time). The
semantic answer cache asks it whether anything relevant to an answer happened
since the answer was made (see :mod:`streamrag.serve.cache`).

The log is bounded: it keeps the last ``max_docs`` document changes. An epoch
it never saw (one made by a rollback, one older than what it keeps, or one
whose commit hook has not run yet) is reported as unknown, and callers must
treat unknown as "may have changed".

>>> from streamrag.index.base import CommitBatch, CommitResult, DocOp
>>> from streamrag.changes import Op
>>> import numpy as np
>>> log = EpochLog()
>>> batch = CommitBatch(
...     docs=[DocOp("acme", "faq-1", Op.UPSERT, 1_000, 0, "in.jsonl", domain="it")],
...     chunk_ids=np.zeros(0, np.int64), positions=np.zeros(0, np.int32), texts=[],
...     hashes=[], vectors=np.zeros((0, 4), np.float32))
>>> log.record(batch, CommitResult(epoch=1, applied_docs=1, stale_docs=0, chunks_added=1))
>>> [c.docs for c in log.since(0, 1)]
[frozenset({('acme', 'faq-1')})]
>>> log.since(0, 2) is None  # epoch 2 was never recorded
True
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import msgspec

from streamrag.changes import Op
from streamrag.errors import ArgumentError
from streamrag.index.base import CommitBatch, CommitResult
from streamrag.timing import Timestamp

__all__ = ["EpochChanges", "EpochLog", "NewVersion"]


class NewVersion(msgspec.Struct, frozen=True, gc=False):
    """Where an upserted document's new version lives: what filters can match.

    A ``msgspec.Struct`` without garbage-collector tracking (``gc=False``)
    rather than a dataclass: the log keeps one per upsert for many epochs, and
    an untracked object costs nothing to the collector's full passes, which
    otherwise visit every one of them again and again as the log grows. It
    holds only strings and an integer, so it can never be part of a reference
    cycle, which is what makes leaving it untracked safe. It is also about ten
    times quicker to make than a frozen dataclass.
    """

    tenant: str
    doc_id: str
    domain: str
    event_time: Timestamp


@dataclass(frozen=True, slots=True)
class EpochChanges:
    """One epoch's changes: every ``(tenant, doc_id)`` touched, and the new versions."""

    epoch: int
    docs: frozenset[tuple[str, str]]
    upserts: tuple[NewVersion, ...]
    tenants: frozenset[str]

    @property
    def size(self) -> int:
        """Document changes held (what the log's bound counts)."""
        return len(self.docs)


class EpochLog:
    """The changes of recent epochs, recorded by a pipeline commit hook; thread-safe."""

    def __init__(self, max_docs: int = 1_000_000) -> None:
        if max_docs <= 0:
            msg = f"max_docs must be positive, found {max_docs}"
            raise ArgumentError(msg)
        self.max_docs = max_docs
        self._epochs: deque[EpochChanges] = deque()
        self._held = 0
        self._lock = threading.Lock()

    def record(self, batch: CommitBatch, result: CommitResult) -> None:
        """Remember what the commit of ``result.epoch`` changed (a ``Pipeline.on_commit`` hook).

        Stale operations are included: they changed nothing, and counting them
        only makes a reader more careful.
        """
        docs = frozenset((d.tenant, d.doc_id) for d in batch.docs)
        upserts = tuple(
            NewVersion(d.tenant, d.doc_id, d.domain, d.event_time)
            for d in batch.docs
            if d.op is Op.UPSERT
        )
        changes = EpochChanges(result.epoch, docs, upserts, frozenset(t for t, _ in docs))
        with self._lock:
            if self._epochs and self._epochs[-1].epoch >= changes.epoch:
                # A rollback restarted the numbering below what we hold: forget it all.
                self._epochs.clear()
                self._held = 0
            self._epochs.append(changes)
            self._held += changes.size
            while self._held > self.max_docs and len(self._epochs) > 1:
                self._held -= self._epochs.popleft().size

    def since(self, after: int, upto: int) -> list[EpochChanges] | None:
        """The changes of epochs ``after + 1 … upto``; None if any of them is unknown."""
        if upto <= after:
            return []
        with self._lock:
            epochs = self._epochs
            if not epochs or epochs[0].epoch > after + 1 or epochs[-1].epoch < upto:
                return None
            # Epochs are recorded in increasing order; find after + 1 from the right.
            first = epochs[0].epoch
            start = (after + 1) - first
            if start < len(epochs) and epochs[start].epoch == after + 1:
                found = [epochs[i] for i in range(start, min(len(epochs), start + upto - after))]
            else:
                found = [c for c in epochs if after < c.epoch <= upto]
        if len(found) != upto - after or any(c.epoch != after + 1 + i for i, c in enumerate(found)):
            return None  # a gap: an epoch the hook never saw (a rollback)
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._epochs)

    def __repr__(self) -> str:
        return f"EpochLog(epochs={len(self)}, max_docs={self.max_docs})"
