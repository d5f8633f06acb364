"""as_of, epoch, metadata filters and rollback: on the index, over HTTP and from the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from streamrag.changes import Op
from streamrag.cli import app as cli_app
from streamrag.config import load_settings
from streamrag.errors import IndexStoreError, QueryError
from streamrag.index import ExactIndex, LsmIndex, LsmSpec, MetaPredicate, SearchFilter
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.testing import change_line

from .reference import Change, make_batch, unit

DIM = 8
DAY = 86_400_000_000


def _docs(index: LsmIndex) -> None:
    index.commit(
        make_batch(
            [Change("a", Op.UPSERT, 10 * DAY, 1, (1,)), Change("b", Op.UPSERT, 10 * DAY, 2, (2,))],
            DIM,
        )
    )
    index.commit(make_batch([Change("a", Op.UPSERT, 12 * DAY, 3, (3,))], DIM))
    index.commit(make_batch([Change("b", Op.DELETE, 13 * DAY, 4)], DIM))


def _ids(index: LsmIndex, flt: SearchFilter) -> tuple[int, list[str]]:
    epoch, hits = index.search_many(unit(1, DIM)[None], 10, flt)
    return epoch, sorted(f"{h.doc_id}@{h.epoch}" for h in hits[0])


def test_as_of_and_epoch_reads() -> None:
    index = LsmIndex(DIM, LsmSpec(retention_us=5 * DAY))
    _docs(index)
    assert _ids(index, SearchFilter()) == (3, ["a@2"])
    assert _ids(index, SearchFilter(as_of_us=11 * DAY)) == (3, ["a@1", "b@1"])
    assert _ids(index, SearchFilter(as_of_us=12 * DAY)) == (3, ["a@2", "b@1"])
    assert _ids(index, SearchFilter(epoch=1)) == (1, ["a@1", "b@1"])
    assert _ids(index, SearchFilter(epoch=2, as_of_us=11 * DAY)) == (2, ["a@1", "b@1"])
    with pytest.raises(QueryError, match="before the retained history"):
        index.search_many(unit(1, DIM)[None], 3, SearchFilter(as_of_us=7 * DAY))
    with pytest.raises(QueryError, match="not committed yet"):
        index.search_many(unit(1, DIM)[None], 3, SearchFilter(epoch=9))


def test_time_range_prunes_segments_and_still_returns_k() -> None:
    index = LsmIndex(DIM, LsmSpec(seal_rows=4))
    changes = [Change(f"d{i}", Op.UPSERT, (i % 30) * DAY, i, (100 + i,)) for i in range(300)]
    index.commit(make_batch(changes, DIM))
    assert index.health().segments >= 30
    flt = SearchFilter(start_us=5 * DAY, end_us=6 * DAY)
    _, hits = index.search_many(unit(7, DIM)[None], 10, flt)
    assert len(hits[0]) == 10
    assert all(5 * DAY <= h.event_time < 6 * DAY for h in hits[0])


def _versions(index: LsmIndex, flt: SearchFilter, doc: str = "a") -> list[tuple[int, int]]:
    """(event time in days, committed epoch) of each hit on ``doc``."""
    _, hits = index.search_many(unit(1, DIM)[None], 10, flt)
    return sorted((h.event_time // DAY, h.epoch) for h in hits[0] if h.doc_id == doc)


def test_an_edit_beaten_in_its_own_micro_batch_is_still_history() -> None:
    """A page edited on 2015-10-28 and again on 2015-12-14: as of 2015-11-20, the October text."""
    oct28, dec14, nov20 = 16_736, 16_783, 16_759  # days since 1970
    index = LsmIndex(DIM, LsmSpec(retention_us=3650 * DAY))
    index.commit(make_batch([Change("a", Op.UPSERT, 16_000 * DAY, 1, (1,))], DIM))
    result = index.commit(
        make_batch(
            [
                Change("a", Op.UPSERT, dec14 * DAY, 3, (3,)),
                Change("a", Op.UPSERT, oct28 * DAY, 2, (2,)),
            ],
            DIM,
        )
    )
    assert (result.applied_docs, result.past_docs, result.stale_docs) == (1, 1, 0)
    assert _versions(index, SearchFilter(as_of_us=nov20 * DAY)) == [(oct28, 2)]
    assert _versions(index, SearchFilter()) == [(dec14, 2)]
    assert _versions(index, SearchFilter(as_of_us=nov20 * DAY, epoch=1)) == [(16_000, 1)]


def test_a_late_change_splits_an_ended_interval_and_survives_a_restart(tmp_path: Path) -> None:
    spec = LsmSpec(retention_us=1000 * DAY, checkpoint_every=100)
    index = LsmIndex(DIM, spec, path=tmp_path / "idx")
    index.commit(make_batch([Change("a", Op.UPSERT, 10 * DAY, 1, (1, 2))], DIM))
    index.commit(make_batch([Change("a", Op.UPSERT, 30 * DAY, 2, (3,))], DIM))
    # Arrives last, between the two: the day-10 version now ends at day 20, not 30.
    index.commit(make_batch([Change("a", Op.UPSERT, 20 * DAY, 3, (4,))], DIM))
    # A delete arrives late too, inside the day-20 version's interval.
    index.commit(make_batch([Change("a", Op.DELETE, 25 * DAY, 4)], DIM))

    def check(ix: LsmIndex) -> None:
        assert _versions(ix, SearchFilter(as_of_us=15 * DAY)) == [(10, 1), (10, 1)]
        assert _versions(ix, SearchFilter(as_of_us=22 * DAY)) == [(20, 3)]
        assert _versions(ix, SearchFilter(as_of_us=27 * DAY)) == []
        assert _versions(ix, SearchFilter(as_of_us=31 * DAY)) == [(30, 2)]
        # What the index knew at epoch 2, before the late changes arrived.
        assert _versions(ix, SearchFilter(as_of_us=22 * DAY, epoch=2)) == [(10, 1), (10, 1)]
        assert _versions(ix, SearchFilter(as_of_us=27 * DAY, epoch=3)) == [(20, 3)]
        assert _versions(ix, SearchFilter()) == [(30, 2)]
        history = [(s.version[0] // DAY, s.deleted) for s in ix.doc_history("default", "a")]
        assert history == [(10, False), (20, False), (25, True), (30, False)]

    check(index)
    # 4 chunk rows, then copies with earlier ends: the day-10 rows (2) and the day-20 row.
    assert index.health().rows == 7
    index.abandon()  # a crash: the log replays the commits
    again = LsmIndex(DIM, spec, path=tmp_path / "idx")
    check(again)
    again.close()  # a clean stop: the checkpoint holds the stamps and the copy
    third = LsmIndex(DIM, spec, path=tmp_path / "idx")
    check(third)
    third.close()


def test_a_change_that_would_end_before_the_history_floor_is_not_kept() -> None:
    index = LsmIndex(DIM, LsmSpec(retention_us=50))
    index.commit(make_batch([Change("a", Op.UPSERT, 100, 1, (1,))], DIM))
    index.commit(make_batch([Change("a", Op.UPSERT, 200, 2, (2,))], DIM))  # floor: 150
    assert index.wants("default", "a", 120, 3)  # its interval [120, 200) reaches past 150
    assert not index.wants("default", "a", 60, 4)  # [60, 100): nobody can read it
    assert not index.wants("default", "a", 200, 2)  # held already
    result = index.commit(make_batch([Change("a", Op.UPSERT, 60, 4, (4,))], DIM))
    assert (result.past_docs, result.stale_docs, result.chunks_added) == (0, 1, 0)


def test_current_only_history_refuses_as_of_and_keeps_epochs() -> None:
    index = LsmIndex(DIM, LsmSpec(history=False))
    index.commit(make_batch([Change("a", Op.UPSERT, 30, 1, (1,))], DIM))
    result = index.commit(make_batch([Change("a", Op.UPSERT, 20, 2, (2,))], DIM))
    assert (result.applied_docs, result.past_docs, result.stale_docs) == (0, 0, 1)
    assert not index.wants("default", "a", 25, 3)
    with pytest.raises(QueryError, match=r"index\.history"):
        index.search_many(unit(1, DIM)[None], 3, SearchFilter(as_of_us=25))
    assert _versions(index, SearchFilter(epoch=1)) == [(0, 1)]


def test_metadata_predicates() -> None:
    index = LsmIndex(DIM)
    index.commit(
        make_batch(
            [
                Change("a", Op.UPSERT, 1, 1, (1,), metadata={"lang": "en", "year": 2021}),
                Change("b", Op.UPSERT, 1, 2, (2,), metadata={"lang": "de", "year": 2024}),
                Change("c", Op.UPSERT, 1, 3, (3,), metadata={"lang": "en", "year": True}),
            ],
            DIM,
        )
    )
    en = SearchFilter(metadata=(MetaPredicate("lang", values=frozenset({"en"})),))
    recent = SearchFilter(metadata=(MetaPredicate("year", gte=2022),))
    assert _ids(index, en)[1] == ["a@1", "c@1"]
    assert _ids(index, recent)[1] == ["b@1"]  # True is not a number
    with pytest.raises(QueryError, match="not both"):
        MetaPredicate("year", values=frozenset({1}), gte=2)


def test_rollback_restores_an_epoch_as_a_new_one(tmp_path: Path) -> None:
    index = LsmIndex(DIM, path=tmp_path / "i")
    _docs(index)
    assert index.rollback(1) == 4
    assert _ids(index, SearchFilter()) == (4, ["a@1", "b@1"])
    assert index.doc_state("default", "b") is not None
    with pytest.raises(QueryError, match="undone by a rollback"):
        index.search_many(unit(1, DIM)[None], 3, SearchFilter(epoch=3))
    with pytest.raises(IndexStoreError, match="cannot roll back"):
        index.rollback(2)
    index.close()
    reopened = LsmIndex(DIM, path=tmp_path / "i")
    assert _ids(reopened, SearchFilter()) == (4, ["a@1", "b@1"])
    # The undone update can be applied again.
    reopened.commit(make_batch([Change("a", Op.UPSERT, 12 * DAY, 3, (3,))], DIM))
    assert _ids(reopened, SearchFilter())[1] == ["a@5", "b@1"]
    reopened.close()


def test_a_torn_log_tail_is_cut_and_the_index_reopens(tmp_path: Path) -> None:
    index = LsmIndex(DIM, path=tmp_path / "i")
    _docs(index)
    wal = index._wal
    assert wal is not None
    assert wal.current is not None
    wal.close()
    with open(wal.current, "ab") as fh:
        fh.write(b"\x40\x00\x00\x00garbage")  # a record that never finished
    reopened = LsmIndex(DIM, path=tmp_path / "i")
    assert reopened.epoch == 3
    reopened.commit(make_batch([Change("c", Op.UPSERT, 14 * DAY, 5, (5,))], DIM))
    reopened.close()
    again = LsmIndex(DIM, path=tmp_path / "i")
    assert again.epoch == 4
    again.close()


def test_a_different_dimension_is_refused_with_a_fix(tmp_path: Path) -> None:
    LsmIndex(DIM, path=tmp_path / "i").close()
    with pytest.raises(IndexStoreError, match="delete"):
        LsmIndex(DIM * 2, path=tmp_path / "i")


def test_the_exact_index_refuses_history_reads() -> None:
    with pytest.raises(QueryError, match=r"index\.kind: lsm"):
        ExactIndex(DIM).search_many(np.zeros((1, DIM), np.float32), 1, SearchFilter(as_of_us=1))


@pytest.fixture
def client(tmp_path: Path):  # type: ignore[no-untyped-def]
    src = tmp_path / "in.jsonl"
    lines = [
        change_line("r1", "2024-05-01T00:00:00Z", "rotate the database password", domain="ops"),
        change_line("r2", "2024-05-02T00:00:00Z", "the database is backed up nightly"),
    ]
    src.write_text("\n".join(lines) + "\n")
    settings = load_settings(
        overrides={
            "source.path": str(src),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "index.retention_s": 2 * 86_400,
        },
        environ={},
    )
    svc = Service(settings)
    svc.pipeline.run_until_caught_up()
    with open(src, "a", encoding="utf-8") as fh:
        fh.write(change_line("r1", "2024-05-03T00:00:00Z", "rotate the vault token") + "\n")
    svc.pipeline.run_until_caught_up()
    with TestClient(create_app(svc, manage_service=False)) as c:
        yield c
    svc.index.close()  # type: ignore[attr-defined]


def test_http_as_of_epoch_and_rollback(client: TestClient) -> None:
    body = {"query": "rotate", "k": 5, "filters": {"doc_id": "r1"}}
    now = client.post("/v1/retrieve", json=body).json()
    assert [r["text"] for r in now["results"]] == ["rotate the vault token"]
    before = client.post("/v1/retrieve", json={**body, "as_of": "2024-05-02T12:00:00Z"}).json()
    assert [r["text"] for r in before["results"]] == ["rotate the database password"]
    first = client.post("/v1/retrieve", json={**body, "epoch": 1}).json()
    assert first["epoch"] == 1
    assert [r["text"] for r in first["results"]] == ["rotate the database password"]
    old = client.post("/v1/retrieve", json={**body, "as_of": "2024-04-01T00:00:00Z"})
    assert old.status_code == 400
    assert "retained history" in old.json()["error"]["message"]
    assert client.post("/v1/retrieve", json={**body, "epoch": 99}).status_code == 400
    meta = client.post(
        "/v1/retrieve",
        json={"query": "x", "k": 1, "filters": {"metadata": {"a": {"gte": 2, "lt": 1}}}},
    )
    assert meta.status_code == 400
    undo = client.post("/v1/admin/rollback", json={"epoch": 1})
    assert undo.status_code == 200
    assert undo.json() == {"epoch": now["epoch"] + 1, "restored_from": 1, "changed": True}
    after = client.post("/v1/retrieve", json=body).json()
    assert [r["text"] for r in after["results"]] == ["rotate the database password"]
    assert client.post("/v1/admin/rollback", json={"epoch": 99}).status_code == 400
    latest = client.post("/v1/admin/rollback", json={"epoch": now["epoch"] + 1}).json()
    assert latest["changed"] is False
    assert "nothing to roll back" in latest["message"]
    metrics = client.get("/metrics").text
    assert "streamrag_index_segments" in metrics
    assert "streamrag_index_tombstone_ratio" in metrics


def test_cli_rollback_has_help_with_an_example() -> None:
    result = CliRunner().invoke(cli_app, ["rollback", "--help"])
    assert result.exit_code == 0
    assert "Example: streamrag rollback" in result.output
