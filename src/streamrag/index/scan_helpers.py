"""Idle cores take a share of one search's exact scan.

An exact scan is a matrix product over every row it reads, and numpy lets go
of the interpreter lock while it computes, so two threads scan two halves of
the rows at the same time. Under concurrent queries the query workers already
keep the cores busy with batches of their own; but a closed loop of clients
leaves gaps — a worker waits while its answers travel back and the next
queries arrive — and a lone query leaves every core but one idle. A
:class:`ScanHelpers` is a few threads (one per core beyond the caller's) that a
search borrows *only while they are idle*: :meth:`ScanHelpers.run` takes as
many idle helpers as there are tasks beyond one — each search through a
segment's half-precision copy, and the float32 columns cut into ranges — and
the caller and its helpers take the tasks in turn until none is left. A helper
that is busy is never waited for, so a search is never slower than scanning
alone by more than the hand-off (a bare thread ping-pong took 53 µs on the
2-core host of ``docs/performance.md``), and helpers never run
more scans than there are cores.

Measured in process over the peer benchmark's 20,000 documents (two sealed
segments of 8,192 rows with half-precision copies and a growing one of 3,616;
384 dimensions) on a 2-core AMD EPYC host, two alternated rounds: a batch of
16 queries 6.0–6.3 ms alone, 3.3–3.6 ms split; a lone query 0.77–0.93 ms
alone, 0.71–0.83 ms split (its two half-precision scans and the growing
segment's float32 scan share the memory bus, so they gain less). Over HTTP
see ``docs/performance.md`` ("One batch over every core").

The helpers are shared by every index of the process (:func:`scan_helpers`):
cores are a property of the process, not of one index generation.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence

from streamrag.cpus import process_cpus

__all__ = ["ScanHelpers", "scan_helpers"]


class ScanHelpers:
    """``helpers`` threads that take a search's scan tasks while they are idle."""

    def __init__(self, helpers: int) -> None:
        self.helpers = max(0, helpers)
        self._idle = self.helpers
        self._callers = 0  # threads inside run() now
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        if self.helpers:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.helpers, thread_name_prefix="streamrag-scan"
            )
        self.borrowed = 0  # helpers lent to searches since start (tests)

    def cpu_s(self) -> float:
        """CPU seconds the helper threads have used so far (0 where a thread's clock is unknown).

        Each thread's own CPU clock (``pthread_getcpuclockid``), so that a
        caller can tell its helpers' work from the rest of the process's.
        """
        pool = self._pool
        if pool is None:
            return 0.0
        total = 0.0
        for thread in list(getattr(pool, "_threads", ())):
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (AttributeError, OSError, TypeError):  # not started, ended, or not Unix
                continue
        return total

    def _take(self, want: int) -> int:
        """Up to ``want`` idle helpers, marked busy, for a caller counted in ``_callers``.

        Never more than leave one thread per core: the callers scanning now
        and the helpers at work count against the cores (``helpers + 1``), so
        two searches side by side on two cores borrow nothing. Never waits.
        """
        if want <= 0 or self._pool is None:
            return 0
        with self._lock:
            working = self._callers + (self.helpers - self._idle)
            n = max(0, min(want, self._idle, self.helpers + 1 - working))
            self._idle -= n
            self.borrowed += n
        return n

    def _give_back(self) -> None:
        with self._lock:
            self._idle += 1

    def run(self, tasks: Sequence[Callable[[], None]]) -> int:
        """Run every task: on this thread and on idle helpers, at most one per task beyond one.

        Helpers are borrowed only while a core is left for them: callers
        scanning at the same time and helpers at work count against the cores
        (:meth:`_take`).

        The threads take the tasks in turn from one list, so a quick task does
        not leave a thread idle while another runs two, and a helper that wakes
        after the last task was taken is not waited for. Returns once all are
        done, with the first error any of them raised; the helpers it sent.
        """
        with self._lock:
            self._callers += 1
        try:
            return self._run(tasks)
        finally:
            with self._lock:
                self._callers -= 1

    def _run(self, tasks: Sequence[Callable[[], None]]) -> int:
        n = self._take(min(self.helpers, len(tasks) - 1))
        if n == 0:
            for task in tasks:
                task()
            return 0
        turns = _Turns(tasks)
        assert self._pool is not None
        sent = 0
        for _ in range(n):
            try:
                self._pool.submit(self._helped, turns.work)
                sent += 1
            except RuntimeError:  # the pool has shut down (interpreter exit): fewer helpers
                self._give_back()
        turns.work()
        turns.wait()  # for tasks a helper started: they write into the caller's arrays
        if turns.errors:
            raise turns.errors[0]
        return sent

    def _helped(self, work: Callable[[], None]) -> None:
        try:
            work()
        finally:
            self._give_back()

    def close(self) -> None:
        """Stop the helper threads (a scan after this runs on the caller alone)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class _Turns:
    """One run's tasks, taken in turn by the caller and its helpers.

    A helper that wakes after every task was taken finds nothing to do: the
    caller waits only for tasks a helper has started, never for a helper
    still waiting for a core.
    """

    __slots__ = ("_cond", "_next", "_running", "errors", "tasks")

    def __init__(self, tasks: Sequence[Callable[[], None]]) -> None:
        self.tasks = tasks
        self.errors: list[BaseException] = []
        self._next = 0
        self._running = 0  # tasks started and not finished
        self._cond = threading.Condition()

    def _claim(self) -> int | None:
        with self._cond:
            if self._next >= len(self.tasks):
                return None
            self._next += 1
            self._running += 1
            return self._next - 1

    def work(self) -> None:
        """Run tasks until none is left to take."""
        while (i := self._claim()) is not None:
            try:
                self.tasks[i]()
            except BaseException as exc:  # re-raised on the calling thread
                self.errors.append(exc)
            finally:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def wait(self) -> None:
        """Until no task is running (none is left to take: call after :meth:`work`)."""
        with self._cond:
            while self._running:
                self._cond.wait()


_SHARED: dict[int, ScanHelpers] = {}
"""The helpers by their thread count (caller included)."""
_ASKED: dict[int, ScanHelpers] = {}
"""The helpers by the ``threads`` asked for: every search asks, and ``0`` is resolved once."""
_SHARED_LOCK = threading.Lock()


def scan_helpers(threads: int) -> ScanHelpers:
    """The process's helpers for searches that may use ``threads`` threads (0: every CPU).

    ``threads`` counts the caller: 1 means no helpers at all. ``0`` counts the
    CPUs the process may use when first asked (:func:`~streamrag.cpus.process_cpus`,
    a system call): every search asks for its helpers, so later searches get
    the same ones without asking the system again.
    """
    found = _ASKED.get(threads)
    if found is not None:
        return found
    count = threads if threads > 0 else len(process_cpus())
    with _SHARED_LOCK:
        helpers = _SHARED.get(count)
        if helpers is None:
            helpers = _SHARED[count] = ScanHelpers(count - 1)
        _ASKED[threads] = helpers
        return helpers
