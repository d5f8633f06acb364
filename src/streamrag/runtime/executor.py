"""Run a pipeline live, in a background thread, until told to stop.

The loop calls :meth:`Pipeline.step`; when there was nothing to do it waits for
the sooner of the poll interval and the batcher's deadline, so a pending batch
is committed on time and an idle source costs a few system calls per second.
Waiting uses :class:`threading.Event` so :meth:`PipelineRunner.stop` wakes it at
once. On stop the pending batch is committed before the thread ends.

Errors from a stage (say, an embedder that times out) do not end the loop: the
batch stays pending, the error is logged and counted, and the loop retries
after a back-off.
"""

from __future__ import annotations

import logging
import threading

from streamrag.errors import StreamragError
from streamrag.runtime.pipeline import Pipeline

__all__ = ["PipelineRunner"]

log = logging.getLogger("streamrag.executor")


class PipelineRunner:
    """Drives a :class:`Pipeline` in a daemon thread."""

    def __init__(
        self, pipeline: Pipeline, *, poll_interval_ms: int = 2, max_backoff_s: float = 5.0
    ) -> None:
        self.pipeline = pipeline
        self.poll_interval_s = poll_interval_ms / 1000
        self.max_backoff_s = max_backoff_s
        self.errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the loop thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="streamrag-pipeline", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the loop thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the loop to stop, let it commit what is pending, and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def _loop(self) -> None:
        pipeline = self.pipeline
        backoff = 0.05
        while not self._stop.is_set():
            try:
                did = pipeline.step()
                backoff = 0.05
            except Exception as exc:  # the loop must outlive any one failure
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, StreamragError):
                    log.error("pipeline step failed, retrying in %.2fs: %s", backoff, exc)
                else:
                    log.exception("unexpected pipeline error, retrying in %.2fs", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            if did:
                continue
            wait_us = pipeline.batcher.wait_us()
            timeout = self.poll_interval_s
            if wait_us is not None:
                timeout = min(timeout, wait_us / 1e6)
            self._stop.wait(timeout)
        try:
            pipeline.close()
        except StreamragError as exc:
            log.error("could not commit the last batch on shutdown: %s", exc)
