"""Run a pipeline live, in background threads, until told to stop.

Two threads overlap the stages, with the bounded batcher between them:

* the **reader** calls :meth:`Pipeline.poll` — read, decode, event time, chunk,
  queue — and waits one poll interval when the source had nothing (or the
  batcher is full: that wait is the backpressure on the source);
* the **committer** calls :meth:`Pipeline.flush` — embed and commit what is due —
  and otherwise sleeps until the batcher's next deadline or until the reader
  queues something.

So the next batch is decoded and chunked while the current one embeds; the
embedder (which releases the GIL) is not left idle while Python parses JSON.
``overlap=False`` runs both halves in one thread (:meth:`Pipeline.step`).
Both threads run on one CPU unless ``share_core=False``: they take turns at
the interpreter lock, which is cheaper on one core than across two
(:mod:`streamrag.runtime.affinity`, with the figures).

Waiting uses :class:`threading.Event`, so :meth:`PipelineRunner.stop` wakes
both at once. On stop the reader ends first, then the committer commits
everything pending before the pipeline is closed.

Errors from a stage (say, an embedder that times out) do not end a loop: the
batch stays pending, the error is logged and counted, and the loop retries
after a back-off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from streamrag.errors import StreamragError
from streamrag.runtime.affinity import ingest_cpu, lower_this_thread, pin_this_thread
from streamrag.runtime.pipeline import Pipeline
from streamrag.sources.base import WakeEvent, Wakes
from streamrag.sources.multi import MultiSourceReader

__all__ = ["PipelineRunner"]

log = logging.getLogger("streamrag.executor")


class PipelineRunner:
    """Drives a :class:`Pipeline` in daemon threads."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        poll_interval_ms: int = 2,
        wake_timeout_ms: int = 1000,
        max_backoff_s: float = 5.0,
        overlap: bool = True,
        share_core: bool = True,
        nice: int = 0,
    ) -> None:
        self.pipeline = pipeline
        self.poll_interval_s = poll_interval_ms / 1000
        self.wake_timeout_s = wake_timeout_ms / 1000
        self.max_backoff_s = max_backoff_s
        self.overlap = overlap
        self.cpu = ingest_cpu() if share_core else None
        """The CPU the loop threads run on (:mod:`streamrag.runtime.affinity`); None: any."""
        self.nice = nice
        """How much lower the loop threads' CPU priority is than the process's (0: the same)."""
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._queued = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reader_done = threading.Event()
        self._closed = False
        self.wake = WakeEvent()
        """Set when a poll may find something: by the sources that wake, by pushes, by stop."""
        reader = pipeline.reader
        if isinstance(reader, Wakes):
            reader.wake_on(self.wake)
        self.sleeps = (
            reader.wakes if isinstance(reader, MultiSourceReader) else (isinstance(reader, Wakes))
        )
        """Whether an idle reader sleeps until woken (else it polls every interval)."""

    def start(self) -> None:
        """Start the loop threads."""
        if self._threads:
            return
        self._stop.clear()
        self._reader_done.clear()
        if self.overlap:
            targets = [("streamrag-read", self._read_loop), ("streamrag-commit", self._commit_loop)]
        else:
            targets = [("streamrag-pipeline", self._single_loop)]
        for name, target in targets:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    @property
    def running(self) -> bool:
        """Whether the loop threads are alive."""
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loops to stop, let them commit what is pending, and wait for them.

        With ``timeout`` (seconds) the committer commits pending changes only
        until then, in small batches (:meth:`Pipeline.stop_by`); the rest is read
        again on restart. The embed call under way when the stop came is let
        finish. Without it, everything pending is committed, however long that
        takes; a second signal is the way out (:mod:`streamrag.runtime.signals`).
        """
        if timeout is not None:
            pipeline = self.pipeline
            pipeline.stop_by(pipeline.clock.now_us() + int(timeout * 1_000_000))
        self._stop.set()
        self._queued.set()
        self.wake.set()
        ran = bool(self._threads)
        for t in self._threads:
            t.join()
        self._threads = []
        if not ran and not self._closed:  # never started: its loops did not close the pipeline
            self._close()

    # -- loops -----------------------------------------------------------------

    def _place_this_thread(self) -> None:
        """Put a loop thread on its CPU, at its priority."""
        pin_this_thread(self.cpu)
        lower_this_thread(self.nice)

    def _guarded(self, work: Callable[[], bool], backoff: list[float]) -> bool | None:
        """Run one unit of work; on failure log, count, back off and return None."""
        try:
            did = work()
        except Exception as exc:  # the loop must outlive any one failure
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, StreamragError):
                log.error("pipeline stage failed, retrying in %.2fs: %s", backoff[0], exc)
            else:
                log.exception("unexpected pipeline error, retrying in %.2fs", backoff[0])
            self._stop.wait(backoff[0])
            backoff[0] = min(backoff[0] * 2, self.max_backoff_s)
            return None
        backoff[0] = 0.05
        return did

    def _read_loop(self) -> None:
        self._place_this_thread()
        backoff = [0.05]
        try:
            while not self._stop.is_set():
                did = self._guarded(lambda: self.pipeline.poll() > 0, backoff)
                if did:
                    self._queued.set()
                elif did is not None:
                    self._idle()
        finally:
            self._reader_done.set()
            self._queued.set()

    def _idle(self) -> None:
        """Nothing was read: sleep until a source wakes the job, or poll again soon.

        A full batcher (backpressure) is not woken by a source, so it polls again
        after the interval, as does a reader that cannot wake the job.
        """
        if self.sleeps and not self.pipeline.batcher.full:
            self.wake.wait(self.wake_timeout_s)
            self.wake.clear()
        else:
            self._stop.wait(self.poll_interval_s)

    def _commit_loop(self) -> None:
        self._place_this_thread()
        pipeline = self.pipeline
        backoff = [0.05]
        while not self._stop.is_set():
            did = self._guarded(lambda: pipeline.flush() > 0, backoff)
            if did or did is None:
                continue
            wait_us = pipeline.wait_us()
            # Nothing due: the reader sets _queued when it queues something, so a job
            # whose sources wake it sleeps as long as the reader does.
            idle = self.wake_timeout_s if self.sleeps else self.poll_interval_s * 10
            timeout = idle if wait_us is None else wait_us / 1e6
            self._queued.wait(timeout)
            self._queued.clear()
        self._reader_done.wait()  # nothing is queued after this
        self._close()

    def _single_loop(self) -> None:
        self._place_this_thread()
        pipeline = self.pipeline
        backoff = [0.05]
        while not self._stop.is_set():
            did = self._guarded(pipeline.step, backoff)
            if did or did is None:
                continue
            wait_us = pipeline.wait_us()
            timeout = self.poll_interval_s
            if wait_us is not None:
                timeout = min(timeout, wait_us / 1e6)
            self._stop.wait(timeout)
        self._close()

    def _close(self) -> None:
        self._closed = True  # the reader's files and watch threads are released once
        try:
            self.pipeline.close()
        except StreamragError as exc:
            log.error("could not commit the last batch on shutdown: %s", exc)
