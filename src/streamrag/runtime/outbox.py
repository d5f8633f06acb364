"""Window output, released transactionally: a result leaves only with the commit that made it.

A window fires while changes are read, but the window state that fired it is
durable only once a commit's cursor holds it. Handing the result to a sink at
once would break exactly-once: after a crash the restart restores the window
state of the last commit, reads the same changes again and fires the same
window again — a duplicate downstream. (Flink's two-phase-commit sinks and
Kafka Streams' transactional producer solve the same problem.)

So results and side outputs (late changes, changes without a window's value)
wait in the :class:`Outbox`. When a commit takes its cursor it also *seals*
what is waiting — both under the poll gate, so the sealed output is exactly
what the captured window state produced — and the outbox *releases* the seal
to the window hooks and the dead-letter store only once the index has the
commit. A failed commit puts its seal back; a crash drops it, and the restart
produces it again from the committed state. Output waiting with nothing to
commit (a window fired by time alone) gets a commit of its own, with no
documents: see :meth:`streamrag.runtime.pipeline.Pipeline.flush`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from streamrag.eventtime import WindowResult
from streamrag.ingest import DeadLetter

__all__ = ["Outbox", "Sealed"]


@dataclass(slots=True)
class Sealed:
    """The output one commit releases."""

    results: list[tuple[str, WindowResult]] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)

    def __bool__(self) -> bool:
        """True when there is output to release."""
        return bool(self.results or self.letters)


class Outbox:
    """Window results and side outputs waiting for the commit that covers them."""

    def __init__(
        self,
        hooks: Sequence[Callable[[str, WindowResult], None]],
        store: Callable[[list[DeadLetter]], None],
    ) -> None:
        self.hooks = hooks
        self.store = store
        self._waiting = Sealed()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> bool:
        """True when output waits for a commit."""
        with self._lock:
            return bool(self._waiting)

    def hold(
        self, results: Sequence[tuple[str, WindowResult]], letters: Sequence[DeadLetter]
    ) -> None:
        """Output of the window state as it is now: released with the next commit."""
        with self._lock:
            self._waiting.results.extend(results)
            self._waiting.letters.extend(letters)

    def seal(self) -> Sealed:
        """Take what waits, for the commit whose cursor is being captured."""
        with self._lock:
            sealed, self._waiting = self._waiting, Sealed()
        return sealed

    def put_back(self, sealed: Sealed) -> None:
        """The commit failed: its output waits again, ahead of anything newer."""
        with self._lock:
            self._waiting.results[:0] = sealed.results
            self._waiting.letters[:0] = sealed.letters

    def release(self, sealed: Sealed) -> None:
        """The commit is in: hand its output to the hooks and the dead-letter store."""
        for name, result in sealed.results:
            for hook in self.hooks:
                hook(name, result)
        if sealed.letters:
            self.store(sealed.letters)
