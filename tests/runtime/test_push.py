"""Pushed changes: journaled before the answer, applied once, idempotent, bounded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from streamrag.config import load_settings
from streamrag.errors import OverloadedError, RequestError, StateError
from streamrag.ingest import Decoder
from streamrag.runtime.push import PushJournal
from streamrag.runtime.service import Service
from streamrag.sources.base import RawBatch
from streamrag.testing import ManualClock, ScriptedSource

T0 = 1_704_067_200_000_000


def _journal(path: Path, **kw: object) -> PushJournal:
    return PushJournal(path, decoder=Decoder(), clock=ManualClock(T0), **kw)  # type: ignore[arg-type]


def _service(tmp_path: Path, *, live: bool = False, **overrides: object) -> Service:
    """A hashing-embedder job; ``live`` ones run on the system clock (batch deadlines pass)."""
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "index.kind": "lsm",
            **overrides,
        },
        environ={},
    )
    return Service(settings, clock=None if live else ManualClock(T0))


def _docs(svc: Service) -> dict[str, str]:
    """Live documents as the index holds them: doc id -> text of the first chunk."""
    vec = svc.embed_many(["anything"])
    from streamrag.index.base import SearchFilter

    _, hits = svc.search_many(vec, 100, SearchFilter())
    return {h.doc_id: h.text for h in hits[0]}


def test_a_push_is_checked_whole_and_refused_whole(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    with pytest.raises(RequestError, match=r"2 of 3 changes cannot be taken, none was: change 1"):
        j.push([{"doc_id": "a", "text": "x"}, {"doc_id": "b"}, {"doc_id": " ", "text": "y"}])
    assert j.stats()["unread_bytes"] == 0  # nothing of it was journaled
    with pytest.raises(RequestError, match="at least one change"):
        j.push([])


def test_event_time_defaults_to_now_and_the_line_decodes_as_a_change(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    j.push([{"doc_id": "a", "text": "hello", "idempotency_key": "a1"}])
    files = sorted(tmp_path.glob("journal-*.jsonl"))
    line = files[0].read_bytes().rstrip(b"\n")
    changes, letters = Decoder().decode([RawBatch(str(files[0]), [line], [0], len(line) + 1)])
    assert not letters
    assert int(changes.event_times[0]) == T0


def test_an_idempotency_key_is_applied_once_also_after_a_restart(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    first = j.push([{"doc_id": "a", "text": "v1", "idempotency_key": "k"}])
    again = j.push(
        [{"doc_id": "a", "text": "v1", "idempotency_key": "k"}, {"doc_id": "b", "text": "v"}]
    )
    assert (first.accepted, again.accepted, again.duplicates) == (1, 1, 1)
    reopened = _journal(tmp_path)  # the keys are read back from the journal
    third = reopened.push([{"doc_id": "a", "text": "v1", "idempotency_key": "k"}])
    assert (third.accepted, third.duplicates) == (0, 1)
    lines = b"".join(p.read_bytes() for p in tmp_path.glob("journal-*.jsonl")).splitlines()
    assert len(lines) == 2


def test_a_full_journal_answers_overloaded_with_a_retry_time(tmp_path: Path) -> None:
    j = _journal(tmp_path, max_backlog_bytes=300)
    j.push([{"doc_id": f"d{i}", "text": "x" * 40} for i in range(3)])
    with pytest.raises(OverloadedError) as info:
        j.push([{"doc_id": f"e{i}", "text": "x" * 40} for i in range(3)])
    assert 1 <= info.value.retry_after_s <= 60
    reader = j.source.build()  # the pipeline reads it: room again
    assert sum(len(b) for b in reader.poll(1 << 20)) == 3
    assert j.push([{"doc_id": "e", "text": "x" * 40}]).accepted == 1


def test_a_push_is_durable_only_once_its_lines_are_committed_and_not_waiting(
    tmp_path: Path,
) -> None:
    epoch = [0]
    j = PushJournal(tmp_path, decoder=Decoder(), clock=ManualClock(T0), epoch=lambda: epoch[0])
    r = j.push([{"doc_id": "a", "text": "x"}, {"doc_id": "b", "text": "y"}])
    assert r.span is not None
    assert not r.committed
    name = r.span.file
    epoch[0] = 4
    j.acknowledge({name: r.span.end}, {name: [r.span.start]})  # the first line still waits
    assert j.wait_for(r, 0) is None
    epoch[0] = 5
    j.acknowledge({name: r.span.end}, {})
    assert j.wait_for(r, 0) == 5


def test_a_waiter_is_woken_by_the_commit(tmp_path: Path) -> None:
    j = PushJournal(tmp_path, decoder=Decoder(), clock=ManualClock(T0), epoch=lambda: 7)
    r = j.push([{"doc_id": "a", "text": "x"}])
    assert r.span is not None
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(j.wait_for(r, 30)))
    t.start()
    j.acknowledge({r.span.file: r.span.end}, {})
    t.join(30)
    assert got == [7]


def test_old_journal_files_go_once_committed(tmp_path: Path) -> None:
    j = _journal(tmp_path, rotate_bytes=200, keep_files=2)
    spans = [j.push([{"doc_id": f"d{i}", "text": "x" * 120}]).span for i in range(5)]
    assert len(list(tmp_path.glob("journal-*.jsonl"))) == 5
    positions = {s.file: s.end for s in spans if s is not None}
    j.acknowledge(dict(list(positions.items())[:2]), {})  # only the first two are committed
    assert len(list(tmp_path.glob("journal-*.jsonl"))) == 3
    j.acknowledge(positions, {})
    assert len(list(tmp_path.glob("journal-*.jsonl"))) == 2


def test_service_upsert_and_delete_say_the_epoch_that_shows_them(tmp_path: Path) -> None:
    svc = _service(tmp_path, live=True)
    svc.start()
    try:
        r = svc.upsert("kb-1", "reset the router by holding the button", wait_for_commit=True)
        assert r.committed
        assert r.epoch is not None
        assert svc.index.epoch >= r.epoch
        assert "kb-1" in _docs(svc)
        d = svc.delete("kb-1", wait_for_commit=True)
        assert d.committed
        assert d.epoch is not None
        assert d.epoch > r.epoch
        assert "kb-1" not in _docs(svc)
        st = svc.status()
        assert st["counts"]["ingested"] == st["counts"]["applied"] == 2
        assert st["sources"]["push"]["last_epoch"] == svc.index.epoch
    finally:
        svc.stop()


def test_journaled_changes_survive_a_crash_and_apply_once(tmp_path: Path) -> None:
    crashed = _service(tmp_path)
    crashed.push([{"doc_id": f"d{i}", "text": f"text {i}"} for i in range(20)])
    # The process dies here: nothing read, nothing committed, nothing stopped.
    svc = _service(tmp_path)
    svc.pipeline.run_until_caught_up()
    assert sorted(_docs(svc)) == sorted(f"d{i}" for i in range(20))
    assert svc.status()["counts"]["applied"] == 20
    svc.stop()
    again = _service(tmp_path)  # a clean restart reads nothing twice
    again.pipeline.run_until_caught_up()
    assert again.status()["counts"]["ingested"] == 20
    again.stop()


def test_ingest_takes_a_generator_and_an_async_generator(tmp_path: Path) -> None:
    svc = _service(tmp_path, live=True, **{"push.max_backlog_bytes": 4096})
    svc.start()

    async def agen() -> AsyncIterator[dict[str, object]]:
        for i in range(50):
            await asyncio.sleep(0)
            yield {"doc_id": f"a{i}", "text": f"async {i}"}

    try:
        # 600 changes through a 4 KiB journal bound: ingest waits out the 429s.
        r1 = svc.ingest({"doc_id": f"g{i}", "text": f"gen {i} " * 5} for i in range(600))
        r2 = svc.ingest(agen(), batch=7)
        assert (r1.accepted, r2.accepted) == (600, 50)
        assert r1.committed
        assert r2.committed
        assert svc.status()["counts"]["applied"] == 650
    finally:
        svc.stop()


def test_a_job_over_a_python_source_has_no_journal(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={"state_dir": str(tmp_path), "embedder.class": "hashing"}, environ={}
    )
    svc = Service(settings, source=ScriptedSource("s", []))
    with pytest.raises(StateError, match="no push journal"):
        svc.upsert("a", "b")


def test_many_versions_late_ones_and_a_hostile_change_in_concurrent_pushes(
    tmp_path: Path,
) -> None:
    """Real pushes: versions of one document out of order within a push, a refused push
    between good ones, and writers racing each other and a reader of the index."""
    svc = _service(tmp_path, live=True)
    svc.start()
    t0 = 1_704_067_200
    errors: list[BaseException] = []
    refused: list[int] = []

    def writer(w: int) -> None:
        try:
            for round_ in range(10):
                # Four versions of this writer's document in one push, newest second.
                times = [t0 + round_ * 10 + d for d in (1, 4, 2, 3)]
                svc.push(
                    [{"doc_id": f"w{w}", "text": f"w{w} at {t}", "event_time": t} for t in times]
                )
                try:
                    svc.push([{"doc_id": f"x{w}", "text": "ok"}, {"doc_id": "", "op": "upsert"}])
                except RequestError:
                    refused.append(w)
        except BaseException as exc:
            errors.append(exc)

    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            _docs(svc)

    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    query = threading.Thread(target=reader, args=(stop,))
    query.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    last = svc.push([{"doc_id": "end", "text": "the end"}], wait_for_commit=True)
    stop.set()
    query.join(30)
    try:
        assert not errors
        assert len(refused) == 40  # every push with a bad change was refused whole
        assert last.committed
        docs = _docs(svc)
        for w in range(4):  # the newest version of the last round, whatever the order
            assert docs[f"w{w}"] == f"w{w} at {t0 + 94}"
            assert f"x{w}" not in docs  # its push was refused, so never journaled
        st = svc.status()["counts"]
        assert st["ingested"] == 4 * 10 * 4 + 1
        assert st["ingested"] == st["applied"] + st["dead_lettered"] + st["pending"]
        assert st["dead_lettered"] == 0
    finally:
        svc.stop()
