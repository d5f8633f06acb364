"""Recovery from the committed cursor: a restart ends exactly as an uninterrupted run.

A "crash" here abandons a pipeline without closing anything: what it committed
is in the index's fsynced log, what it read but did not commit is lost with it.
The next pipeline opens the same index and resumes from ``index.cursor``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, ClassVar

import pytest

from streamrag.batching import MicroBatcher
from streamrag.chunking import TokenSplitter
from streamrag.config import Settings
from streamrag.errors import StreamragError
from streamrag.eventtime import WindowResult
from streamrag.index import LsmIndex, LsmSpec
from streamrag.index.wal import WriteAheadLog
from streamrag.ingest import DeadLetterStore
from streamrag.runtime import Pipeline
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.replay import index_digest, window_finals
from streamrag.runtime.service import build_event_time
from streamrag.sources import JsonlSource
from streamrag.sources.base import RawBatch, Source
from streamrag.testing import FakeEmbedder, ManualClock, change_line
from tests.conftest import with_batcher

HOUR_US = 3_600_000_000
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, in seconds

SETTINGS = Settings.model_validate(
    {
        "event_time": {
            "max_out_of_orderness_ms": 600_000,
            "idle_timeout_ms": None,
            "windows": [
                {
                    "name": "per_domain",
                    "kind": "tumbling",
                    "size_ms": 3_600_000,
                    "key": ["domain"],
                    "aggregate": "count",
                }
            ],
        }
    }
)


def _corpus(seed: int, n: int = 400) -> list[str]:
    """Upserts, updates, deletes and malformed lines, mildly out of order."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        t = T0 + i * 30 - rng.randrange(0, 300)  # out of order within 5 minutes
        doc = f"doc{rng.randrange(60)}"
        domain = rng.choice(["ops", "hr", "it"])
        roll = rng.random()
        if roll < 0.05:
            lines.append('{"doc_id": "broken", "event_time": ')  # malformed
        elif roll < 0.15:
            lines.append(change_line(doc, t, op="delete", domain=domain))
        else:
            words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(12))
            lines.append(change_line(doc, t, f"{doc} v{i} {words}", domain=domain))
    return lines


class Job:
    """One process' worth of pipeline over a state directory."""

    opened: ClassVar[list[LsmIndex]] = []

    def __init__(self, state: Path, data: Path | Source, clock: ManualClock, **kwargs: Any) -> None:
        self.index = LsmIndex(64, LsmSpec(), path=state / "index", clock=clock)
        Job.opened.append(self.index)
        self.results: list[tuple[str, WindowResult]] = []
        kwargs.setdefault("max_batch_size", 8)
        kwargs.setdefault("max_delay_ms", 50)
        self.pipeline = Pipeline(
            source=JsonlSource(data) if isinstance(data, Path) else data,
            embedder=FakeEmbedder(),
            index=self.index,
            dead_letters=DeadLetterStore(state / "dead.jsonl"),
            clock=clock,
            splitter=TokenSplitter(max_tokens=8, overlap_tokens=2),
            event_time=build_event_time(SETTINGS, clock),
            on_window=[lambda name, r: self.results.append((name, r))],
            cursor=self.index.cursor,
            **with_batcher({"max_read_bytes": 2048, **kwargs}, clock),
        )

    def crash(self) -> None:
        """Leave as a killed process would: no flush, no checkpoint."""
        self.index.abandon()

    def finish(self) -> None:
        self.pipeline.run_until_caught_up(final=True)
        self.pipeline.finish_event_time()
        self.pipeline.close()
        self.index.close()


@pytest.fixture(autouse=True)
def _release_files() -> Any:
    yield
    while Job.opened:
        Job.opened.pop().abandon()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _reference(tmp: Path, lines: list[str]) -> tuple[Job, list[Any]]:
    data = _write(tmp / "ref.jsonl", lines)
    job = Job(tmp / "ref-state", data, ManualClock(T0 * 10**6))
    job.finish()
    return job, window_finals(job.results)


@pytest.mark.parametrize("seed", range(6))
def test_crashes_at_random_points_end_as_an_uninterrupted_run(tmp_path: Path, seed: int) -> None:
    lines = _corpus(seed)
    ref, ref_windows = _reference(tmp_path, lines)
    data = _write(tmp_path / "changes.jsonl", lines)
    state = tmp_path / "state"
    rng = random.Random(seed)
    clock = ManualClock(T0 * 10**6)
    results: list[tuple[str, WindowResult]] = []
    crashes = 0
    for _ in range(5):  # up to five crashes, each after a random number of steps
        job = Job(state, data, clock)
        for _ in range(rng.randrange(1, 12)):
            clock.advance_ms(rng.choice([0, 10, 60]))
            if rng.random() < 0.6:
                job.pipeline.poll()
            else:
                job.pipeline.flush()
        results += job.results
        job.crash()
        crashes += 1
    job = Job(state, data, clock)
    job.finish()
    results += job.results
    assert crashes == 5
    assert index_digest(job.index) == index_digest(ref.index)
    assert window_finals(results) == ref_windows
    st = job.pipeline.stats
    malformed = sum(1 for line in lines if line.endswith(": "))
    assert st.ingested == len(lines)  # nothing read twice, nothing skipped
    assert st.applied + st.dead_lettered == len(lines)
    assert st.dead_lettered == malformed
    letters = list(DeadLetterStore(state / "dead.jsonl").read())
    assert len(letters) == malformed  # each bad record stored once


def test_waiting_changes_are_replayed_without_counting_them_twice(tmp_path: Path) -> None:
    lines = _corpus(7, n=120)
    ref, ref_windows = _reference(tmp_path, lines)
    data = _write(tmp_path / "changes.jsonl", lines)
    state = tmp_path / "state"
    clock = ManualClock(T0 * 10**6)
    job = Job(state, data, clock, max_batch_size=64, max_delay_ms=10_000)
    job.pipeline.poll()
    job.pipeline.poll()
    job.pipeline.flush(force=True)  # one commit, then more is read and left waiting
    job.pipeline.poll()
    waiting = job.pipeline.batcher.pending
    assert waiting > 0
    cursor = job.index.cursor
    assert cursor is not None
    first = job.results[:]
    job.crash()
    job2 = Job(state, data, clock, max_batch_size=64, max_delay_ms=10_000)
    job2.finish()
    assert index_digest(job2.index) == index_digest(ref.index)
    assert window_finals(first + job2.results) == ref_windows
    assert job2.pipeline.stats.ingested == len(lines)


def test_cursor_holds_positions_waiting_offsets_and_changed_windows_only(tmp_path: Path) -> None:
    lines = [change_line(f"d{i}", T0 + i, f"text {i}", domain="ops") for i in range(6)]
    data = _write(tmp_path / "changes.jsonl", lines)
    clock = ManualClock(T0 * 10**6)
    job = Job(tmp_path / "state", data, clock, max_batch_size=2, max_delay_ms=10_000)
    job.pipeline.poll()  # 6 read; batches of 2 chunks are due at once
    job.pipeline.flush()
    cursor = job.index.cursor
    assert cursor is not None
    assert Cursor.from_mapping(cursor).positions == {str(data): data.stat().st_size}
    assert cursor["stats"]["ingested"] == 6
    assert "window:per_domain" in cursor
    assert job.index.epoch == 3
    assert cursor["pending"] == {}  # all six committed by the last of the three commits
    # Only the first commit after the read carries the window; the next two
    # find it unchanged and leave it out of their log records.
    records = list(WriteAheadLog(tmp_path / "state" / "index").replay(0))
    carried = ["window:per_domain" in (r.batch.cursor or {}) for r in records]
    assert carried == [True, False, False]
    # Likewise the file's position: it moved before the first commit only.
    moved = [f"position:{data}" in (r.batch.cursor or {}) for r in records]
    assert moved == [True, False, False]
    waiting = [len(r.batch.cursor["pending"].get(str(data), [])) for r in records]
    assert waiting == [4, 2, 0]  # two changes per commit leave the batcher
    # Each record is also the commit's audit record.
    audit = records[0].batch.cursor["audit"]
    assert (audit["changes"], audit["upserts"], audit["deletes"]) == (2, 2, 0)
    assert audit["cut_by"] == "size"


def test_cursor_survives_checkpoint_and_log_replay(tmp_path: Path) -> None:
    lines = [change_line(f"d{i}", T0 + i, f"text {i}") for i in range(10)]
    data = _write(tmp_path / "changes.jsonl", lines)
    clock = ManualClock(T0 * 10**6)
    job = Job(tmp_path / "state", data, clock, max_batch_size=4)
    job.pipeline.run_until_caught_up(final=False)
    cursor = job.index.cursor
    # Reopened from the log alone (no checkpoint yet): the same cursor.
    again = LsmIndex(64, LsmSpec(), path=tmp_path / "state" / "index")
    assert again.cursor == cursor
    again.abandon()
    job.index.close()  # a checkpoint: the cursor is written beside the manifest
    third = LsmIndex(64, LsmSpec(), path=tmp_path / "state" / "index")
    assert third.cursor == cursor
    third.close()
    assert any(p.name.startswith("cursor-") for p in (tmp_path / "state" / "index").iterdir())


def test_offsets_only_move_forward(tmp_path: Path) -> None:
    lines = [change_line(f"d{i}", T0 + i, f"text {i}") for i in range(4)]
    data = _write(tmp_path / "changes.jsonl", lines)
    job = Job(tmp_path / "state", data, ManualClock(T0 * 10**6))
    job.pipeline.run_until_caught_up(final=False)
    # Pretend an earlier commit had read further than the source now says.
    job.pipeline.keeper.positions[str(data)] = data.stat().st_size + 100
    _write(data, [*lines, change_line("d9", T0 + 9, "more")])
    job.pipeline.poll()
    with pytest.raises(StreamragError, match="moved back"):
        job.pipeline.flush(force=True)


def test_commit_interval_groups_micro_batches_into_one_epoch(tmp_path: Path) -> None:
    clock = ManualClock(T0 * 10**6)
    data = tmp_path / "changes.jsonl"
    first = [change_line("a", T0, "first document")]
    _write(data, first)
    job = Job(
        tmp_path / "state", data, clock, max_batch_size=1, max_pending=100, commit_interval_ms=100
    )
    job.pipeline.step()
    assert job.index.epoch == 1  # the first commit is not held back
    _write(data, [*first, *(change_line(f"d{i}", T0 + i, f"doc {i}") for i in range(3))])
    clock.advance_ms(10)
    job.pipeline.step()  # three one-chunk batches are due, but the interval is not over
    assert job.index.epoch == 1
    assert job.pipeline.wait_us() == 90_000
    clock.advance_ms(90)
    job.pipeline.flush()
    assert job.index.epoch == 2  # all three in one epoch
    assert job.index.stats().live_docs == 4
    assert json.dumps(job.index.cursor)  # plain data


def test_a_window_result_is_released_once_with_the_commit_that_made_it(tmp_path: Path) -> None:
    """A window fires while changes are read; the job dies before the commit; the restart
    fires it again from the committed state. Downstream sees it once, not twice."""
    lines = [change_line(f"d{i}", T0 + i * 60, f"text {i}", domain="ops") for i in range(5)]
    lines += [
        change_line("d0", T0 + 400, "d0 edited in the same micro-batch", domain="ops"),
        '{"doc_id": "broken", "event_time": ',  # a hostile line among them
        change_line("d7", T0 + 30, "out of order, within the bound", domain="ops"),
        change_line("late-hour", T0 + 2 * 3600, "next hours", domain="ops"),
    ]
    data = _write(tmp_path / "changes.jsonl", lines)
    state = tmp_path / "state"
    clock = ManualClock(T0 * 10**6)
    seen: list[tuple[str, WindowResult]] = []
    first = Job(state, data, clock, max_batch_size=64, max_delay_ms=10_000)
    first.pipeline.on_window.append(lambda name, r: seen.append((name, r)))
    assert first.pipeline.poll() == 9  # hour 0 closes while these are read
    assert seen == []  # not yet committed: nothing leaves
    first.crash()
    second = Job(state, data, clock, max_batch_size=64, max_delay_ms=10_000)
    second.pipeline.on_window.append(lambda name, r: seen.append((name, r)))
    second.pipeline.run_until_caught_up(final=False)
    hour0 = [r for _, r in seen if r.window.start == T0 * 10**6]
    assert [(r.key, r.value) for r in hour0] == [("ops", 7)]  # every change of hour 0, once
    assert second.index.epoch >= 1
    assert second.pipeline.stats.dead_lettered == 1


def test_window_output_fired_by_time_alone_gets_a_commit_of_its_own(tmp_path: Path) -> None:
    """The end of input fires the last window with nothing left to commit: an empty commit
    carries the window state, and the result leaves only once it is in."""
    lines = [change_line(f"d{i}", T0 + i * 60, f"text {i}", domain="ops") for i in range(3)]
    data = _write(tmp_path / "changes.jsonl", lines)
    job = Job(tmp_path / "state", data, ManualClock(T0 * 10**6))
    job.pipeline.run_until_caught_up(final=True)
    epoch = job.index.epoch
    assert job.results == []
    assert job.pipeline.finish_event_time() == 1
    assert job.results == []  # fired, not yet durable
    assert job.pipeline.wait_us() == 0  # so the committer commits at once
    assert job.pipeline.flush() == 1
    assert job.index.epoch == epoch + 1
    assert [(r.key, r.value) for _, r in job.results] == [("ops", 3)]
    assert job.index.stats().live_docs == 3  # the empty commit changed no document
    job.finish()


class _Generations:
    """A source like a database snapshot: after a restart it reads everything again,
    at offsets of a new generation (the old offsets never come back)."""

    def __init__(self, lines: list[bytes], generation: int) -> None:
        self.lines = lines
        self.generation = generation

    def owns(self, partition: str) -> bool:
        return partition == "snap"

    def build(self, resume=None):  # type: ignore[no-untyped-def]
        return _GenerationReader(self.lines, self.generation, dict(resume or {}))


class _GenerationReader:
    def __init__(self, lines: list[bytes], generation: int, resume: dict[str, int]) -> None:
        self.base = generation << 20
        self.lines = lines
        self.pos = max(resume.get("snap", 0), self.base)

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        i = self.pos - self.base
        if i >= len(self.lines):
            return []
        take = self.lines[i : i + 4]
        offsets = [self.pos + j for j in range(len(take))]
        self.pos += len(take)
        return [RawBatch("snap", take, offsets, self.pos)]

    def snapshot(self) -> dict[str, int]:
        return {"snap": self.pos}

    def backlog_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_waiting_changes_a_source_replaces_are_superseded_and_the_counts_add_up(
    tmp_path: Path, clock: ManualClock
) -> None:
    lines = [change_line(f"d{i}", 1_700_000_000 + i, f"row {i}").encode() for i in range(6)]
    emb = FakeEmbedder()

    def job(generation: int) -> Pipeline:
        index = LsmIndex(emb.dim, LsmSpec(), path=tmp_path / "idx", clock=clock)
        return Pipeline(
            source=_Generations(lines, generation),
            embedder=emb,
            index=index,
            clock=clock,
            dead_letters=DeadLetterStore(tmp_path / "dl.jsonl"),
            batcher=MicroBatcher(
                max_batch_size=4, max_delay_ms=1_000_000, max_pending=100, clock=clock
            ),
            cursor=index.cursor,
        )

    first = job(0)
    first.poll()  # d0..d3: a full batch
    first.poll()  # d4, d5: waiting behind it
    first.flush()  # commits d0..d3; the cursor lists d4, d5 as waiting
    assert Cursor.from_mapping(first.index.cursor or {}).waiting == 2
    first.index.close()  # its files, not its batcher: d4, d5 are still only waiting
    # The process dies. The restart reads the whole snapshot again, in generation 1.
    second = job(1)
    second.run_until_caught_up()
    st, pending = second.counts()
    assert pending == 0
    assert st.superseded == 2
    # 6 read, then 6 again in the new generation; the 2 waiting ones were replaced.
    assert (st.ingested, st.applied, st.dead_lettered) == (10, 10, 0)
    assert second.index.stats().live_docs == 6
    second.close()
    second.index.close()
