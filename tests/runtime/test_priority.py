"""The reader and committer threads of a live job may run below the process's priority
(``ingest.nice``), so that queries come first when the cores are busy."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from streamrag.config import load_settings
from streamrag.runtime import PipelineRunner
from streamrag.runtime.affinity import lower_this_thread
from streamrag.runtime.service import Service
from streamrag.testing import ScriptedSource
from tests.conftest import PipelineFactory
from tests.runtime.loop_threads import backlog, record_per_loop, run_until_both_loops_worked

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="a thread's own nice value is a Linux feature"
)


def _nice_of_this_thread() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("nice", [0, 7])
def test_the_loop_threads_run_at_the_lower_priority_and_nothing_else_does(
    pipeline_factory: PipelineFactory, nice: int
) -> None:
    base = _nice_of_this_thread()
    src = ScriptedSource()
    lines = backlog(40, 5)  # many versions of each document in every micro-batch, a bad line
    src.push(*lines)
    pipeline = pipeline_factory(src)
    seen = record_per_loop(pipeline, _nice_of_this_thread)
    run_until_both_loops_worked(PipelineRunner(pipeline, poll_interval_ms=1, nice=nice), seen)
    stats = pipeline.stats
    assert (stats.applied, stats.dead_lettered) == (len(lines) - 1, 1)  # every record counted
    want = {min(base + nice, 19)}
    assert seen == {"streamrag-read": want, "streamrag-commit": want}
    assert _nice_of_this_thread() == base  # the thread that started them keeps its own
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == base  # and so does the process


def test_lowering_applies_to_the_calling_thread_only() -> None:
    base = _nice_of_this_thread()
    got: list[int] = []

    def lowered() -> None:
        assert lower_this_thread(3)
        got.append(_nice_of_this_thread())

    t = threading.Thread(target=lowered)
    t.start()
    t.join()
    assert got == [min(base + 3, 19)]
    assert _nice_of_this_thread() == base
    assert not lower_this_thread(0)  # 0: nothing to change


def test_a_worker_that_embeds_ahead_runs_at_the_loop_threads_priority(tmp_path: Path) -> None:
    """The worker is started by a loop thread (the first queued change): it inherits the
    lower priority, so ingest's embedding gives way to queries too."""
    base = _nice_of_this_thread()
    lines = backlog(60, 3)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(lines) + "\n")
    settings = load_settings(
        overrides={
            "source.path": str(src),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            "embedder.ahead": "process",
            "ingest.nice": 6,
        },
        environ={},
    )
    service = Service(settings)
    ahead = service.pipeline.embedding.ahead
    assert ahead is not None
    service.start()
    try:
        give_up = time.monotonic() + 60  # a bound for a cold interpreter on a busy machine
        while ahead.pid is None and time.monotonic() < give_up:
            time.sleep(0.01)  # waiting for the reader to queue a change and start it
        assert ahead.pid is not None, ahead.refused
        worker_nice = os.getpriority(os.PRIO_PROCESS, ahead.pid)
        while service.pipeline.stats.ingested < len(lines) and time.monotonic() < give_up:
            time.sleep(0.01)  # waiting for the backlog to be read, not for time
    finally:
        service.stop()
    assert worker_nice == min(base + 6, 19)
    assert os.getpriority(os.PRIO_PROCESS, os.getpid()) == base
    stats = service.pipeline.stats
    assert (stats.applied, stats.dead_lettered) == (len(lines) - 1, 1)  # every record counted
