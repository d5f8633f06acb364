"""The LSM index's maintenance thread: started, woken by commits, stopped between steps.

The thread repeats one step of maintenance (:meth:`~.lsm_maintenance.LsmMaintenance.maintain`)
while there is work, and otherwise sleeps until a commit or a query wakes it —
or five seconds pass, a safety net for compaction that time passing makes
possible. Graph builds and merges can wait; commits and queries cannot: on
Linux a thread has its own nice value, and this one runs at a lower priority
than the process.

Stopping sets the *closed* flag, which long steps poll to give up early (an
ANN build is cancelled, a merge dropped), and waits for the current step to
end. The flag is also what a closed index answers to a commit, so it exists
whether or not a thread was started.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

__all__ = ["MaintenanceThread"]

_NICE = 10
"""How much lower the maintenance thread's CPU priority is than the process's."""

_IDLE_WAKE_S = 5.0
"""Longest sleep without work before looking again."""


class MaintenanceThread:
    """The closed flag, and the background thread when one was started."""

    __slots__ = ("_closed", "_thread", "_wake")

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """True once :meth:`stop` was called: long maintenance work gives up."""
        return self._closed

    @property
    def running(self) -> bool:
        """Whether a thread was started and not stopped yet."""
        return self._thread is not None

    def start(self, step: Callable[[], bool], on_error: Callable[[Exception], None]) -> None:
        """Run ``step`` (True: it did work) until stopped; ``on_error`` sees what it raises."""
        self._thread = threading.Thread(
            target=self._run, args=(step, on_error), name="streamrag-index-maintenance", daemon=True
        )
        self._thread.start()

    def wake(self) -> None:
        """Wake the thread, if there is one: a commit made work for it."""
        if self._thread is not None:
            with self._wake:
                self._wake.notify()

    def pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less if a commit wakes the thread or it is stopped."""
        with self._wake:
            if not self._closed:
                self._wake.wait(timeout=seconds)

    def stop(self) -> bool:
        """Close, and wait for the current step to end; True if it was closed already."""
        with self._wake:
            was_closed = self._closed
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return was_closed

    def _run(self, step: Callable[[], bool], on_error: Callable[[Exception], None]) -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)
        while True:
            with self._wake:
                if self._closed:
                    return
            try:
                busy = step()
            except Exception as exc:
                on_error(exc)
                busy = False
            if not busy:
                with self._wake:
                    if self._closed:
                        return
                    self._wake.wait(timeout=_IDLE_WAKE_S)
