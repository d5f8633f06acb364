"""Every version of every document, in event-time order: where a change goes in history.

The index answers two questions about the past (see :mod:`.segment` for how a
row carries them):

- **as of event time T** — what did the documents say at T? Each document shows
  the change with the greatest ``(event_time, offset)`` at or before T; it
  exists iff that change is an upsert;
- **at epoch E** — what did the index know after its E-th commit? Only changes
  committed by E count.

Both hold for every change, whatever order changes arrive in and however they
are cut into micro-batches: a change newer than the document's current version
becomes current (last writer wins, as the current view always did); an older
one — late, or beaten by a newer change in the same micro-batch — is placed
between the two versions around it and *splits* the interval of the one
before it. Its neighbours are what :class:`Versions` finds.

The writer keeps, per document, the current version and the older versions
whose interval still reaches into the retained history. An older version whose
successor begins before the history floor can never be read again, so it is
forgotten (:meth:`Versions.forget_before`); a change that would land entirely
before the floor is not stored at all. Once a document forgot versions, a change
older than every version it still holds lands among forgotten ones, before the
floor: :meth:`Versions.neighbours` says so by naming its oldest held version as
the one after it (whose event time is at or before the floor).

>>> v = Versions()
>>> v.add(("t", "a"), DocState((10, 1), deleted=False))
True
>>> v.add(("t", "a"), DocState((30, 3), deleted=True))
True
>>> before, after, exists = v.neighbours(("t", "a"), (20, 2))
>>> before.version, after.version, exists
((10, 1), (30, 3), False)
>>> v.add(("t", "a"), DocState((20, 2), deleted=False))
False
>>> [s.version for s in v.past(("t", "a"))]
[(10, 1), (20, 2)]
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from streamrag.index.base import DocState

__all__ = ["Key", "Version", "Versions"]

Key = tuple[str, str]
"""A document: ``(tenant, doc_id)``."""

Version = tuple[int, int]
"""A change's place in its document's history: ``(event_time, offset)``."""


def _version(state: DocState) -> Version:
    return state.version


class Versions:
    """Per document: its current version and the older ones still in the history.

    Each version is a :class:`~streamrag.index.base.DocState` (its version, whether
    it is a delete, the row ids and content hashes of its chunks). One writer
    thread uses it; readers never do (they read segments).
    """

    __slots__ = ("_current", "_forgot", "_past")

    def __init__(self) -> None:
        self._current: dict[Key, DocState] = {}
        self._past: dict[Key, list[DocState]] = {}
        self._forgot: set[Key] = set()  # documents that forgot versions before the floor

    def __len__(self) -> int:
        return len(self._current)

    def current(self, key: Key) -> DocState | None:
        """The newest version of a document, or None if it was never seen."""
        return self._current.get(key)

    def items(self) -> Iterator[tuple[Key, DocState]]:
        """Every document with its current version."""
        return iter(self._current.items())

    def past(self, key: Key) -> list[DocState]:
        """The document's older versions still kept, oldest first (a copy)."""
        return list(self._past.get(key, ()))

    def neighbours(
        self, key: Key, version: Version
    ) -> tuple[DocState | None, DocState | None, bool]:
        """The versions just before and just after ``version``, and whether it is held.

        ``after`` is None when ``version`` would become current. For a version
        older than every one held by a document that forgot older ones, ``after``
        is the oldest held (the true one is older still, and no later).
        """
        current = self._current.get(key)
        if current is None:
            return None, None, False
        if version > current.version:
            return current, None, False
        if version == current.version:
            return None, None, True
        past = self._past.get(key)
        if not past:
            return None, current, False
        i = bisect.bisect_left(past, version, key=_version)
        if i == 0 and key in self._forgot:
            return None, past[0], False
        if i < len(past) and past[i].version == version:
            return None, None, True
        before = past[i - 1] if i else None
        after = past[i] if i < len(past) else current
        return before, after, False

    def add(self, key: Key, state: DocState) -> bool:
        """Record a version not held yet; True if it became the current one."""
        current = self._current.get(key)
        if current is None or state.version > current.version:
            if current is not None:
                self._past.setdefault(key, []).append(current)
            self._current[key] = state
            return True
        past = self._past.setdefault(key, [])
        bisect.insort(past, state, key=_version)
        return False

    def set_current(self, key: Key, state: DocState) -> None:
        """Make ``state`` the current version outright (rebuilding after a restart)."""
        self._current[key] = state

    def set_past(self, key: Key, states: list[DocState]) -> None:
        """Replace the older versions of a document (sorted, oldest first)."""
        if states:
            self._past[key] = states
        else:
            self._past.pop(key, None)

    def forget_before(self, key: Key, floor: int) -> None:
        """Forget older versions whose interval ends before ``floor`` (nobody can read them)."""
        past = self._past.get(key)
        if not past:
            return
        drop = 0
        for i in range(len(past)):
            nxt = past[i + 1] if i + 1 < len(past) else self._current[key]
            if nxt.version[0] > floor:
                break
            drop = i + 1
        if not drop:
            return
        self._forgot.add(key)
        if drop == len(past):
            del self._past[key]
        else:
            del past[:drop]

    def clear(self) -> None:
        """Forget everything (before a rebuild)."""
        self._current.clear()
        self._past.clear()
        self._forgot.clear()
