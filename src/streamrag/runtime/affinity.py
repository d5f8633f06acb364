"""One core for the ingest threads: Python threads that pass the interpreter lock back and forth.

A live job reads and commits on two threads (:mod:`streamrag.runtime.executor`)
so that a batch is decoded while the one before it embeds. Both run Python,
and Python runs one thread at a time: they take turns at the interpreter lock.
When the two sit on different cores, every turn likely moves what they share —
the lock itself, reference counts, the batcher's queues — from one core's cache
to the other's, and a thread waits for the other core to wake before it may go
on. That costs more than the overlap gains when the embedder holds the lock too
(a Python embedder). Measured on a 2-core AMD EPYC host, ``streamrag serve``
ingesting 20,000 documents appended to its file, with the peer benchmark's
numpy hashing embedder, three alternated rounds: 7,480–8,570 documents a second
with the threads free to move, 8,840–9,270 with both on one core, on 2.66–3.07
against 2.44–2.59 CPU seconds (the whole process on one core: 9,700–10,500 a
second). With MiniLM (an embedder that releases the lock while it computes)
the two came out within noise (26.9–27.0 against 27.1–27.9 s for 400
documents).

So by default (``ingest.share_core``) the reader and the committer run on one
CPU: the last of those the process may use, which leaves the others to the
query workers, index maintenance and native code (matrix products, ONNX
Runtime's own threads). Only those two threads are pinned; threads they start
inherit it (the embedders load before they start, so ONNX Runtime's and
torch's thread pools are free). Where threads cannot be pinned (not Linux),
this does nothing.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["ingest_cpu", "pin_this_thread", "process_cpus"]


def process_cpus() -> set[int]:
    """The CPUs this process may use (all of them where the platform cannot say).

    Asked of the process's main thread, so a pinned calling thread does not narrow it.
    """
    getter = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        with contextlib.suppress(OSError):
            return set(getter(os.getpid()))
    return set(range(os.cpu_count() or 1))


def ingest_cpu() -> int | None:
    """The CPU the ingest threads share, or None when there is nothing to choose.

    None when the process may use a single CPU only (pinning would change
    nothing) or the platform cannot say which it may use.
    """
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    try:
        cpus = sorted(getter(0))
    except OSError:
        return None
    return cpus[-1] if len(cpus) > 1 else None


def pin_this_thread(cpu: int | None) -> bool:
    """Run the calling thread on ``cpu`` only; False when it could not (or ``cpu`` is None).

    On Linux ``sched_setaffinity(0, ...)`` applies to the calling thread, not
    the whole process.
    """
    setter = getattr(os, "sched_setaffinity", None)
    if cpu is None or setter is None:
        return False
    with contextlib.suppress(OSError):
        setter(0, {cpu})
        return True
    return False
