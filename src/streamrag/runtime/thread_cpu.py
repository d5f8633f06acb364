"""CPU time by thread: where a streamrag process spends its cores.

One process runs the ingest loop, the index's maintenance (merges, graph and
half-precision builds), the query workers and the HTTP event loop. When
queries slow down while ingest runs, the first question is which of them took
the cores. ``streamrag_thread_cpu_seconds_total{thread=...}`` answers it, read
at scrape time from Linux's per-thread accounting (``/proc/self/task/<tid>/stat``,
user plus system time, in clock ticks):

- ``thread`` is the Python thread's name for threads streamrag names
  (``streamrag-commit``, ``streamrag-index-maintenance``, ``streamrag-query-0``,
  ...) and ``MainThread`` (the event loop of ``streamrag serve``);
- ``other``: every other live thread, Python's or a native library's (ONNX
  Runtime, OpenBLAS and FAISS pools, the HTTP server's helper threads);
- ``exited``: threads that have ended, so the series add up to the process's
  own CPU time (``/proc/self/stat``).

A thread that ends takes its series with it (its time moves to ``exited``).
Elsewhere than Linux the family is empty.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["ThreadCpuCollector", "thread_cpu_seconds"]

_PROC = Path("/proc/self")
_NAMED = ("streamrag-", "MainThread")
"""Thread names kept as their own series: streamrag's threads are bounded in number."""


def _ticks(stat: str) -> int:
    """User plus system time, in clock ticks, from one ``stat`` line (``proc(5)``)."""
    # The command name is in parentheses and may hold spaces: split after it.
    fields = stat.rsplit(")", 1)[1].split()
    # Fields 14 and 15 of the line (utime, stime); the split starts at field 3.
    return int(fields[11]) + int(fields[12])


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds by thread label (see the module); empty where ``/proc`` is missing."""
    try:
        hz = os.sysconf("SC_CLK_TCK")
        total = _ticks((_PROC / "stat").read_text())
        tasks = list((_PROC / "task").iterdir())
    except (OSError, ValueError, IndexError):
        return {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks: defaultdict[str, int] = defaultdict(int)
    live = 0
    for task in tasks:
        try:
            used = _ticks((task / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # ended between the listing and the read: counted in ``exited``
        name = names.get(int(task.name), "")
        ticks[name if name.startswith(_NAMED) else "other"] += used
        live += used
    ticks["exited"] = max(0, total - live)
    return {name: t / hz for name, t in ticks.items()}


class ThreadCpuCollector(Collector):
    """Exports :func:`thread_cpu_seconds` at every scrape."""

    def describe(self) -> list[CounterMetricFamily]:
        """Nothing up front: the threads are known only at scrape time."""
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One counter family, a series per thread label."""
        family = CounterMetricFamily(
            "streamrag_thread_cpu_seconds",
            "CPU time (user + system) of this process by thread: streamrag's named threads, "
            "'other' live threads, and 'exited' ones.",
            labels=["thread"],
        )
        for name, seconds in sorted(thread_cpu_seconds().items()):
            family.add_metric([name], seconds)
        yield family
