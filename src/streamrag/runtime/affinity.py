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

**Priority** (``ingest.nice``, Linux, where each thread has its own nice
value). Above 0 the reader and the committer — and a worker process that
embeds ahead, which inherits the priority of the thread that starts it — run
below the query workers, so queries come first when the cores are busy and
ingest takes what they leave. Measured with ``benchmarks/contention.py``
(MiniLM, ONNX int8; 4 closed-loop clients that keep both cores busy; writer
150 changes/s), alternated on a 2-core AMD EPYC host: query p99 during the
burst 29.1–29.9 ms at nice 10 against 33.7–36.1 ms at 0 (1.34× and 1.41× of
rest against 1.61–1.73×; 5 gave 1.59×), and ingest during the burst 11.1–11.4
against 18.4–19.9 changes a second. With the hashing embedder nothing moved
(1.96× at 0, 2.12× at 10): its ingest holds the interpreter lock, which has
no priority. Bulk ingest with idle cores is the same either way (9,035–9,844
against 9,356–10,077 documents a second in the peer benchmark's driver), and
freshness p99 there rose slightly (23.8–26.2 against 19.7–23.7 ms over 100
probes): a lower-priority thread that wakes preempts less. So the default is
0, the same priority; 10 is the choice where query latency matters more than
how fast a backlog drains while queries fill the cores.
"""

from __future__ import annotations

import contextlib
import os
import threading

from streamrag.cpus import known_process_cpus

__all__ = ["ingest_cpu", "lower_this_thread", "pin_this_thread"]


def ingest_cpu() -> int | None:
    """The CPU the ingest threads share, or None when there is nothing to choose.

    None when the process may use a single CPU only (pinning would change
    nothing) or the platform cannot say which it may use.
    """
    known = known_process_cpus()
    if known is None:
        return None
    cpus = sorted(known)
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


def lower_this_thread(nice: int) -> bool:
    """Lower the calling thread's CPU priority by ``nice``; False when it could not (or 0).

    On Linux a thread has its own nice value (``setpriority`` on its thread id),
    so the process's other threads keep theirs. Raising a priority again needs
    privileges; lowering does not.
    """
    setter = getattr(os, "setpriority", None)
    if nice <= 0 or setter is None:
        return False
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        setter(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))
        return True
    return False
