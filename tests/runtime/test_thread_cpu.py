"""CPU time by thread, from Linux's per-thread accounting."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from streamrag.runtime.metrics import Metrics
from streamrag.runtime.thread_cpu import _ticks, thread_cpu_seconds

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

_TICK_SLACK_S = 0.05
"""/proc counts in clock ticks (10 ms here): a few of them either way."""


def _scraped(name: str) -> float | None:
    for line in Metrics().render().decode().splitlines():
        if line.startswith(f'streamrag_thread_cpu_seconds_total{{thread="{name}"}}'):
            return float(line.rpartition(" ")[2])
    return None


class _Burner:
    """A thread that uses ``seconds`` of CPU, says how much it used, and waits to end."""

    def __init__(self, name: str, seconds: float) -> None:
        self.seconds = seconds
        self.used = 0.0
        self.burned = threading.Event()
        self.release = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name)
        self.thread.start()
        assert self.burned.wait(30)

    def _run(self) -> None:
        start = time.thread_time()
        while time.thread_time() - start < self.seconds:
            sum(range(1000))
        self.used = time.thread_time()
        self.burned.set()
        self.release.wait(30)

    def end(self) -> None:
        self.release.set()
        self.thread.join()


def test_a_named_thread_is_charged_what_it_used_and_the_rest_adds_up() -> None:
    burner = _Burner("streamrag-burn", 0.3)
    try:
        seen = thread_cpu_seconds()
        scraped = _scraped("streamrag-burn")
    finally:
        burner.end()
    assert abs(seen["streamrag-burn"] - burner.used) <= _TICK_SLACK_S
    assert scraped is not None
    assert abs(scraped - burner.used) <= _TICK_SLACK_S
    # Unnamed and native threads go to "other", ended ones to "exited": the
    # series add up to the process's own CPU time.
    assert {"MainThread", "other", "exited"} <= set(seen)
    assert abs(sum(seen.values()) - time.process_time()) <= 2 * _TICK_SLACK_S


def test_an_ended_thread_moves_to_exited() -> None:
    before = thread_cpu_seconds().get("exited", 0.0)
    burner = _Burner("streamrag-gone", 0.2)
    burner.end()
    after = thread_cpu_seconds()
    assert "streamrag-gone" not in after
    assert after["exited"] - before >= burner.used - _TICK_SLACK_S


def test_threads_not_named_by_streamrag_are_summed_as_other() -> None:
    burner = _Burner("someone-else", 0.2)
    try:
        seen = thread_cpu_seconds()
    finally:
        burner.end()
    assert "someone-else" not in seen
    assert seen["other"] >= burner.used - _TICK_SLACK_S


def test_a_command_name_with_spaces_and_parentheses_is_parsed() -> None:
    # Fields after the name: state, ppid, ..., utime (14th of the line), stime (15th).
    line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 300 45 0 0 20 0 1 0 100"
    assert _ticks(line) == 345
