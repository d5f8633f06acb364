"""Model migration: a second generation is built live, switched to at an epoch, rolled back."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest

from streamrag.config import load_settings
from streamrag.errors import StateError
from streamrag.index.base import SearchFilter
from streamrag.runtime.generations import BOOK_NAME, Book
from streamrag.runtime.service import Service
from streamrag.testing import ManualClock
from tests.runtime.embedders import Gated

T0 = 1_704_067_200_000_000
OLD = "hashing-blake2b-v1-d64"
NEW = "hashing-blake2b-v1-d48"


def _service(state: Path) -> Service:
    settings = load_settings(
        overrides={
            "source.path": str(state.parent / "none.jsonl"),
            "state_dir": str(state),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 64},
            "index.kind": "lsm",
        },
        environ={},
    )
    return Service(settings, clock=ManualClock(T0))


def _commit(svc: Service) -> None:
    svc.pipeline.run_until_caught_up(final=False)


def _push(svc: Service, changes: list[dict[str, object]]) -> None:
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    clock.advance_us(1_000_000)  # each push a second later: versions are ordered
    svc.push(changes)
    _commit(svc)


def _read(svc: Service, query: str = "document") -> tuple[int, int, list[str], set[str]]:
    """Generation, query vector length, doc ids and embedder versions of one query."""
    gen = svc.pin()
    vec = gen.embed_many([query])
    _, hits = gen.search_many(vec, 200, SearchFilter())
    return (
        gen.number,
        vec.shape[1],
        [h.doc_id for h in hits[0]],
        {h.embedder_version for h in hits[0]},
    )


def _current(svc: Service, number: int) -> dict[str, list[str]]:
    """Each current document of generation ``number``: its chunk texts in order."""
    gen = svc.generation(number)
    assert gen is not None
    docs: dict[str, list[tuple[int, str]]] = {}
    for hit, vec in gen.index.export():
        state = gen.index.doc_state(hit.tenant, hit.doc_id)
        assert state is not None
        if state.deleted or state.version != (hit.event_time, hit.offset):
            continue
        assert vec.shape == (gen.embedder.dim,)
        assert np.isclose(np.linalg.norm(vec), 1.0, atol=1e-4)
        docs.setdefault(hit.doc_id, []).append((hit.position, hit.text))
    return {d: [t for _, t in sorted(chunks)] for d, chunks in docs.items()}


def test_a_live_stream_flows_while_a_second_embedder_reindexes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    svc = _service(state)
    _push(svc, [{"doc_id": f"d{i}", "text": f"document {i} version one"} for i in range(40)])
    assert _read(svc)[:2] == (1, 64)

    gate = uuid.uuid4().hex
    spec = {"class": "tests.runtime.embedders:Gated", "args": {"dim": 48, "gate": gate}}
    svc.reindexer.start(spec, switch=False)
    assert Gated.ENTERED[gate].wait(30)  # the backfill holds its first batch, not committed

    # The stream keeps flowing: both generations get every change.
    _push(svc, [{"doc_id": "d0", "text": "document 0 version two"}])
    # Many versions of one document in one micro-batch, out of order, one of them late
    # (older than what the backfill is copying): the newest wins in both generations.
    _push(
        svc,
        [
            {
                "doc_id": "d5",
                "text": "document 5 version three",
                "event_time": "2024-01-02T00:00:00Z",
            },
            {"doc_id": "d5", "text": "document 5 late", "event_time": "2023-12-31T00:00:00Z"},
            {
                "doc_id": "d5",
                "text": "document 5 version two",
                "event_time": "2024-01-01T12:00:00Z",
            },
        ],
    )
    _push(svc, [{"doc_id": "d1", "op": "delete"}, {"doc_id": "d40", "text": "document 40 new"}])
    gen, dim, ids, made_by = _read(svc)
    assert (gen, dim, made_by) == (1, 64, {OLD})  # before the switch: generation 1 only
    assert "d1" not in ids
    assert "d40" in ids
    with pytest.raises(StateError, match="still being filled"):
        svc.reindexer.switch()

    Gated.GATES[gate].set()
    fill = svc.reindexer.backfill
    assert fill is not None
    fill.join(30)
    progress = svc.reindexer.status()["building"]["backfill"]
    assert progress["done"]
    assert progress["docs_total"] == 40
    assert _read(svc)[0] == 1  # filled, not switched (switch: false)

    status = svc.reindexer.switch()
    assert status["serving"] == 2
    gen, dim, ids, made_by = _read(svc)
    assert (gen, dim, made_by) == (2, 48, {NEW})  # after it: generation 2 only

    # Nothing lost or doubled: generation 2 holds what generation 1 holds, chunk for chunk.
    want = {f"d{i}": [f"document {i} version one"] for i in range(2, 40)}
    want |= {"d0": ["document 0 version two"], "d40": ["document 40 new"]}
    want["d5"] = ["document 5 version three"]
    assert _current(svc, 2) == want
    assert _current(svc, 1) == want

    # After the switch, the previous generation still receives every change...
    _push(svc, [{"doc_id": "d2", "text": "document 2 version two"}])
    want["d2"] = ["document 2 version two"]
    assert _current(svc, 1) == want == _current(svc, 2)
    # ...so a rollback is immediate and complete.
    svc.reindexer.rollback()
    gen, dim, ids, made_by = _read(svc)
    assert (gen, dim, made_by) == (1, 64, {OLD})
    book = Book.load(state)
    assert book is not None
    assert [(e.number, e.state) for e in book.entries] == [(1, "serving"), (2, "previous")]
    assert [s["to"] for s in book.switches] == [2, 1]
    svc.stop()

    # A restart serves what the book says, and keeps mirroring into the previous generation.
    again = _service(state)
    assert again.pin().number == 1
    _push(again, [{"doc_id": "d3", "op": "delete"}])
    del want["d3"]
    assert _current(again, 1) == want == _current(again, 2)
    with pytest.raises(StateError, match="is serving queries"):
        again.reindexer.drop(1)
    again.reindexer.drop(2)
    assert again.generation(2) is None
    assert not (state / "generations" / "2").exists()
    again.stop()


def test_a_damaged_book_is_refused_with_what_to_do(tmp_path: Path) -> None:
    state = tmp_path / "state"
    svc = _service(state)
    svc.book_for_write()
    svc.stop()
    path = state / BOOK_NAME
    path.write_text(path.read_text().replace('"serving"', '"previous"', 1))
    with pytest.raises(Exception, match="checksum does not match"):
        _service(state)


def test_a_generation_needs_the_persistent_lsm_index(tmp_path: Path) -> None:
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "index.kind": "exact",
        },
        environ={},
    )
    svc = Service(settings, clock=ManualClock(T0))
    with pytest.raises(Exception, match="persistent LSM index"):
        svc.reindexer.start({"class": "hashing", "args": {"dim": 32}})
