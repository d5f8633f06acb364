"""The committing half of the pipeline: due micro-batches out of the batcher, one epoch each.

:meth:`Flusher.flush` takes what the batcher says is due (size, deadline,
watermark, tick), groups it for ``commit_interval_ms`` if set, and hands each
batch to the :class:`~.commit.Committer`, whose docstring says why a commit is
exactly once. While a backlog waits and batches are already as large as
allowed, one commit takes as many due micro-batches as the embedder gets
through in the adaptive controller's latency target
(:meth:`Flusher._backlog_room`); while a worker process embeds ahead
(:mod:`streamrag.embed.ahead`), only those it has already embedded, so that
the commit does not wait for the worker while the worker embeds the next
ones. A failed commit puts its batch back at the
front of the batcher and its window output back in the outbox: nothing is
lost, and the next flush tries again. After :meth:`Flusher.stop_by` it commits
small batches (about half a second of embedding each) until the deadline and
then stops; what is left is uncommitted, and a restart reads it again. Window
output that waits with no change to commit gets a commit of its own, with no
documents (:mod:`.outbox`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from streamrag.batching import PendingBatch
from streamrag.changes import ChangeBatch
from streamrag.runtime.commit import observe
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.outbox import Sealed
from streamrag.sources.base import AcknowledgesCommits
from streamrag.timing import US_PER_S, Timestamp

if TYPE_CHECKING:
    from streamrag.runtime.pipeline import Pipeline

__all__ = ["Flusher"]

log = logging.getLogger("streamrag.pipeline")


class Flusher:
    """Commits what the batcher has due, on the pipeline's parts."""

    def __init__(self, pipeline: Pipeline, commit_interval_ms: int = 0) -> None:
        self.p = pipeline
        self.commit_interval_us = commit_interval_ms * 1000
        self._last_commit_at: Timestamp | None = None
        self._stop_at: Timestamp | None = None  # a graceful stop commits until then
        self._sealed: Sealed | None = None  # the window output of the commit being made
        self.ack_errors = 0
        """Acknowledgements a source refused (each is repeated by the next commit)."""

    @property
    def stopping(self) -> bool:
        """True after :meth:`stop_by`."""
        return self._stop_at is not None

    def flush(self, *, force: bool = False, most: int | None = None) -> int:
        """Commit every batch that is due (every pending one if ``force``). Returns commits.

        With ``commit_interval_ms``, due batches wait until that long after the
        previous commit (or until the batcher is full) and are committed as one epoch.
        ``most`` caps the commits this call makes.
        """
        p = self.p
        done = 0
        batcher = p.batcher
        p.embedding.catch_up_ahead()  # a worker that got ready since: what waits is its
        while batcher.pending and (force or batcher.due()):
            if most is not None and done >= most:
                break
            if not force and self._interval_left() > 0 and not batcher.full:
                break
            cap = None
            if self._stop_at is not None:
                if p.clock.now_us() >= self._stop_at:
                    break  # the rest is read again on restart
                cap = max(1, int(p.embedding.rate * 0.5)) if p.embedding.rate else 16
            room = 0 if cap is not None else self._backlog_room(force)
            ahead = room > 0 and p.embedding.ahead_ready
            # From waiting to being embedded in one step: never in neither place or both.
            with p.ledger.moving():
                taken = [batcher.take(cap)]
                while self.commit_interval_us and batcher.pending and (force or batcher.due()):
                    taken.append(batcher.take())
                chunks = sum(t.chunks for t in taken)
                while (
                    room
                    and batcher.pending
                    and chunks + batcher.target_size <= room
                    and (force or batcher.due())
                ):
                    more = batcher.take()
                    if ahead and not p.embedding.ready_ahead(more):
                        batcher.put_back(more)  # the worker is still on it: the next commit's
                        break
                    taken.append(more)
                    chunks += more.chunks
                p.ledger.in_flight = sum(len(t.changes) for t in taken)
            self._commit(PendingBatch.merge(taken), grouped=len(taken) > 1)
            done += 1
        now = p.clock.now_us()
        in_time = self._stop_at is None or now < self._stop_at
        if not done and not batcher.pending and p.outbox.waiting and in_time:
            # Window output with no change to commit (fired by time alone): a commit of
            # its own, with no documents, makes the state that fired it durable.
            self._commit(PendingBatch(ChangeBatch.empty(), first_arrival_us=now, reason="windows"))
            done += 1
        return done

    def _backlog_room(self, force: bool) -> int:
        """Chunks one commit may take from a backlog: 0 for one micro-batch per commit.

        While a backlog waits (the batcher is full, or a forced flush drains it)
        and batches are as large as ``max_batch_size`` lets them be (the adaptive
        controller would make them larger still), one commit takes further due
        micro-batches while its embedding stays within the controller's latency
        target, at the embedder's recent rate. Each is embedded in calls of the
        batch size as before; the commit's fsyncs and audit record are shared.
        A change that arrives alone is never held back (nothing waits with it).
        """
        p = self.p
        batcher, ctl, rate = p.batcher, p.batcher.controller, p.embedding.rate
        if ctl is None or rate <= 0 or not (force or batcher.full):
            return 0
        if batcher.target_size < batcher.max_batch_size:
            return 0  # the controller still sizes batches to its target: leave it to them
        return int(rate * ctl.target_latency_s)

    def _commit(self, pending: PendingBatch, *, grouped: bool = False) -> None:
        p = self.p
        step = p.batcher.target_size if self.commit_interval_us or grouped else 0
        self._sealed = None
        try:
            done = p.committer.apply(pending, self._capture, step)
        except BaseException:  # nothing is lost: the batch goes back to the front
            with p.ledger.moving():
                if len(pending.changes):
                    p.batcher.put_back(pending)
                p.ledger.in_flight = 0
            if self._sealed is not None:
                p.outbox.put_back(self._sealed)
            raise
        p.keeper.committed(done.cursor)
        p.embedding.discard_ahead(pending)
        now = self._last_commit_at = p.clock.now_us()
        # Freshness counts from the read, not from the idle poll the deadline counts
        # from: a job that slept until a source woke it did not wait on the change.
        read = pending.read_us if len(pending.changes) else None
        p.ledger.committed(done.delta, now, read)  # applied or refused
        fresh_s = None if read is None else (now - read) / US_PER_S
        observe(p.metrics, done, p.index, pending=p.batcher.pending, freshness_s=fresh_s)
        for hook in p.on_commit:  # after the commit: a failing hook cannot undo it
            hook(done.batch, done.result)
        if self._sealed:
            p.outbox.release(self._sealed)
        self._acknowledge(done.cursor)

    def _acknowledge(self, cursor: Cursor) -> None:
        """Tell a source that acknowledges commits what this one made durable."""
        reader = self.p.reader
        if not isinstance(reader, AcknowledgesCommits):
            return
        try:
            reader.committed(cursor.positions, cursor.pending)
        except Exception:  # durable already; the next commit acknowledges it again
            self.ack_errors += 1
            log.exception("the source could not acknowledge epoch %d", self.p.index.epoch)

    def stop_by(self, deadline_us: Timestamp) -> None:
        """Stop gracefully: flushes commit small batches until ``deadline_us``, then no more.

        What is still waiting then is uncommitted: the last commit's cursor lists
        it and a restart reads it again.
        """
        self._stop_at = deadline_us

    def _interval_left(self) -> int:
        p = self.p
        if not self.commit_interval_us or self._last_commit_at is None:
            return 0
        return max(0, self._last_commit_at + self.commit_interval_us - p.clock.now_us())

    def wait_us(self) -> Timestamp | None:
        """Processing time until a commit is due (0 if one is), or None with nothing waiting."""
        p = self.p
        wait = p.batcher.wait_us()
        if wait is None and p.outbox.waiting:
            wait = 0  # window output waits for a commit
        return None if wait is None else max(wait, self._interval_left())

    def _capture(self) -> Cursor:
        """The cursor, and the window output it covers (:mod:`.outbox`), between two polls."""
        p = self.p
        with p.keeper.gate.capturing():
            cursor = p.keeper.capture(p.reader, p.batcher, p.event_time, p.ledger.snapshot)
            self._sealed = p.outbox.seal()
        return cursor
