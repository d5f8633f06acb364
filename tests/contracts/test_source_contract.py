"""Every Source implementation goes through the same checks.

A source is where exactly-once starts: a reader that loses a record, returns one
twice, lets an offset move back or resumes a few bytes off breaks the guarantee
before any other stage runs. So each implementation is driven through the
:class:`~streamrag.sources.base.SourceReader` contract here, with the same
data, and held to what a broken one would get wrong.

To add an implementation, write a :class:`Writer` for it (how a test appends
records to what it reads) and add one line to :data:`CASES`;
:func:`test_every_source_implementation_has_a_case` fails until then.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pickle
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

import streamrag.sources
import streamrag.testing
from streamrag.errors import SourceError
from streamrag.sources import JsonlSource, MultiSource, RawBatch, Source, SourceReader
from streamrag.testing import WATERMARK, ScriptedSource

ROOT = Path(__file__).resolve().parents[2]

# -- how each implementation is written to ----------------------------------------


class Writer(Protocol):
    """Appends to what one source reads."""

    def append(self, *records: bytes) -> None:
        """Append complete records (one line each, no newline)."""

    def append_partial(self, head: bytes) -> None:
        """Start a record and leave it unfinished (a writer half-way through a line)."""

    def finish_partial(self, rest: bytes) -> None:
        """Finish the record :meth:`append_partial` started."""

    def truncate(self) -> None:
        """Throw all the data away, as an operator replacing the input would."""


class FilesWriter:
    """Appends lines to JSONL files, one record to each in turn."""

    def __init__(self, *files: Path) -> None:
        self.files = files
        self._next = 0
        self._partial: Path | None = None

    def _target(self) -> Path:
        target = self.files[self._next % len(self.files)]
        self._next += 1
        return target

    def append(self, *records: bytes) -> None:
        assert self._partial is None, "finish the partial record first"
        for record in records:
            with open(self._target(), "ab") as fh:
                fh.write(record + b"\n")

    def append_partial(self, head: bytes) -> None:
        self._partial = self._target()
        with open(self._partial, "ab") as fh:
            fh.write(head)

    def finish_partial(self, rest: bytes) -> None:
        assert self._partial is not None
        with open(self._partial, "ab") as fh:
            fh.write(rest + b"\n")
        self._partial = None

    def truncate(self) -> None:
        for file in self.files:
            if file.exists():
                file.write_bytes(b"")


class ScriptWriter:
    """Pushes records into a scripted source, each append after a new watermark if asked."""

    def __init__(self, source: ScriptedSource, *, watermarks: bool = False) -> None:
        self.source = source
        self.watermarks = watermarks
        self._time = 0

    def append(self, *records: bytes) -> None:
        if self.watermarks:
            self._time += 1_000_000
            self.source.push(WATERMARK(self._time))
        self.source.push(*records)

    def append_partial(self, head: bytes) -> None:
        raise NotImplementedError("scripted records are always complete")

    def finish_partial(self, rest: bytes) -> None:
        raise NotImplementedError("scripted records are always complete")

    def truncate(self) -> None:
        self.source.lines.clear()


@dataclass(frozen=True)
class Case:
    """One implementation under the contract: how to make it, and what it supports."""

    id: str
    make: Callable[[Path], tuple[Source, Writer]]
    partial_records: bool = True
    """Whether a record can be half-written (files), so ``final`` matters."""


def _jsonl_file(tmp: Path) -> tuple[Source, Writer]:
    path = tmp / "changes.jsonl"
    return JsonlSource(path), FilesWriter(path)


def _jsonl_dir(tmp: Path) -> tuple[Source, Writer]:
    folder = tmp / "in"
    folder.mkdir()
    return JsonlSource(folder), FilesWriter(folder / "a.jsonl", folder / "b.jsonl")


def _multi(tmp: Path) -> tuple[Source, Writer]:
    (tmp / "replay").mkdir()
    source = MultiSource([JsonlSource(tmp / "in.jsonl"), JsonlSource(tmp / "replay")])
    return source, FilesWriter(tmp / "in.jsonl", tmp / "replay" / "fixed.jsonl")


def _scripted(tmp: Path) -> tuple[Source, Writer]:
    source = ScriptedSource("p0")
    return source, ScriptWriter(source)


def _scripted_watermarks(tmp: Path) -> tuple[Source, Writer]:
    source = ScriptedSource("p0")
    return source, ScriptWriter(source, watermarks=True)


def _redis(tmp: Path) -> tuple[Source, Writer]:
    from tests.sources.test_redis_streams import make_redis_case

    return make_redis_case(tmp)


CASES = [
    Case("jsonl-file", _jsonl_file),
    Case("jsonl-dir", _jsonl_dir),
    Case("multi", _multi),
    Case("scripted", _scripted, partial_records=False),
    Case("scripted-watermarks", _scripted_watermarks, partial_records=False),
    Case("redis", _redis, partial_records=False),
]
"""Every log-shaped Source implementation, one line each."""

OWN_SUITES: dict[str, str] = {
    "streamrag.sources.nats.NatsSource": "tests/sources/test_nats.py: delivery is "
    "asynchronous (a poll right after a publish may be empty) and a durable consumer is "
    "state shared by every reader of one spec, so two readers of one spec are not independent",
    "streamrag.sources.folder.FolderSource": "tests/sources/test_folder.py: a record is a "
    "whole file version (a header line and the file's bytes), not an appended line; a file "
    "replaced by less is a new version and an emptied folder is deletes, never a SourceError; "
    "files are read once settled (an injected clock)",
    "streamrag.sources.kafka.KafkaSource": "tests/sources/test_kafka.py: records are "
    "fetched asynchronously and partitions are assigned only once the group has formed, "
    "so a poll right after a write may be empty; there are no partial records",
    "streamrag.sources.postgres.PostgresSource": "tests/sources/test_postgres.py: records "
    "are Debezium envelopes built from rows, not the bytes written; a snapshot cut short is "
    "read again in a new generation by design; replication arrives asynchronously",
}
"""Sources that are not a plain log of the bytes written, and the suite that holds them to
the same properties (offsets strictly rising, identical offsets on redelivery, the exact
rest after a resume, acknowledgement only after a commit) against their real system."""

ALL = [pytest.param(c, id=c.id) for c in CASES]
PARTIAL = [pytest.param(c, id=c.id) for c in CASES if c.partial_records]


# -- helpers ------------------------------------------------------------------------

Read = list[tuple[str, int, bytes]]
"""Records as read: (partition, offset, line)."""


def _records(n: int, start: int = 0) -> list[bytes]:
    """Distinct change lines of varied length."""
    return [
        b'{"doc_id": "d%d", "event_time": %d, "text": "%s"}' % (i, i, b"w " * (i % 9))
        for i in range(start, start + n)
    ]


def _flat(batches: list[RawBatch]) -> Read:
    return [
        (b.source, o, line) for b in batches for o, line in zip(b.offsets, b.lines, strict=True)
    ]


def _by_partition(read: Read) -> dict[str, list[tuple[int, bytes]]]:
    out: dict[str, list[tuple[int, bytes]]] = {}
    for part, offset, line in read:
        out.setdefault(part, []).append((offset, line))
    return out


def _drain(
    reader: SourceReader, max_bytes: int = 1 << 20, *, final: bool = False
) -> list[list[RawBatch]]:
    """Poll until a poll returns nothing; the batches of each poll."""
    polls: list[list[RawBatch]] = []
    for _ in range(10_000):
        got = reader.poll(max_bytes, final=final)
        if not got:
            return polls
        polls.append(got)
    raise AssertionError("poll never returned [] on a source nobody writes to")


def _lines(polls: list[list[RawBatch]]) -> list[bytes]:
    return [line for p in polls for b in p for line in b.lines]


def _in_thread(call: Callable[[], Any], seconds: float = 10.0) -> Any:
    """Run ``call`` and fail if it has not returned within ``seconds``: it blocked."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the call blocked for more than {seconds} s"
    return result[0]


# -- the contract -----------------------------------------------------------------


def test_every_source_implementation_has_a_case(tmp_path: Path) -> None:
    """A new Source class anywhere in streamrag.sources (or the test kit) needs a case."""
    modules = [streamrag.testing]
    for info in pkgutil.walk_packages(streamrag.sources.__path__, "streamrag.sources."):
        modules.append(importlib.import_module(info.name))
    found = {
        cls
        for module in modules
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__
        and callable(getattr(cls, "build", None))
        and not getattr(cls, "_is_protocol", False)
    }
    covered = {f"{c.__module__}.{c.__qualname__}" for c in found} & set(OWN_SUITES)
    for suite in OWN_SUITES.values():
        assert (ROOT / suite.split(":")[0]).exists(), suite
    for case in CASES:
        (tmp_path / case.id).mkdir()
        kind = type(case.make(tmp_path / case.id)[0])
        covered.add(f"{kind.__module__}.{kind.__qualname__}")
    names = {f"{c.__module__}.{c.__qualname__}" for c in found}
    assert names - covered == set(), f"add a Case to CASES for {sorted(names - covered)}"


@pytest.mark.parametrize("case", ALL)
def test_is_a_documented_picklable_spec(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(3))
    assert isinstance(source, Source)
    assert type(source).__doc__
    reader = source.build()
    assert isinstance(reader, SourceReader)
    assert type(reader).__doc__
    for method in ("poll", "snapshot", "backlog_bytes", "close"):
        assert getattr(type(reader), method).__doc__, f"{type(reader).__name__}.{method}"
    clone = pickle.loads(pickle.dumps(source))
    assert clone == source
    assert _flat(clone.build().poll(1 << 20)) == _flat(reader.poll(1 << 20))


@pytest.mark.parametrize("case", ALL)
def test_reads_every_record_once_with_offsets_moving_forward(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    written = _records(40)
    writer.append(*written[:25])
    writer.append(*written[25:])
    reader = source.build()
    ends: dict[str, int] = {}
    snapshots = [reader.snapshot()]
    read: Read = []
    while batches := reader.poll(64):
        for b in batches:
            assert len(b.lines) == len(b.offsets)
            assert b.lines or b.watermark is not None, "an empty batch says nothing"
            assert all(isinstance(x, bytes) and b"\n" not in x for x in b.lines)
            assert b.offsets == sorted(set(b.offsets)), "offsets rise within a batch"
            if b.offsets:
                assert b.offsets[0] >= ends.get(b.source, 0), "a batch starts where the last ended"
                assert b.end_offset > b.offsets[-1]
            assert b.end_offset >= ends.get(b.source, 0)
            ends[b.source] = b.end_offset
        read += _flat(batches)
        snap = reader.snapshot()
        for part, end in ends.items():
            assert snap[part] >= end, "the snapshot covers what was returned"
        for part, off in snapshots[-1].items():
            assert snap.get(part, off) >= off, f"{part} moved back"
        snapshots.append(snap)
    lines = [line for _, _, line in read]
    assert sorted(lines) == sorted(written), "every record, once"
    assert len({(p, o) for p, o, _ in read}) == len(read), "one offset, one record"
    for part, records in _by_partition(read).items():
        offsets = [o for o, _ in records]
        assert offsets == sorted(set(offsets)), f"offsets of {part} only move forward"


@pytest.mark.parametrize("case", ALL)
def test_resume_from_any_snapshot_returns_exactly_the_rest(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(30))
    reader = source.build()
    cuts: list[tuple[dict[str, int], int]] = [(reader.snapshot(), 0)]
    read: Read = []
    while batches := reader.poll(100):
        read += _flat(batches)
        cuts.append((reader.snapshot(), len(read)))
    assert len(cuts) > 3, "the budget should have cut the input into several polls"
    for snap, upto in cuts:
        stored = json.loads(json.dumps(snap))  # a cursor is stored as data
        resumed = source.build(stored)
        assert resumed.snapshot() == snap, "a reader that has not read reports its start"
        rest: Read = [r for batches in _drain(resumed, 100) for r in _flat(batches)]
        assert _by_partition(rest) == _by_partition(read[upto:]), f"resumed at {snap}"
    # Records written after the last snapshot come once, to the live and the resumed reader.
    last = reader.snapshot()
    writer.append(*_records(5, start=100))
    live = _lines(_drain(reader))
    again = _lines(_drain(source.build(last)))
    assert sorted(live) == sorted(again) == sorted(_records(5, start=100))


@pytest.mark.parametrize("case", ALL)
def test_snapshot_is_a_copy(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(4))
    reader = source.build()
    reader.poll(1 << 20)
    snap = reader.snapshot()
    before = dict(snap)
    for part in snap:
        snap[part] = 0
    assert reader.snapshot() == before


@pytest.mark.parametrize("case", PARTIAL)
@pytest.mark.parametrize("max_bytes", [1, 1 << 20])
def test_a_last_record_without_newline_is_returned_only_when_final(
    case: Case, max_bytes: int, tmp_path: Path
) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(3))
    writer.append_partial(b'{"doc_id": "tail", "event_time": 9')
    reader = source.build()
    assert sorted(_lines(_drain(reader))) == sorted(_records(3))
    assert reader.poll(1 << 20) == [], "a half-written record is not read early"
    assert reader.backlog_bytes() > 0, "but it is counted as not yet read"
    assert _lines([reader.poll(max_bytes, final=True)]) == [b'{"doc_id": "tail", "event_time": 9']
    assert reader.backlog_bytes() == 0
    assert reader.poll(1 << 20, final=True) == []
    # Not final, the record comes once its writer finishes it, whole.
    (tmp_path / "second").mkdir()
    source2, writer2 = case.make(tmp_path / "second")
    writer2.append(*_records(3))
    writer2.append_partial(b'{"doc_id": "tail", ')
    reader2 = source2.build()
    _drain(reader2)
    writer2.finish_partial(b'"event_time": 9}')
    assert _lines(_drain(reader2)) == [b'{"doc_id": "tail", "event_time": 9}']


@pytest.mark.parametrize("case", ALL)
def test_final_changes_nothing_for_complete_records(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(12))
    plain, final = source.build(), source.build()
    assert [_flat(p) for p in _drain(plain, 80)] == [
        _flat(p) for p in _drain(final, 80, final=True)
    ]
    assert plain.snapshot() == final.snapshot()


@pytest.mark.parametrize("case", ALL)
@pytest.mark.parametrize("max_bytes", [1, 50, 300])
def test_max_bytes_bounds_each_poll_and_every_poll_makes_progress(
    case: Case, max_bytes: int, tmp_path: Path
) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(20))
    reader = source.build()
    total = 0
    while reader.backlog_bytes() > 0:
        sizes = [len(x) for b in reader.poll(max_bytes) for x in b.lines]
        assert sizes, "a poll with data available returns at least one record"
        assert sum(sizes[:-1]) < max_bytes, "only the last record of a poll may overshoot"
        if max_bytes == 1:
            assert len(sizes) == 1
        total += len(sizes)
    assert total == 20


@pytest.mark.parametrize("case", ALL)
def test_poll_never_blocks(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    reader = source.build()
    assert _in_thread(lambda: reader.poll(1 << 20)) == [], "nothing written yet"
    writer.append(*_records(2))
    assert len(_lines([_in_thread(lambda: reader.poll(1 << 20))])) == 2
    assert _in_thread(lambda: reader.poll(1 << 20)) == [], "caught up"
    if case.partial_records:
        writer.append_partial(b'{"doc_id": ')
        assert _in_thread(lambda: reader.poll(1 << 20)) == [], "a record half-written"


@pytest.mark.parametrize("case", ALL)
def test_backlog_counts_the_bytes_not_yet_returned(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    reader = source.build()
    assert reader.backlog_bytes() == 0
    written = _records(15)
    writer.append(*written)
    left = sum(len(x) for x in written)
    backlog = reader.backlog_bytes()
    assert backlog >= left
    while got := reader.poll(60):
        left -= sum(len(x) for x in _lines([got]))
        now = reader.backlog_bytes()
        assert left <= now <= backlog, "the backlog shrinks as records are returned"
        backlog = now
    assert left == 0
    assert reader.backlog_bytes() == 0


@pytest.mark.parametrize("case", ALL)
def test_tails_records_appended_after_catching_up(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    reader = source.build()
    for round_ in range(3):
        batch = _records(3, start=10 * round_)
        writer.append(*batch)
        assert sorted(_lines(_drain(reader))) == sorted(batch)


@pytest.mark.parametrize("case", ALL)
def test_readers_of_one_spec_are_independent(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    writer.append(*_records(6))
    a, b = source.build(), source.build()
    first = _lines(_drain(a))
    a.close()
    a.close()  # closing twice is harmless
    assert _lines(_drain(b)) == first
    assert b.snapshot() == a.snapshot()


@pytest.mark.parametrize("case", ALL)
def test_resume_past_the_data_is_a_source_error(case: Case, tmp_path: Path) -> None:
    """The input was replaced by a shorter one: say so, never skip silently."""
    source, writer = case.make(tmp_path)
    writer.append(*_records(5))
    reader = source.build()
    _drain(reader)
    snap = reader.snapshot()
    writer.truncate()
    with pytest.raises(SourceError):
        source.build(snap).poll(1 << 20)


@pytest.mark.parametrize("case", ALL)
def test_watermarks_never_go_backwards(case: Case, tmp_path: Path) -> None:
    source, writer = case.make(tmp_path)
    for round_ in range(4):
        writer.append(*_records(5, start=10 * round_))
    reader = source.build()
    seen: dict[str, int] = {}
    for batches in _drain(reader, 70):
        for b in batches:
            if b.watermark is not None:
                assert b.watermark >= seen.get(b.source, b.watermark)
                seen[b.source] = b.watermark
