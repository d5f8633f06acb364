"""The reader and committer threads of a live job share one CPU (``ingest.share_core``)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from streamrag.runtime import Pipeline, PipelineRunner
from streamrag.runtime.affinity import ingest_cpu, pin_this_thread
from streamrag.testing import ScriptedSource, change_line
from tests.conftest import PipelineFactory

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning threads needs Linux and at least two CPUs to choose from",
)


def _record_cpus(pipeline: Pipeline) -> dict[str, set[frozenset[int]]]:
    """The CPUs each thread may use while it polls or flushes, by thread name (filled later)."""
    seen: dict[str, set[frozenset[int]]] = defaultdict(set)
    for name in ("poll", "flush"):
        work = getattr(pipeline, name)

        def spy(*args: Any, _work: Any = work, **kwargs: Any) -> Any:
            seen[threading.current_thread().name].add(frozenset(os.sched_getaffinity(0)))
            return _work(*args, **kwargs)

        setattr(pipeline, name, spy)
    return seen


def _backlog(n_docs: int, versions: int) -> list[str]:
    """Every document's versions, shuffled (late versions arrive after newer ones), a bad line."""
    rng = random.Random(7)
    lines = [
        change_line(f"d{d}", 1_700_000_000 + v, f"doc {d} version {v}")
        for d in range(n_docs)
        for v in range(versions)
    ]
    rng.shuffle(lines)
    lines.insert(len(lines) // 2, '{"doc_id": "broken", "event_time": ')
    return lines


@pytest.mark.parametrize("share", [True, False])
def test_the_loop_threads_run_on_the_last_cpu_together(
    pipeline_factory: PipelineFactory, share: bool
) -> None:
    allowed = os.sched_getaffinity(0)
    src = ScriptedSource()
    lines = _backlog(40, 5)  # many versions of each document in every micro-batch
    src.push(*lines)
    pipeline = pipeline_factory(src)
    seen = _record_cpus(pipeline)
    runner = PipelineRunner(pipeline, poll_interval_ms=1, share_core=share)
    runner.start()
    try:
        give_up = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < give_up:
            time.sleep(0.002)  # waiting for both loops to have worked, not for time
    finally:
        runner.stop()  # the rest is read and committed on the way out
    stats = pipeline.stats
    # Every record applied or dead-lettered, pinned or not.
    assert (stats.applied, stats.dead_lettered) == (len(lines) - 1, 1)
    assert stats.stale > 0  # the late versions were seen and lost to the newer ones
    want = frozenset({max(allowed)} if share else allowed)
    assert seen == {"streamrag-read": {want}, "streamrag-commit": {want}}
    # Nothing else is pinned: not the thread that started them, nor the process.
    assert os.sched_getaffinity(0) == allowed


def test_ingest_cpu_is_the_last_allowed_and_none_with_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 0, 3})
    assert ingest_cpu() == 5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2})
    assert ingest_cpu() is None  # one CPU: nothing to choose, nothing pinned


def test_pinning_applies_to_the_calling_thread_only() -> None:
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    got: list[set[int]] = []

    def pinned() -> None:
        assert pin_this_thread(cpu)
        got.append(os.sched_getaffinity(0))

    t = threading.Thread(target=pinned)
    t.start()
    t.join()
    assert got == [{cpu}]
    assert os.sched_getaffinity(0) == allowed
    assert not pin_this_thread(None)
