"""Which version of a document wins, and every version of every document.

**The rule.** A change is a version of its document ``(tenant, doc_id)``, and
its place among the others is its :data:`Version`, ``(event_time, offset)``,
compared as a tuple: the greater event time is newer, and on equal event times
the greater source offset is (the change read later from its source). A
version is newer than the one held only when it is *strictly* greater
(:func:`is_newer`): the very same ``(event_time, offset)`` is the same change
read twice, and never replaces itself. A delete is a version too — a
tombstone that keeps its version — so an older upsert arriving after it is not
newer and cannot bring the document back.

>>> is_newer((20, 1), (10, 9))  # later event time wins, whatever the offset
True
>>> is_newer((10, 2), (10, 1))  # same event time: the greater offset wins
True
>>> is_newer((10, 1), (10, 1))  # the same change again: not newer
False
>>> is_newer((10, 1), None)  # nothing held yet
True

Within one micro-batch, the newest change per document is
:func:`newest_per_doc`'s answer; of two changes with the same version, the
first one seen is kept.

>>> keys = [("t", "a"), ("t", "b"), ("t", "a")]
>>> newest_per_doc(keys, [10, 5, 30], [1, 2, 3])
{('t', 'a'): 2, ('t', 'b'): 1}

**The history.** The index answers two questions about the past (see
:mod:`.segment` for how a row carries them):

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
before it. Its neighbours are what :class:`Versions` finds. An index without
history (the exact index, or the LSM index with ``history=False``) keeps only
the current version and ignores an older change as stale.

**The document-state table.** :class:`Versions` keeps, per document, the
current version and the older versions whose interval still reaches into the
retained history. An older version whose successor begins before the history
floor can never be read again, so it is forgotten
(:meth:`Versions.forget_before`); a change that would land entirely before the
floor is not stored at all. Once a document forgot versions, a change older
than every version it still holds lands among forgotten ones, before the
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
from collections.abc import Iterator, Sequence

from streamrag.index.base import DocState

__all__ = ["Key", "Version", "Versions", "is_newer", "newest_per_doc"]

Key = tuple[str, str]
"""A document: ``(tenant, doc_id)``."""

Version = tuple[int, int]
"""A change's place in its document's history: ``(event_time, offset)``."""


def is_newer(version: Version, held: Version | None) -> bool:
    """Whether a change with ``version`` replaces the version ``held`` (None: nothing held)."""
    return held is None or version > held


def newest_per_doc(
    keys: Sequence[Key], times: Sequence[int], offsets: Sequence[int]
) -> dict[Key, int]:
    """The position of each document's newest change among parallel columns.

    Keys appear in the order their documents are first seen; of two changes
    with the same version, the first one is kept.
    """
    winners: dict[Key, int] = {}
    for i, key in enumerate(keys):
        j = winners.get(key)
        if j is None or (times[i], offsets[i]) > (times[j], offsets[j]):
            winners[key] = i
    return winners


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
        if is_newer(version, current.version):
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
        if current is None or is_newer(state.version, current.version):
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
