"""The folder source at the reader level: file versions, deletes, settling, restarts, wake-ups.

Time is a :class:`ManualClock` started at the real time (file times are real);
a test moves it past ``settle_ms`` instead of sleeping. Waiting for the
file-system watch to report a real write is a deadline wait on an event.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamrag.config import FolderSourceSettings
from streamrag.sources import JsonlSource
from streamrag.sources.base import RawBatch, ReportsHealth, Wakes
from streamrag.sources.folder import (
    NS_PER_STAMP,
    FileHeader,
    FolderReader,
    FolderSource,
    decode_record,
)
from streamrag.testing import ManualClock

pytestmark = pytest.mark.timeout(60)

SETTLE_MS = 500


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(time.time_ns() // 1000)


def _source(folder: Path, clock: ManualClock, **kw: Any) -> FolderSource:
    kw.setdefault("watch", False)
    return FolderSource("docs", folder, settle_ms=SETTLE_MS, clock=clock, **kw)


Read = list[tuple[str, int, FileHeader, bytes, int]]
"""(partition, offset, header, body, event time) of each record."""


def _flat(batches: list[RawBatch]) -> Read:
    out: Read = []
    for b in batches:
        assert b.decoder == "docs"
        assert b.keys is not None
        assert b.times is not None
        for line, off, key, t in zip(b.lines, b.offsets, b.keys, b.times, strict=True):
            header, body = decode_record(line)
            assert key == header.path.encode()
            assert b.source == f"folder:docs:{header.path}"
            assert b.end_offset == off + 1
            assert t is not None
            out.append((b.source, off, header, body, t))
    return out


def _drain(reader: FolderReader, clock: ManualClock | None = None) -> Read:
    """Poll until nothing comes (after moving past the settle time, if a clock is given)."""
    if clock is not None:
        clock.advance_ms(SETTLE_MS + 1000)
    out: Read = []
    for _ in range(1000):
        got = reader.poll(1 << 20)
        if not got:
            return out
        out += _flat(got)
    raise AssertionError("the reader never ran dry")


def _ops(read: Read) -> dict[str, str]:
    return {h.path: h.op for _, _, h, _, _ in read}


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


def _offset(path: Path) -> int:
    return 3 * (path.stat().st_ctime_ns // NS_PER_STAMP)


# -- reading --------------------------------------------------------------------------


def test_every_matching_file_once_with_its_path_as_key_and_ctime_offsets(
    tmp_path: Path, clock: ManualClock
) -> None:
    files = {
        "a.md": b"# A\n\nalpha",
        "notes/b.txt": b"beta",
        "web/c.html": b"<h1>C</h1>",
        "d.pdf": b"%PDF-1.4 not really",
        "e.docx": b"PK not really",
        "f.json": b'{"x": 1}',
        "deep/er/g.jsonl": b'{"y": 2}\n',
    }
    for rel, data in files.items():
        _write(tmp_path / rel, data)
    _write(tmp_path / ".hidden.md", "skip")  # excluded: hidden
    _write(tmp_path / ".git" / "HEAD.md", "skip")  # excluded folder
    _write(tmp_path / "x.md~", "skip")
    _write(tmp_path / "image.png", b"\x89PNG")  # not included
    reader = _source(tmp_path, clock).build()
    assert reader.poll(1 << 20) == [], "nothing has settled yet"
    assert reader.backlog_bytes() > 0
    read = _drain(reader, clock)
    assert {h.path: body for _, _, h, body, _ in read} == files
    for _part, off, header, _, t in read:
        path = tmp_path / header.path
        assert off == _offset(path)
        assert header.size == path.stat().st_size
        assert header.mtime_us == path.stat().st_mtime_ns // 1000
        assert t == header.mtime_us  # the modification time, for a first version
    assert reader.snapshot() == {p: off + 1 for p, off, *_ in read}
    assert _drain(reader, clock) == [], "an unchanged folder gives nothing more"
    assert reader.backlog_bytes() == 0


def test_a_change_is_an_upsert_a_removal_a_delete_a_rename_both(
    tmp_path: Path, clock: ManualClock
) -> None:
    a = _write(tmp_path / "a.md", "first")
    b = _write(tmp_path / "b.md", "bee")
    reader = _source(tmp_path, clock).build()
    first = {h.path: (off, t) for _, off, h, _, t in _drain(reader, clock)}
    clock.advance_ms(10)
    a.write_text("second version", encoding="utf-8")
    (tmp_path / "sub").mkdir()
    b.rename(tmp_path / "sub" / "b.md")
    read = _drain(reader, clock)
    got = {h.path: (off, h.op, body, t) for _, off, h, body, t in read}
    assert set(got) == {"a.md", "b.md", "sub/b.md"}
    off, op, body, t = got["a.md"]
    assert (op, body) == ("upsert", b"second version")
    assert off > first["a.md"][0]
    assert t > first["a.md"][1]
    off, op, body, t = got["b.md"]
    assert (op, body, off) == ("delete", b"", first["b.md"][0] + 1)
    assert t > first["b.md"][1], "the delete is newer than the version it removes"
    assert got["sub/b.md"][1:3] == ("upsert", b"bee")
    assert reader.snapshot()["folder:docs:b.md"] == first["b.md"][0] + 2
    (tmp_path / "sub" / "b.md").unlink()
    assert _ops(_drain(reader, clock)) == {"sub/b.md": "delete"}
    assert _drain(reader, clock) == [], "a delete is made once"


def test_an_old_modification_time_still_makes_the_newer_version(
    tmp_path: Path, clock: ManualClock
) -> None:
    """A restored backup (cp -p, rsync -t) brings an old mtime: it must still win."""
    a = _write(tmp_path / "a.md", "current")
    reader = _source(tmp_path, clock).build()
    [(_, _, _, _, t1)] = _drain(reader, clock)
    a.write_text("restored from last year", encoding="utf-8")
    year_ago = time.time() - 365 * 86400
    os.utime(a, (year_ago, year_ago))
    [(_, _, h, body, t2)] = _drain(reader, clock)
    assert body == b"restored from last year"
    assert abs(h.mtime_us - year_ago * 1e6) < 1e3, "the header keeps the real mtime"
    assert t2 > t1, "an event time below the held version would be dropped as stale"
    # Deleted, then back with an old mtime: newer than the delete.
    a.unlink()
    [(_, _, _, _, t_del)] = _drain(reader, clock)
    _write(a, "back again")
    os.utime(a, (year_ago, year_ago))
    [(_, _, h, _, t3)] = _drain(reader, clock)
    assert h.op == "upsert"
    assert t3 > t_del


def test_a_file_being_written_is_never_read_half_way(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "big.txt"
    with open(path, "wb") as fh:
        fh.write(b"first half ")
        fh.flush()
        reader = _source(tmp_path, clock).build()
        assert reader.poll(1 << 20) == [], "written just now: not settled"
        assert reader.health()["docs"]["unsettled"] == 1
        fh.write(b"second half")
    clock.advance_ms(SETTLE_MS + 100)
    [(_, _, _, body, _)] = _flat(reader.poll(1 << 20))
    assert body == b"first half second half"


def test_a_file_that_changes_during_the_read_is_read_again_later(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(tmp_path / "log.txt", "part one")
    reader = _source(tmp_path, clock).build()
    real = FolderReader._read_file
    writes: list[int] = []

    def racing(self: FolderReader, file: Path, key: Any) -> bytes | None:
        if not writes:  # a writer appends while the reader reads
            writes.append(1)
            with open(file, "ab") as fh:
                fh.write(b" and part two")
        return real(self, file, key)

    monkeypatch.setattr(FolderReader, "_read_file", racing)
    clock.advance_ms(SETTLE_MS + 100)
    assert reader.poll(1 << 20) == [], "the stat moved during the read: not read"
    assert reader.health()["docs"]["unsettled"] == 1
    read = _drain(reader, clock)
    assert [body for *_, body, _ in read] == [b"part one and part two"]
    assert path.read_bytes() == b"part one and part two"


def test_too_large_and_unreadable_files_become_records_the_decoder_refuses(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "huge.txt", "x" * 100)
    _write(tmp_path / "locked.txt", "secret")
    reader = _source(tmp_path, clock, max_file_bytes=50).build()
    real = FolderReader._read_file

    def denied(self: FolderReader, file: Path, key: Any) -> bytes | None:
        if file.name == "locked.txt":
            raise PermissionError(13, "Permission denied", str(file))
        return real(self, file, key)

    monkeypatch.setattr(FolderReader, "_read_file", denied)
    got = {h.path: (h, body) for _, _, h, body, _ in _drain(reader, clock)}
    assert got["huge.txt"][1] == b""
    assert "above max_file_bytes=50" in (got["huge.txt"][0].error or "")
    assert "PermissionError" in (got["locked.txt"][0].error or "")
    assert reader.health()["docs"]["file_errors"] == 1
    assert "locked.txt" in reader.health()["docs"]["last_error"]


# -- restarts -----------------------------------------------------------------------


def test_a_waiting_record_comes_back_at_the_same_offset(tmp_path: Path, clock: ManualClock) -> None:
    _write(tmp_path / "a.md", "alpha")
    _write(tmp_path / "b.md", "beta")
    source = _source(tmp_path, clock)
    first = _drain(source.build(), clock)
    by_path = {h.path: (part, off, body) for part, off, h, body, _ in first}
    # The cursor said: a.md committed, b.md read but waiting (the restart rewinds to it).
    part_a, off_a, _ = by_path["a.md"]
    part_b, off_b, body_b = by_path["b.md"]
    resumed = source.build({part_a: off_a + 1, part_b: off_b})
    assert resumed.snapshot() == {part_a: off_a + 1, part_b: off_b}
    again = _drain(resumed, clock)
    assert [(p, o, b) for p, o, _, b, _ in again] == [(part_b, off_b, body_b)]


def test_deletes_made_while_down_are_found_and_nothing_else_is_read_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    for name in ("keep", "gone", "waiting-gone", "changed"):
        _write(tmp_path / f"{name}.md", name)
    source = _source(tmp_path, clock)
    reader = source.build()
    read = {h.path: off for _, off, h, _, _ in _drain(reader, clock)}
    snap = reader.snapshot()
    snap["folder:docs:waiting-gone.md"] = read["waiting-gone.md"]  # was waiting at the crash
    # While the job is down:
    (tmp_path / "gone.md").unlink()
    (tmp_path / "waiting-gone.md").unlink()
    clock.advance_ms(10)
    _write(tmp_path / "changed.md", "changed while down")
    _write(tmp_path / "new.md", "new while down")
    resumed = source.build(snap)
    got = {h.path: (off, h.op, body) for _, off, h, body, _ in _drain(resumed, clock)}
    assert got["gone.md"] == (read["gone.md"] + 1, "delete", b"")
    # A waiting upsert whose file went: the index may hold an older version, so delete it.
    assert got["waiting-gone.md"] == (read["waiting-gone.md"] + 1, "delete", b"")
    assert got["changed.md"][1:] == ("upsert", b"changed while down")
    assert got["new.md"][1:] == ("upsert", b"new while down")
    assert "keep.md" not in got, "an unchanged file is the version the index has"
    # A deleted partition stays deleted across another restart.
    again = source.build(resumed.snapshot())
    assert _drain(again, clock) == []


def test_a_file_excluded_and_included_again_comes_back_after_its_delete(
    tmp_path: Path, clock: ManualClock
) -> None:
    _write(tmp_path / "a.txt", "text file")
    reader = _source(tmp_path, clock).build()
    [(_part, off, *_, t1)] = _drain(reader, clock)
    narrower = _source(tmp_path, clock, include=("*.md",)).build(reader.snapshot())
    [(_, off_del, h, _, t_del)] = _drain(narrower, clock)
    assert (h.op, off_del) == ("delete", off + 1)
    wider = _source(tmp_path, clock).build(narrower.snapshot())
    [(_, off_back, h, body, t_back)] = _drain(wider, clock)
    assert (h.op, body) == ("upsert", b"text file")
    assert off_back > off_del
    assert off_back % 3 == 0
    assert t_back > t_del > t1


def test_a_missing_folder_is_reported_and_deletes_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    folder = tmp_path / "docs"
    _write(folder / "a.md", "alpha")
    source = _source(folder, clock)
    reader = source.build()
    assert len(_drain(reader, clock)) == 1
    folder.rename(tmp_path / "elsewhere")
    assert _drain(reader, clock) == [], "an unmounted folder is not an empty one"
    health = reader.health()["docs"]
    assert health["connected"] is False
    assert "does not exist" in health["last_error"]
    # A restart while it is missing neither crashes nor deletes.
    assert _drain(source.build(reader.snapshot()), clock) == []
    (tmp_path / "elsewhere").rename(folder)
    clock.advance_ms(60_000)  # past the back-off
    assert _drain(reader, clock) == []
    assert reader.health()["docs"]["connected"] is True
    assert reader.health()["docs"]["files"] == 1


# -- the spec ---------------------------------------------------------------------------


def test_the_spec_comes_from_settings_owns_its_partitions_and_pickles(tmp_path: Path) -> None:
    settings = FolderSourceSettings(kind="folder", name="docs", path=tmp_path, settle_ms=7)
    spec = FolderSource.from_settings(settings)
    assert spec.settle_ms == 7
    assert spec.include == tuple(settings.include)
    assert spec.owns("folder:docs:a/b.md")
    assert not spec.owns("folder:docs2:a.md")
    assert not spec.owns(str(tmp_path / "a.md"))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert FolderSource.__doc__
    assert FolderReader.__doc__


# -- waking up ------------------------------------------------------------------------


def _wait(event: threading.Event, what: str, timeout: float = 10.0) -> None:
    assert event.wait(timeout), f"no wake-up within {timeout} s: {what}"


def test_the_watch_wakes_on_a_real_write_and_polls_stop_listing_the_folder(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "sub" / "a.md", "alpha")
    reader = _source(tmp_path, clock, watch=True).build()
    try:
        assert isinstance(reader, Wakes)
        assert isinstance(reader, ReportsHealth)
        event = threading.Event()
        reader.wake_on(event)
        assert len(_drain(reader, clock)) == 1
        listings: list[int] = []
        real = FolderReader._full_scan

        def counted(self: FolderReader, now: int) -> None:
            listings.append(now)
            real(self, now)

        monkeypatch.setattr(FolderReader, "_full_scan", counted)
        event.clear()
        _write(tmp_path / "sub" / "b.md", "beta")
        _wait(event, "a new file")
        event.clear()
        (tmp_path / "sub" / "a.md").unlink()
        _wait(event, "a removed file")
        read = _drain(reader, clock)
        deadline = time.monotonic() + 10
        while {"a.md", "b.md"} - {Path(h.path).name for _, _, h, _, _ in read}:
            assert time.monotonic() < deadline, f"events not seen: {read}"
            time.sleep(0.02)  # the watch batches events: wait for the rest with a deadline
            read += _drain(reader, clock)
        assert _ops(read) == {"sub/b.md": "upsert", "sub/a.md": "delete"}
        assert listings == [], "after the first listing only the reported paths are looked at"
        assert reader.health()["docs"]["watching"] is True
    finally:
        reader.close()


def test_a_folder_created_after_start_is_watched_once_it_appears(
    tmp_path: Path, clock: ManualClock
) -> None:
    folder = tmp_path / "later"
    reader = _source(folder, clock, watch=True).build()
    try:
        event = threading.Event()
        reader.wake_on(event)
        assert _drain(reader, clock) == []
        assert reader.health()["docs"]["last_error"]
        event.clear()
        _write(folder / "a.md", "alpha")
        _wait(event, "the folder appearing")
        deadline = time.monotonic() + 10
        read: Read = []
        while not read:
            assert time.monotonic() < deadline, "the new folder's file was never read"
            clock.advance_ms(60_000)  # past the back-off of the failed listings
            read = _drain(reader, clock)
            time.sleep(0.02)
        assert _ops(read) == {"a.md": "upsert"}
    finally:
        reader.close()


def test_the_jsonl_tailer_wakes_on_an_append(tmp_path: Path) -> None:
    path = tmp_path / "changes.jsonl"
    path.write_text("", encoding="utf-8")
    reader = JsonlSource(path).build()
    try:
        assert isinstance(reader, Wakes)
        event = threading.Event()
        reader.wake_on(event)
        event.clear()
        with open(path, "a", encoding="utf-8") as fh:
            fh.write('{"doc_id": "a", "event_time": 1, "text": "x"}\n')
        _wait(event, "an appended line")
        assert [b.lines for b in reader.poll(1 << 20)] == [
            [b'{"doc_id": "a", "event_time": 1, "text": "x"}']
        ]
    finally:
        reader.close()


def test_the_jsonl_tailer_of_a_folder_not_made_yet_wakes_when_it_appears(tmp_path: Path) -> None:
    folder = tmp_path / "push"
    reader = JsonlSource(folder).build()
    try:
        event = threading.Event()
        reader.wake_on(event)
        event.clear()
        folder.mkdir()
        _wait(event, "the folder appearing")
        event.clear()
        (folder / "a.jsonl").write_text('{"doc_id": "a"}\n', encoding="utf-8")
        _wait(event, "a file in the new folder")
    finally:
        reader.close()


def test_a_file_name_that_is_not_utf8_is_skipped_and_reported(
    tmp_path: Path, clock: ManualClock
) -> None:
    _write(tmp_path / "ok.md", "fine")
    fd = os.open(os.fsencode(tmp_path) + b"/caf\xe9.md", os.O_CREAT | os.O_WRONLY)
    os.write(fd, b"latin-1 name")
    os.close(fd)
    reader = _source(tmp_path, clock).build()
    assert _ops(_drain(reader, clock)) == {"ok.md": "upsert"}
    assert list(reader.snapshot()) == ["folder:docs:ok.md"], "no partition the cursor cannot hold"
    health = reader.health()["docs"]
    assert health["file_errors"] >= 1
    assert "caf" in health["last_error"]


def test_the_safety_net_listing_finds_what_the_watch_missed(
    tmp_path: Path, clock: ManualClock
) -> None:
    from streamrag.sources import folder as folder_module

    _write(tmp_path / "a.md", "alpha")
    reader = _source(tmp_path, clock, watch=True).build()
    try:
        assert len(_drain(reader, clock)) == 1
        watch = reader._watch
        assert watch is not None
        _write(tmp_path / "a.md", "changed, event lost")
        deadline = time.monotonic() + 10
        while not watch.take().paths:  # throw the events away, as an overflow would
            assert time.monotonic() < deadline, "the watch never reported the write"
            time.sleep(0.02)
        assert _drain(reader, clock) == [], "without the event nothing looks at the file"
        clock.advance_us(int(folder_module.RESCAN_S * 1e6))
        [(_, _, _, body, _)] = _drain(reader, clock)
        assert body == b"changed, event lost"
        # An overflow (or a failed watcher) asks for a listing at once.
        _write(tmp_path / "b.md", "beta")
        while not watch.take().paths:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        watch._changes.rescan = True
        assert _ops(_drain(reader, clock)) == {"b.md": "upsert"}
    finally:
        reader.close()


def test_the_watch_wakes_the_job_when_a_file_has_settled(
    tmp_path: Path, clock: ManualClock
) -> None:
    reader = _source(tmp_path, clock, watch=True).build()
    try:
        event = threading.Event()
        reader.wake_on(event)
        assert _drain(reader) == []
        event.clear()
        _write(tmp_path / "a.md", "alpha")
        _wait(event, "the write")
        event.clear()
        deadline = time.monotonic() + 10
        while not reader.health()["docs"]["unsettled"]:
            assert time.monotonic() < deadline, "the written file was never seen"
            assert reader.poll(1 << 20) == [], "just written: not settled"
            time.sleep(0.02)
        event.clear()
        cleared = time.monotonic()
        _wait(event, "the file settling (a wake at its settle time)")
        assert time.monotonic() - cleared > 0.2, "woken by the settle time, not by the write"
        clock.advance_ms(SETTLE_MS + 1000)  # the manual clock stood still meanwhile
        assert _ops(_flat(reader.poll(1 << 20))) == {"a.md": "upsert"}
    finally:
        reader.close()


def test_a_subfolder_that_cannot_be_listed_deletes_nothing(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "sub" / "a.md", "alpha")
    _write(tmp_path / "b.md", "beta")
    reader = _source(tmp_path, clock).build()
    assert len(_drain(reader, clock)) == 2
    real = os.scandir

    def denied(path: Any) -> Any:
        if Path(path).name == "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", denied)
    (tmp_path / "b.md").unlink()
    assert _ops(_drain(reader, clock)) == {"b.md": "delete"}, "only what is known gone"
    assert reader.health()["docs"]["files"] == 1
    assert "Permission denied" in reader.health()["docs"]["last_error"]


def test_a_folder_renamed_is_deletes_and_upserts_from_its_events_alone(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        _write(tmp_path / "sub" / "deeper" / f"{name}.md", name)
    _write(tmp_path / "top.md", "stays")
    reader = _source(tmp_path, clock, watch=True).build()
    try:
        assert len(_drain(reader, clock)) == 4
        listings: list[int] = []
        real = FolderReader._full_scan

        def counted(self: FolderReader, now: int) -> None:
            listings.append(now)
            real(self, now)

        monkeypatch.setattr(FolderReader, "_full_scan", counted)
        (tmp_path / "sub").rename(tmp_path / "moved")
        want = {f"sub/deeper/{n}.md": "delete" for n in "abc"}
        want.update({f"moved/deeper/{n}.md": "upsert" for n in "abc"})
        read: Read = []
        deadline = time.monotonic() + 10
        while _ops(read) != want:
            assert time.monotonic() < deadline, f"got {_ops(read)}"
            time.sleep(0.02)  # the watch batches events: wait for them with a deadline
            read += _drain(reader, clock)
        assert listings == [], "the folder was not listed again"
        assert reader.files() == sorted(["top.md", *(f"moved/deeper/{n}.md" for n in "abc")])
    finally:
        reader.close()
