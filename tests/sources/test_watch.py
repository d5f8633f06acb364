"""The folder watch steps finely only while the job waits for its wake event."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from streamrag.sources.base import WakeEvent
from streamrag.sources.watch import FolderWatch
from tests.e2e.conftest import wait_for


def test_a_wake_event_knows_whether_anyone_waits_on_it() -> None:
    ev = WakeEvent()
    waiter = threading.Thread(target=ev.wait, args=(10,))
    waiter.start()
    wait_for(lambda: ev._waiting == 1, 10, "the waiter")
    assert ev.reading_for(time.monotonic() + 5) == 0.0  # someone waits: not reading
    ev.set()
    waiter.join(10)
    returned = time.monotonic()
    assert ev.reading_for(returned + 5) >= 5.0  # nobody has waited since it returned
    assert ev.reading_for(returned - 5) == 0.0


def _watch(tmp_path: Path, event: threading.Event) -> FolderWatch:
    watch = FolderWatch(tmp_path, recursive=False, step_ms=25, busy_step_ms=2)
    watch.wake_on(event)
    watch._busy_until = time.monotonic() + 60  # a change was seen: the busy window
    return watch


def test_the_watch_steps_finely_while_the_job_waits(tmp_path: Path) -> None:
    ev = WakeEvent()
    watch = _watch(tmp_path, ev)
    waiter = threading.Thread(target=ev.wait, args=(10,))
    waiter.start()
    try:
        wait_for(lambda: ev._waiting == 1, 10, "the waiter")
        assert watch._step_ms()[0] == 2
    finally:
        ev.set()
        waiter.join(10)


def test_the_watch_keeps_to_its_idle_step_while_the_job_reads_a_backlog(tmp_path: Path) -> None:
    ev = WakeEvent()
    watch = _watch(tmp_path, ev)
    ev._since -= 1.0  # nobody has waited for a second: the job is reading
    step, timeout = watch._step_ms()
    assert step == 25
    assert timeout == 25  # it looks again within one step, in case the job waits by then
    # Just back from a wait (a live stream's job reads an append and waits again): fine.
    ev._since = time.monotonic()
    assert watch._step_ms()[0] == 2


def test_a_plain_event_always_gets_fine_steps(tmp_path: Path) -> None:
    watch = _watch(tmp_path, threading.Event())  # no way to tell whether anyone waits
    assert watch._step_ms()[0] == 2
