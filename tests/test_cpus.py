"""The CPUs streamrag counts: the process's (its main thread's) and the calling thread's."""

from __future__ import annotations

import os
import threading

import pytest

from streamrag import cpus
from streamrag.index.ann import AnnSpec, build_threads
from streamrag.runtime.affinity import ingest_cpu

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs a platform with thread affinity and two CPUs",
)


def _in_thread_pinned_to(cpu: int) -> dict[str, object]:
    """What each question answers inside a thread pinned to ``cpu``."""
    seen: dict[str, object] = {}

    def run() -> None:
        os.sched_setaffinity(0, {cpu})
        seen["thread"] = cpus.thread_cpus()
        seen["process"] = cpus.process_cpus()
        seen["known"] = cpus.known_process_cpus()
        seen["build"] = build_threads(AnnSpec())
        seen["ingest"] = ingest_cpu()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return seen


def test_a_pinned_thread_narrows_its_own_cpus_not_the_process() -> None:
    every = set(os.sched_getaffinity(os.getpid()))
    last = max(every)
    seen = _in_thread_pinned_to(min(every))
    assert seen["thread"] == {min(every)}
    assert seen["process"] == every
    assert seen["known"] == every
    # A graph built from that thread gets one thread: OpenMP's would inherit the pin.
    assert seen["build"] == 1
    # The ingest threads' CPU is chosen from the process's CPUs, wherever it is asked.
    assert seen["ingest"] == last
    assert cpus.thread_cpus() == every  # this thread was not pinned


def test_without_affinity_every_cpu_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    every = set(range(os.cpu_count() or 1))
    assert cpus.known_process_cpus() is None
    assert cpus.process_cpus() == every
    assert cpus.thread_cpus() == every
    assert ingest_cpu() is None  # nothing to choose from
