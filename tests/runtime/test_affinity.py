"""The reader and committer threads of a live job share one CPU (``ingest.share_core``)."""

from __future__ import annotations

import os
import threading

import pytest

from streamrag.runtime import PipelineRunner
from streamrag.runtime.affinity import ingest_cpu, pin_this_thread
from streamrag.testing import ScriptedSource
from tests.conftest import PipelineFactory
from tests.runtime.loop_threads import backlog, record_per_loop, run_until_both_loops_worked

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning threads needs Linux and at least two CPUs to choose from",
)


@pytest.mark.parametrize("share", [True, False])
def test_the_loop_threads_run_on_the_last_cpu_together(
    pipeline_factory: PipelineFactory, share: bool
) -> None:
    allowed = os.sched_getaffinity(0)
    src = ScriptedSource()
    lines = backlog(40, 5)  # many versions of each document in every micro-batch
    src.push(*lines)
    pipeline = pipeline_factory(src)
    seen = record_per_loop(pipeline, lambda: frozenset(os.sched_getaffinity(0)))
    run_until_both_loops_worked(
        PipelineRunner(pipeline, poll_interval_ms=1, share_core=share), seen
    )
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
