"""Wake a job when files change: one file-system watch thread per watched folder.

An idle job sleeps until a reader sets its wake event (:class:`~streamrag.sources.base.Wakes`).
For files that event comes from the kernel: :class:`FolderWatch` runs a
thread that asks ``watchfiles`` (the Rust ``notify`` crate: inotify on Linux,
FSEvents on macOS, ReadDirectoryChangesW on Windows) for the paths that changed
under a folder, remembers them for the reader (:meth:`FolderWatch.take`) and
sets every event it was given. The reader then looks only at those paths
instead of listing the folder again, so an idle watch of 10,000 files costs
next to nothing (``benchmarks/folder_idle.py``).

What a watch cannot promise, and what it does about it:

* **A folder that is not there yet** (or was removed) cannot be watched: the
  thread watches its nearest existing parent instead, without recursion, and
  moves to the folder once it appears. :attr:`FolderWatch.generation` counts
  the times a watch was installed on the folder itself; a reader that sees it
  change lists the folder again, since changes made while nothing was watching
  were never reported.
* **Events can be lost**: the kernel's inotify queue overflows under a burst,
  and ``watchfiles`` drops the overflow notice. More than :data:`OVERFLOW_PATHS`
  paths in one go, or an error of the watcher, sets :attr:`WatchChanges.rescan`;
  a reader also lists the folder again now and then as a safety net.
* **A wake at a chosen time**: a file that is still being written is read once
  it has settled; :meth:`FolderWatch.wake_at` sets the events then, so the job
  need not poll for it.

The watchfiles package comes with ``uvicorn[standard]``; it is imported only
when a watch starts, and a watch that cannot start says why in
:attr:`FolderWatch.error` (the job then polls at ``source.wake_timeout_ms``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamrag.sources.base import WakeEvent

__all__ = ["OVERFLOW_PATHS", "FolderWatch", "WatchChanges"]

OVERFLOW_PATHS = 20_000
"""More changed paths than this between two takes: forget them and list the folder again."""

_IDLE_TIMEOUT_MS = 200
"""How long one wait for events lasts before the thread looks at its own state again."""

_READING_S = 0.02
"""A job that has not waited for its wake event this long is reading a backlog, not waiting.

A live stream's job reads each append in about a millisecond and waits again."""

_FINE_STEP_MS = 5
"""The step of a wait that ends close to a deadline (a file due to have settled)."""

log = logging.getLogger("streamrag.sources.watch")


@dataclass(slots=True)
class WatchChanges:
    """What changed since the last :meth:`FolderWatch.take`."""

    paths: set[str] = field(default_factory=set)
    """Absolute paths that were added, modified or removed (files and folders)."""
    rescan: bool = False
    """Changes may have been missed: list the whole folder again."""


class FolderWatch:
    """A background thread that watches ``root`` and wakes whoever asked (see the module).

    ``recursive=False`` watches only the folder's own entries (a JSONL tailer's
    folder). ``keep_paths=False`` only wakes, and keeps no paths (for readers
    that look at every file on each poll anyway). ``step_ms`` is how often the
    watcher looks at what the kernel reported: the wake latency is one to two
    steps, and each step costs a wake-up of the thread. For ``busy_s`` seconds
    after a change it looks every ``busy_step_ms`` instead (default: the same),
    so a stream of appends is seen within milliseconds while an idle folder
    costs a wake-up every ``step_ms``. Fine steps serve a job that waits: when
    every event it sets is a :class:`~streamrag.sources.base.WakeEvent` that
    nobody has waited on for :data:`_READING_S` (the job is reading a backlog and
    will look again anyway), it keeps to ``step_ms`` — each fine step takes the
    interpreter lock from the job: a bulk load of 20,000 documents through
    ``streamrag serve`` ran 4–5 % faster without them (``docs/performance.md``).
    """

    def __init__(
        self,
        root: Path,
        *,
        recursive: bool = True,
        keep_paths: bool = True,
        step_ms: int = 50,
        busy_step_ms: int | None = None,
        busy_s: float = 2.0,
        debounce_ms: int = 100,
        name: str = "streamrag-watch",
    ) -> None:
        self.root = Path(root)
        self.recursive = recursive
        self.keep_paths = keep_paths
        self.step_ms = step_ms
        self.busy_step_ms = step_ms if busy_step_ms is None else busy_step_ms
        self.busy_s = busy_s
        self.debounce_ms = debounce_ms
        self._busy_until = 0.0
        self.name = name
        self.generation = 0
        """How many times a watch was installed on ``root`` itself (0: not yet)."""
        self.error: str | None = None
        """Why ``root`` is not watched right now, or None while it is."""
        self.watching: Path | None = None
        """The path the thread watches now (``root``, or a parent while ``root`` is missing)."""
        self._events: list[threading.Event] = []
        self._lock = threading.Lock()
        self._changes = WatchChanges()
        self._deadline: float | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the reader's side ----------------------------------------------------------

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` whenever something changed (or a scheduled wake is due)."""
        with self._lock:
            if event not in self._events:
                self._events.append(event)

    def start(self, ready_timeout_s: float = 2.0) -> None:
        """Start the thread, and wait up to ``ready_timeout_s`` for its first watch."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(ready_timeout_s)

    @property
    def healthy(self) -> bool:
        """Whether ``root`` itself is being watched now."""
        return self.error is None and self.watching == self.root and self.alive

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def take(self) -> WatchChanges:
        """The paths changed since the last take (and whether to list everything again)."""
        with self._lock:
            out, self._changes = self._changes, WatchChanges()
        return out

    def wake_at(self, monotonic_s: float) -> None:
        """Set the events at ``time.monotonic() == monotonic_s`` (the earliest asked wins).

        While busy (after a change, when deadlines are set) the thread looks at
        the deadline every step, so one set during a wait is met within a step.
        """
        with self._lock:
            if self._deadline is None or monotonic_s < self._deadline:
                self._deadline = monotonic_s

    def stop(self) -> None:
        """Stop the thread and wait for it (harmless when stopped already)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # -- the thread -------------------------------------------------------------------

    def _fire(self) -> None:
        with self._lock:
            events = list(self._events)
        for event in events:
            event.set()

    def _all_reading(self, now: float) -> bool:
        """Whether nobody has waited on any of the wake events for :data:`_READING_S`."""
        with self._lock:
            events = list(self._events)
        return bool(events) and all(
            isinstance(e, WakeEvent) and e.reading_for(now) >= _READING_S for e in events
        )

    def _target(self) -> Path:
        """``root`` if it exists, else its nearest existing parent."""
        path = self.root
        while not path.exists() and path.parent != path:
            path = path.parent
        return path

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.error = f"{type(exc).__name__}: {exc}"[:500]
            self._changes.rescan = True
        log.warning("watching %s failed: %s", self.root, self.error)
        self._fire()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            target = self._target()
            exact = target == self.root
            try:
                notify = _notify(target, recursive=self.recursive and exact)
            except Exception as exc:  # missing package, watch limit, permission: say so, retry
                self._failed(exc)
                self._ready.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 0.2
            with self._lock:
                self.watching = target
                self.error = None if exact else f"{self.root} does not exist; waiting for it"
                if exact:
                    self.generation += 1
            self._ready.set()
            self._fire()  # a new watch: whatever changed before it was not reported
            try:
                self._watch(notify, exact)
            except Exception as exc:  # the watcher itself failed: start over, list again
                self._failed(exc)
                self._stop.wait(backoff)
            finally:
                notify.close()
        with self._lock:
            self.watching = None

    def _watch(self, notify: Any, exact: bool) -> None:
        """Wait for events until the target should change or the thread stops."""
        while not self._stop.is_set():
            step, timeout = self._step_ms()
            got = notify.watch(self.debounce_ms, step, timeout, self._stop)
            if isinstance(got, set):
                self._busy_until = time.monotonic() + self.busy_s
                if self.keep_paths:
                    with self._lock:
                        paths = self._changes.paths
                        paths.update(p for _, p in got)
                        if len(paths) > OVERFLOW_PATHS:
                            paths.clear()
                            self._changes.rescan = True
                self._fire()
                if not exact:
                    return  # something appeared next to the missing folder: look again
            elif got == "stop":
                return
            elif exact != self.root.exists():
                return  # the folder appeared, or was removed: move the watch
            self._due()

    def _step_ms(self) -> tuple[int, int]:
        """The step of the next wait (busy or idle) and its timeout, both in ms."""
        now = time.monotonic()
        busy = now < self._busy_until
        step = self.busy_step_ms if busy and not self._all_reading(now) else self.step_ms
        timeout = _IDLE_TIMEOUT_MS
        if busy:  # one step at a time: a deadline set meanwhile is seen at the next
            timeout = min(timeout, int((self._busy_until - now) * 1000), step)
        with self._lock:
            deadline = self._deadline
        if deadline is not None:
            left = math.ceil((deadline - now) * 1000)
            timeout = min(timeout, left)
            if left <= 2 * step:  # close to it: look in fine steps, so it is met in time
                step = max(1, min(step, _FINE_STEP_MS))
        return step, max(step, timeout)

    def _due(self) -> None:
        with self._lock:
            due = self._deadline is not None and time.monotonic() >= self._deadline - 0.0005
            if due:
                self._deadline = None
        if due:
            self._fire()


def _notify(path: Path, *, recursive: bool) -> Any:
    """A started ``RustNotify`` on ``path`` (permission-denied subfolders are left out)."""
    from watchfiles._rust_notify import RustNotify

    return RustNotify([str(path)], False, False, 0, recursive, True)
