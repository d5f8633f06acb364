"""Helpers for tests of where and how a live job's loop threads run (read, commit)."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from streamrag.runtime import Pipeline, PipelineRunner
from streamrag.testing import change_line


def record_per_loop(pipeline: Pipeline, probe: Callable[[], Hashable]) -> dict[str, set[Hashable]]:
    """What ``probe`` says on each thread that polls or flushes, by thread name (filled later)."""
    seen: dict[str, set[Hashable]] = defaultdict(set)
    for name in ("poll", "flush"):
        work = getattr(pipeline, name)

        def spy(*args: Any, _work: Any = work, **kwargs: Any) -> Any:
            seen[threading.current_thread().name].add(probe())
            return _work(*args, **kwargs)

        setattr(pipeline, name, spy)
    return seen


def run_until_both_loops_worked(runner: PipelineRunner, seen: dict[str, set[Hashable]]) -> None:
    """Start the runner, wait until both loops have worked, and stop it (all is committed)."""
    runner.start()
    try:
        give_up = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < give_up:
            time.sleep(0.002)  # waiting for both loops to have worked, not for time
    finally:
        runner.stop()  # the rest is read and committed on the way out


def backlog(n_docs: int, versions: int) -> list[str]:
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
