"""The reader and committer threads of a live job may run below the process's priority
(``ingest.nice``), so that queries come first when the cores are busy."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from streamrag.runtime import PipelineRunner
from streamrag.runtime.affinity import lower_this_thread
from streamrag.testing import ScriptedSource, change_line
from tests.conftest import PipelineFactory

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
    lines = [change_line(f"d{i}", 1_700_000_000 + i, f"text {i}") for i in range(50)]
    src.push(*lines)
    pipeline = pipeline_factory(src)
    seen: dict[str, set[int]] = defaultdict(set)
    for name in ("poll", "flush"):
        work = getattr(pipeline, name)

        def spy(*args: Any, _work: Any = work, **kwargs: Any) -> Any:
            seen[threading.current_thread().name].add(_nice_of_this_thread())
            return _work(*args, **kwargs)

        setattr(pipeline, name, spy)
    runner = PipelineRunner(pipeline, poll_interval_ms=1, nice=nice)
    runner.start()
    try:
        give_up = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < give_up:
            time.sleep(0.002)  # waiting for both loops to have worked, not for time
    finally:
        runner.stop()
    assert pipeline.stats.applied == len(lines)
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
