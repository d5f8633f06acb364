"""Whether an embedder computes on the calling thread, measured from its calls.

The server answers a lone query on its event loop, without the hand-off to a
query worker and back, only when the query's embedder computes in the process
with no I/O to wait on (:class:`~streamrag.serve.batcher.QueryBatcher`): a call
that waits on the network could hold the loop for as long as its timeout. The
embedders streamrag ships say which they are (``in_process``,
:func:`~streamrag.embed.base.in_process`): hashing, ONNX and
sentence-transformers compute here, OpenAI and TEI call a service. An embedder
class of the user's (``embedder.class``, by import path) usually says nothing.

Such an embedder is judged by its query calls. A call that computes — in
Python or in native code on the calling thread — spends nearly all of its wall
time on that thread's CPU (``time.thread_time``); a call to a service spends it
waiting. :class:`ComputesHere` keeps both sums over recent calls, each call
weighing :data:`DECAY` less for every call after it, and says "computes here"
once :data:`MIN_CALLS` calls were measured and the CPU time is at least
:data:`MIN_SHARE` of the wall time. Measured on the peer benchmark's hashing
embedder (numpy, one short query a call): 0.956 over 4,432 calls. A call
that waits — a slow network fetch, the interpreter lock held by another thread
— lowers the share, and queries go back to the workers until calls compute
again: the measurement errs towards the hand-off, which is always correct.

An embedder that computes on threads of its own (a thread pool inside the
model) shows little CPU on the calling thread and is not taken for one that
computes here; it can say so itself with a class attribute ``in_process =
True``, and one that may wait on I/O with ``in_process = False``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DECAY", "MIN_CALLS", "MIN_SHARE", "ComputesHere"]

DECAY = 0.9
"""Weight of a call in the sums, per call measured after it (about the last ten count)."""

MIN_CALLS = 8
"""Calls measured before the verdict can be "computes here"."""

MIN_SHARE = 0.5
"""The least share of the calls' wall time spent on the calling thread's CPU."""


class ComputesHere:
    """Measures an embedder's calls: does their time go to computing on the calling thread?

    ``wall`` and ``cpu`` are the clocks (seconds): the process's monotonic
    clock and the calling thread's CPU time, injected in tests. Safe to call
    from several threads at once (a lock guards the sums).

    >>> wall, cpu = [0.0], [0.0]
    >>> here = ComputesHere(wall=lambda: wall[0], cpu=lambda: cpu[0])
    >>> for _ in range(MIN_CALLS):
    ...     here.add(cpu_s=0.0009, wall_s=0.001)  # computes: 90 % on the CPU
    >>> here.verdict
    True
    >>> for _ in range(3):
    ...     here.add(cpu_s=0.0001, wall_s=0.020)  # then waits on the network
    >>> here.verdict
    False
    """

    __slots__ = ("_calls", "_cpu", "_cpu_clock", "_lock", "_wall", "_wall_clock")

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.perf_counter,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._wall_clock = wall
        self._cpu_clock = cpu
        self._lock = threading.Lock()
        self._calls = 0
        self._cpu = 0.0  # decayed sums of the calls' CPU and wall seconds
        self._wall = 0.0

    def call(self, embed: Callable[[list[str]], Any], texts: Sequence[str]) -> Any:
        """``embed(texts)``, measured (a call that raises is not counted)."""
        w0, c0 = self._wall_clock(), self._cpu_clock()
        out = embed(list(texts))
        self.add(cpu_s=self._cpu_clock() - c0, wall_s=self._wall_clock() - w0)
        return out

    def add(self, *, cpu_s: float, wall_s: float) -> None:
        """Fold in one call that took ``wall_s`` seconds, ``cpu_s`` of them on this thread's CPU."""
        with self._lock:
            self._calls += 1
            self._cpu = self._cpu * DECAY + max(0.0, cpu_s)
            self._wall = self._wall * DECAY + max(0.0, wall_s)

    @property
    def share(self) -> float | None:
        """The recent calls' CPU time over their wall time; None before any call took time."""
        with self._lock:
            return None if self._wall <= 0 else min(1.0, self._cpu / self._wall)

    @property
    def verdict(self) -> bool:
        """True once :data:`MIN_CALLS` calls were measured, at least :data:`MIN_SHARE` computing."""
        share = self.share
        return self._calls >= MIN_CALLS and share is not None and share >= MIN_SHARE

    def status(self) -> dict[str, Any]:
        """The calls measured and their CPU share, for ``/v1/status``."""
        share = self.share
        return {"calls": self._calls, "cpu_share": None if share is None else round(share, 3)}
