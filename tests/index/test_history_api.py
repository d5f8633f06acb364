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


def test_time_range_prunes_buckets_and_still_returns_k() -> None:
    index = LsmIndex(DIM, LsmSpec(seal_rows=4))
    changes = [Change(f"d{i}", Op.UPSERT, (i % 30) * DAY, i, (100 + i,)) for i in range(300)]
    index.commit(make_batch(changes, DIM))
    assert index.health().segments >= 30
    flt = SearchFilter(start_us=5 * DAY, end_us=6 * DAY)
    _, hits = index.search_many(unit(7, DIM)[None], 10, flt)
    assert len(hits[0]) == 10
    assert all(5 * DAY <= h.event_time < 6 * DAY for h in hits[0])


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
    assert undo.json() == {"epoch": now["epoch"] + 1, "restored_from": 1}
    after = client.post("/v1/retrieve", json=body).json()
    assert [r["text"] for r in after["results"]] == ["rotate the database password"]
    assert client.post("/v1/admin/rollback", json={"epoch": 99}).status_code == 400
    metrics = client.get("/metrics").text
    assert "streamrag_index_segments" in metrics
    assert "streamrag_index_tombstone_ratio" in metrics


def test_cli_rollback_has_help_with_an_example() -> None:
    result = CliRunner().invoke(cli_app, ["rollback", "--help"])
    assert result.exit_code == 0
    assert "Example: streamrag rollback" in result.output
