"""The CPUs streamrag may run on: one answer for every part that sizes work by cores.

Several parts size their work by the cores they may use: the scan helpers
(one thread per core beyond a search's own, :mod:`streamrag.index.scan_helpers`),
the threads that build an HNSW graph (:func:`streamrag.index.ann.build_threads`),
the CPU the ingest threads share (:mod:`streamrag.runtime.affinity`) and the
lock probe of the embed-ahead worker (:mod:`streamrag.embed.ahead`). They ask
here, so that all of them count the same CPUs.

Two questions, because on Linux a thread has an affinity of its own:

* :func:`process_cpus` — the CPUs of the *process*, asked of its main thread:
  a calling thread pinned to one CPU (the ingest threads are, by default)
  does not narrow it.
* :func:`thread_cpus` — the CPUs of the *calling thread*: threads it starts
  (OpenMP's, for a graph build) inherit them, so more threads than these
  gain nothing.

Where the platform cannot say (not Linux), both are every CPU the machine
has; :func:`known_process_cpus` tells the two cases apart.

>>> 1 <= len(process_cpus()) and 1 <= len(thread_cpus())
True
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["known_process_cpus", "process_cpus", "thread_cpus"]


def known_process_cpus() -> set[int] | None:
    """The CPUs the process may use (its main thread's affinity); None where unknown."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None:
        return None
    with contextlib.suppress(OSError):
        cpus = set(getter(os.getpid()))
        return cpus or None
    return None


def process_cpus() -> set[int]:
    """The CPUs the process may use; every CPU of the machine where the platform cannot say."""
    return known_process_cpus() or _every_cpu()


def thread_cpus() -> set[int]:
    """The CPUs the calling thread may use; every CPU of the machine where unknown."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        with contextlib.suppress(OSError):
            cpus = set(getter(0))
            if cpus:
                return cpus
    return _every_cpu()


def _every_cpu() -> set[int]:
    return set(range(os.cpu_count() or 1))
