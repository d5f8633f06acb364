"""Crashes scripted into the input: a pipeline that dies at a ``CRASH`` marker and
restarts from its committed cursor ends exactly as an uninterrupted run.

The input is a :class:`~streamrag.testing.Timeline`: changes mildly out of order,
source watermarks, late changes marked as such, pauses, malformed lines, and
``CRASH`` markers. The reader raises :class:`~streamrag.testing.ScriptedCrash`
where one stands, in the middle of a poll loop, with changes read and not yet
committed. The test then does what a restarted process does: it abandons the
index (what was committed is in its log, the rest is lost), opens it again and
builds a pipeline from ``index.cursor`` over the same source. Each marker fires
once, so the restarted reader passes the crash point by. The reference plays the
same timeline with the crashes disarmed (same offsets) and no restart.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from streamrag.eventtime import WindowResult
from streamrag.ingest import DeadLetterStore
from streamrag.runtime.replay import index_digest, window_finals
from streamrag.testing import (
    ManualClock,
    ScriptedCrash,
    ScriptedSource,
    Timeline,
    change_line,
)
from tests.runtime.test_recovery import Job

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, in seconds
US = 1_000_000

MALFORMED = '{"doc_id": "broken", "event_time": '


class Process(Job):
    """A recovery test's job over a scripted source, resumed from its cursor."""

    def __init__(self, source: ScriptedSource, state: Path, clock: ManualClock) -> None:
        super().__init__(state, source, clock, max_read_bytes=600)


class Outcome:
    def __init__(self, last: Process, windows: list[tuple[str, WindowResult]], crashes: int):
        self.last = last
        self.windows = windows
        self.crashes = crashes
        self.digest = index_digest(last.index)
        self.stats = last.pipeline.stats


def _play(source: ScriptedSource, state: Path) -> Outcome:
    """Poll and commit until the source ends; on a crash, restart from the cursor."""
    clock = ManualClock(T0 * US)
    windows: list[tuple[str, WindowResult]] = []
    crashes = 0
    proc = Process(source, state, clock)
    for _ in range(20_000):
        try:
            read = proc.pipeline.poll()
            clock.advance_ms(20)
            proc.pipeline.flush()
        except ScriptedCrash:
            crashes += 1
            windows += proc.results
            proc.crash()
            proc = Process(source, state, clock)
            continue
        if read == 0 and proc.pipeline.reader.ended:  # type: ignore[attr-defined]
            break
    else:
        raise AssertionError("the timeline never reached its EOF")
    proc.finish()
    windows += proc.results
    return Outcome(proc, windows, crashes)


def _timeline(seed: int, n: int = 240, crashes: int = 4) -> tuple[Timeline, int]:
    """Upserts, deletes, malformed lines, watermarks, late changes, pauses and crashes."""
    rng = random.Random(seed)
    crash_before = set(rng.sample(range(n), crashes))
    tl = Timeline()
    newest = T0
    malformed = 0
    for i in range(n):
        if i in crash_before:
            tl.crash()
        if rng.random() < 0.04:
            tl.pause()
        if i % 20 == 19:
            tl.watermark((newest - 120) * US)  # the source's own bounded-lateness claim
        t = T0 + i * 30 - rng.randrange(0, 300)  # out of order within 5 minutes
        newest = max(newest, t)
        doc = f"doc{rng.randrange(50)}"
        domain = rng.choice(["ops", "hr", "it"])
        roll = rng.random()
        if roll < 0.05:
            tl.raw(MALFORMED)
            malformed += 1
            continue
        if roll < 0.15:
            line = change_line(doc, t, op="delete", domain=domain)
        else:
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(10))
            line = change_line(doc, t, f"{doc} v{i} {words}", domain=domain)
        wm = tl.current_watermark
        tl.add(line, late=wm is not None and t * US < wm)
    tl.eof()
    return tl, malformed


def _assert_same(crashed: Outcome, reference: Outcome, records: int, malformed: int) -> None:
    assert crashed.digest == reference.digest
    assert window_finals(crashed.windows) == window_finals(reference.windows)
    st = crashed.stats
    assert st.ingested == reference.stats.ingested == records  # nothing read twice or skipped
    assert st.applied + st.dead_lettered == records
    assert st.dead_lettered == malformed


@pytest.mark.parametrize("seed", range(4))
def test_scripted_crashes_end_as_an_uninterrupted_run(tmp_path: Path, seed: int) -> None:
    tl, malformed = _timeline(seed)
    records = sum(isinstance(x, bytes) for x in tl.items)
    reference = _play(tl.source(crashes=False), tmp_path / "ref")
    crashed = _play(tl.source(), tmp_path / "crashed")
    assert reference.crashes == 0
    assert crashed.crashes == 4
    _assert_same(crashed, reference, records, malformed)
    letters = list(DeadLetterStore(tmp_path / "crashed" / "dead.jsonl").read())
    assert len({(x.stage, x.offset) for x in letters}) == len(letters)  # each stored once
    assert sorted(x.offset for x in letters if x.stage == "decode") == [
        i for i, x in enumerate(tl.items) if x == MALFORMED.encode()
    ]


def _lines(n: int, start: int = 0) -> list[str]:
    return [
        change_line(f"d{i % 5}", T0 + i, f"version {i} of d{i % 5}", domain="ops")
        for i in range(start, start + n)
    ]


def test_a_crash_during_recovery(tmp_path: Path) -> None:
    """Two crashes back to back: the restarted process dies before it commits anything."""
    tl = Timeline().add(*_lines(30)).crash().crash().add(*_lines(30, start=30)).eof()
    reference = _play(tl.source(crashes=False), tmp_path / "ref")
    crashed = _play(tl.source(), tmp_path / "crashed")
    assert crashed.crashes == 2
    _assert_same(crashed, reference, 60, 0)


def test_a_crash_before_the_first_commit(tmp_path: Path) -> None:
    tl = Timeline().crash().add(*_lines(12)).pause().crash().add(*_lines(12, start=12)).eof()
    reference = _play(tl.source(crashes=False), tmp_path / "ref")
    crashed = _play(tl.source(), tmp_path / "crashed")
    assert crashed.crashes == 2
    _assert_same(crashed, reference, 24, 0)


def _pump(proc: Process, polls: int) -> None:
    """Poll and commit what is due without moving time: only full batches commit."""
    for _ in range(polls):
        proc.pipeline.poll()
        proc.pipeline.flush()


def test_a_crash_with_changes_waiting_in_the_batcher(tmp_path: Path) -> None:
    """Changes read but not due (their deadline has not passed) die with the process."""
    tl = Timeline().add(*_lines(43)).crash().add(*_lines(5, start=43)).eof()
    source = tl.source()
    proc = Process(source, tmp_path / "state", ManualClock(T0 * US))
    with pytest.raises(ScriptedCrash):
        _pump(proc, 100)
    assert proc.pipeline.batcher.pending > 0
    assert proc.index.epoch > 0
    proc.crash()
    after = _play(source, tmp_path / "state")
    reference = _play(tl.source(crashes=False), tmp_path / "ref")
    assert after.crashes == 0
    _assert_same(after, reference, 48, 0)
