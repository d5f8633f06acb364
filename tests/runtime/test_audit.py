"""The epoch audit log: one chained record per epoch, no gap after a crash, verify finds damage."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from streamrag.changes import ChangeBatch
from streamrag.config import Settings, load_settings
from streamrag.embed.hashing import HashingEmbedder
from streamrag.errors import ConfigError
from streamrag.index.factory import lsm_spec
from streamrag.index.lsm import LsmIndex
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.ingest.deadletter import DeadLetter
from streamrag.runtime.audit import (
    GENESIS,
    EpochAudit,
    EpochAuditLog,
    canonical,
    merkle_root,
    record_hash,
    signature,
)
from streamrag.runtime.audit_verify import Report, verify
from streamrag.runtime.generations import index_home
from streamrag.runtime.pipeline import Pipeline
from streamrag.runtime.service import Service
from streamrag.runtime.stages import RedactStage
from streamrag.sources.base import RawBatch
from streamrag.sources.files import JsonlSource
from streamrag.testing import ManualClock

T0 = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z
DAY_S = 86_400


def _settings(tmp: Path, **overrides: Any) -> Settings:
    return load_settings(
        overrides={
            "source.path": str(tmp / "none.jsonl"),
            "state_dir": str(tmp / "state"),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            "batcher.max_batch_size": 1,
            "batcher.adaptive": False,
            **overrides,
        },
        environ={},
    )


def _service(settings: Settings, clock: ManualClock | None = None) -> Service:
    return Service(settings, clock=clock or ManualClock(T0))


def _push(svc: Service, *changes: dict[str, Any]) -> None:
    clock = svc.clock
    assert isinstance(clock, ManualClock)
    clock.advance_us(1_000_000)
    svc.push(list(changes))
    svc.pipeline.run_until_caught_up(final=False)


def _doc(doc_id: str, text: str, day: float = 0, **more: Any) -> dict[str, Any]:
    return {"doc_id": doc_id, "text": text, "event_time": T0 // 10**6 + int(day * DAY_S), **more}


def _records(settings: Settings) -> list[dict[str, Any]]:
    path = settings.audit.log_path(settings.state_dir)
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _verify(settings: Settings, key: bytes | None = None) -> Report:
    persists = settings.index.kind == "lsm" and settings.index.persist
    return verify(
        settings.audit.log_path(settings.state_dir),
        index_dir=(lambda g: index_home(settings.state_dir, g) / "index") if persists else None,
        spec=lsm_spec(settings.index),
        key=key,
    )


def _kill(svc: Service) -> None:
    """What SIGKILL leaves: the index's files as they are, no checkpoint."""
    index = svc.index
    assert isinstance(index, LsmIndex)
    index.abandon()
    svc.pipeline.reader.close()


def _chain_holds(records: Sequence[dict[str, Any]]) -> None:
    prev = GENESIS
    for seq, rec in enumerate(records):
        assert rec["seq"] == seq
        assert rec["prev"] == prev
        assert rec["hash"] == record_hash(rec)
        prev = rec["hash"]


# -- the record and its encoding ---------------------------------------------------------


def test_records_are_canonical_json_hashed_without_their_hash() -> None:
    rec = {"b": [1, "é"], "a": {"z": None, "y": True}, "hash": "x", "sig": "y"}
    assert canonical(rec) == '{"a":{"y":true,"z":null},"b":[1,"é"],"hash":"x","sig":"y"}'.encode()
    body = b'{"a":{"y":true,"z":null},"b":[1,"\xc3\xa9"]}'
    assert record_hash(rec) == hashlib.sha256(body).hexdigest()
    assert record_hash({**rec, "hash": "other", "sig": "other"}) == record_hash(rec)
    assert record_hash({**rec, "b": [2, "é"]}) != record_hash(rec)
    with pytest.raises(ValueError, match="JSON"):
        canonical({"x": float("nan")})  # not a JSON value


def test_the_merkle_root_is_rfc6962_over_sorted_distinct_leaves() -> None:
    def h(b: bytes) -> bytes:
        return hashlib.sha256(b).digest()

    leaves = [b"c", b"a", b"b"]
    la, lb, lc = sorted(h(b"\x00" + x) for x in (b"a", b"b", b"c"))
    # Three leaves: the first two pair up, the third joins at the top (RFC 6962, 2.1).
    want = h(b"\x01" + h(b"\x01" + la + lb) + lc).hex()
    assert merkle_root(leaves) == want
    assert merkle_root(reversed(leaves)) == want
    assert merkle_root([*leaves, b"a"]) == want
    assert merkle_root([b"a"]) == h(b"\x00a").hex()
    assert merkle_root([]) == h(b"").hex()
    assert merkle_root([b"a", b"b", b"d"]) != want


# -- one record per epoch ---------------------------------------------------------------


def test_every_epoch_gets_one_chained_record_that_the_index_reproduces(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    _push(svc, _doc("a", "alpha one"), _doc("b", "beta one", 0.1), _doc("c", "gamma", 0.2))
    _push(svc, _doc("a", "alpha two " * 80, 1))  # several chunks
    _push(svc, {"doc_id": "b", "op": "delete", "event_time": T0 // 10**6 + 2 * DAY_S})
    _push(svc, _doc("a", "alpha late", 0.5))  # late: filed in a's history
    epoch = svc.index.epoch
    svc.stop()

    records = _records(settings)
    assert [r["epoch"] for r in records] == list(range(1, epoch + 1))
    assert {r["kind"] for r in records} == {"commit"}
    _chain_holds(records)
    raw = settings.audit.log_path(settings.state_dir).read_bytes().splitlines()
    assert raw == [canonical(r) for r in records]  # each line is the record's canonical bytes
    assert sum(r["counts"]["upserts"] for r in records) == 5
    assert sum(r["counts"]["deletes"] for r in records) == 1
    assert records[-1]["digest"]["tombstones"] == 0
    assert any(r["digest"]["tombstones"] == 1 for r in records)
    assert any(r["digest"]["chunks"] > 1 for r in records)
    times = [r["time_us"] for r in records]
    assert times == sorted(times)
    assert T0 < times[0] <= T0 + 4_000_000
    assert all(r["generation"] == 1 for r in records)
    assert all(r["embedders"]["used"] in ([], ["hashing-blake2b-v1-d32"]) for r in records)
    journal = [p for r in records for p in r["positions"]]
    assert journal
    assert all("push" in p for p in journal)
    assert records[0]["pipeline"]["version"]
    assert len(records[0]["pipeline"]["settings"]) == 64

    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == epoch
    assert report.records == epoch
    assert not report.not_verifiable


def test_the_digest_survives_checkpoints_compaction_copies_and_a_reopen(tmp_path: Path) -> None:
    settings = _settings(tmp_path, **{"index.seal_rows": 2, "index.compact_fanout": 2})
    svc = _service(settings)
    _push(svc, _doc("a", "version at ten", 10))
    _push(svc, _doc("a", "version at thirty", 30))
    _push(svc, _doc("a", "late at twenty", 20))  # splits an ended interval: a kill and a copy
    _push(svc, _doc("a", "later at fifteen", 15))
    _push(svc, _doc("b", "another document", 31), _doc("c", "and a third", 32))
    index = svc.index
    assert isinstance(index, LsmIndex)
    index.seal_all()
    index.compact(force=True)
    index.checkpoint()
    assert index.health().compactions >= 1
    svc.stop()

    again = _service(settings, ManualClock(T0 + 10**9))
    _push(again, _doc("d", "after the restart", 33))
    again.stop()
    records = _records(settings)
    _chain_holds(records)
    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == len(records) == again.index.epoch


def test_a_record_carries_redactions_pushed_by_and_the_epochs_dead_letters(
    tmp_path: Path,
) -> None:
    class Tagged(Decoder):
        """Moves metadata's redactions / pushed_by into the payload, as the stages do."""

        def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
            changes, letters = super().decode(raws)
            for payload in changes.payloads:
                assert isinstance(payload, dict)
                meta = payload.get("metadata") or {}
                for key in ("redactions", "pushed_by"):
                    if key in meta:
                        payload[key] = meta.pop(key)
            return changes, letters

    data = tmp_path / "in.jsonl"
    lines = [
        _doc("a", "mail", metadata={"redactions": {"EMAIL": 2}, "pushed_by": "ops"}),
        _doc("b", "phone", metadata={"redactions": {"PHONE": 1, "EMAIL": 1}, "pushed_by": "ci"}),
        "not json",
        _doc("c", "plain"),
    ]
    data.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    clock = ManualClock(T0)
    from streamrag.batching import MicroBatcher

    index = LsmIndex(16, path=tmp_path / "index", clock=clock)
    pipeline = Pipeline(
        source=JsonlSource(data),
        embedder=HashingEmbedder(dim=16),
        index=index,
        dead_letters=DeadLetterStore(tmp_path / "dl.jsonl"),
        clock=clock,
        decoder=Tagged(),
        batcher=MicroBatcher(max_batch_size=2, max_delay_ms=0, clock=clock),
        redact=RedactStage(None, source_name=lambda _: "push"),  # as if read from the journal
    )
    audit = EpochAudit(
        EpochAuditLog(tmp_path / "epochs.jsonl"),
        clock=clock,
        generation=lambda: 1,
        pipeline={"version": "test", "settings": "0" * 64},
    )
    audit.attach(pipeline)
    pipeline.run_until_caught_up()
    records = [json.loads(x) for x in (tmp_path / "epochs.jsonl").read_bytes().splitlines()]
    assert [r["counts"]["changes"] for r in records] == [2, 1]
    assert records[0]["counts"]["redactions"] == {"EMAIL": 3, "PHONE": 1}
    assert records[0]["pushed_by"] == ["ci", "ops"]
    assert records[1]["counts"]["redactions"] == {}
    assert records[1]["pushed_by"] == []
    # The malformed line was refused while the first batch waited: counted in the first epoch.
    assert sum(r["counts"]["dead_lettered"] for r in records) == 1
    # Positions that moved: the file was read whole before the first commit.
    assert records[0]["positions"] == {str(data): data.stat().st_size}
    assert records[1]["positions"] == {}
    pipeline.close()
    index.close()


# -- crashes --------------------------------------------------------------------------


def test_a_crash_between_commit_and_append_leaves_no_gap(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    assert svc.audit is not None
    svc.pipeline.on_commit.remove(svc.audit.committed)  # the process dies right after the commit
    _push(svc, _doc("b", "two"))
    assert [r["epoch"] for r in _records(settings)] == [1]
    report = _verify(settings)
    assert report.ok  # the record is held in the index: pending, not missing
    assert any("not yet in the log" in n for n in report.notes)
    _kill(svc)  # no checkpoint: the write-ahead log holds epoch 2

    again = _service(settings)
    assert [r["epoch"] for r in _records(settings)] == [1, 2]
    _push(again, _doc("c", "three"))
    again.stop()
    third = _service(settings)  # a record already there is not appended twice
    third.stop()
    records = _records(settings)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    _chain_holds(records)
    assert _verify(settings).ok


def test_a_record_that_missed_its_append_goes_first_at_the_next_commit(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    assert svc.audit is not None
    hook = svc.audit.committed
    svc.pipeline.on_commit.remove(hook)  # the append failed (a full disk, say)
    _push(svc, _doc("a", "one"))
    svc.pipeline.on_commit.append(hook)
    _push(svc, _doc("b", "two"))
    svc.stop()
    records = _records(settings)
    assert [r["epoch"] for r in records] == [1, 2]
    _chain_holds(records)


def test_a_torn_last_line_is_cut_off_and_its_record_appended_again(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    _push(svc, _doc("b", "two"))
    _kill(svc)
    path = settings.audit.log_path(settings.state_dir)
    whole = path.read_bytes()
    path.write_bytes(whole[:-25])  # a crash in the middle of the last append
    again = _service(settings)
    assert path.read_bytes() == whole
    again.stop()


def test_a_damaged_last_record_stops_the_job_with_what_to_do(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    svc.stop()
    path = settings.audit.log_path(settings.state_dir)
    path.write_bytes(path.read_bytes().replace(b'"hash":"', b'"hash":0,"x":"', 1))
    with pytest.raises(Exception, match="audit verify"):
        _service(settings)


# -- rollbacks, resets, generations ----------------------------------------------------


def test_a_rollback_gets_a_record_even_when_the_process_dies_before_its_append(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    for i in range(3):
        _push(svc, _doc(f"d{i}", f"document {i}", i))
    assert svc.rollback(1) == 4
    rec = _records(settings)[-1]
    assert (rec["kind"], rec["epoch"], rec["restored_from"]) == ("rollback", 4, 1)
    _push(svc, _doc("d9", "after the rollback", 3))
    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == 4  # epochs 2 and 3 were undone, their rows still held

    index = svc.index
    assert isinstance(index, LsmIndex)
    index.rollback(4)  # bypassing the audit: as if the process died before the append
    index.abandon()
    again = _service(settings)
    again.stop()
    third = _service(settings)
    third.stop()
    records = _records(settings)
    assert [(r["kind"], r["epoch"]) for r in records][-2:] == [("commit", 5), ("rollback", 6)]
    assert records[-1]["restored_from"] == 4
    _chain_holds(records)
    assert _verify(settings).ok


def test_an_index_that_does_not_persist_is_recorded_as_reset_on_restart(tmp_path: Path) -> None:
    settings = _settings(tmp_path, **{"index.kind": "exact"})
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    _push(svc, _doc("b", "two"))
    svc.stop()
    again = _service(settings)
    _push(again, _doc("c", "three"))
    again.stop()
    records = _records(settings)
    # The new index starts empty and reads the input again from its start.
    kinds = [(r["kind"], r["epoch"]) for r in records]
    assert kinds[:3] == [("commit", 1), ("commit", 2), ("reset", 0)]
    assert kinds[3:] == [("commit", e) for e in range(1, len(kinds) - 2)]
    assert records[2]["previous_epoch"] == 2
    assert "does not persist" in records[2]["reason"]
    _chain_holds(records)
    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == 0
    assert sum(len(v) for v in report.not_verifiable.values()) == len(records) - 1


def test_after_a_switch_records_name_the_new_generation_and_verify_both(tmp_path: Path) -> None:
    settings = _settings(tmp_path, **{"batcher.max_batch_size": 16})
    svc = _service(settings)
    _push(svc, *[_doc(f"d{i}", f"document {i}") for i in range(5)])
    svc.reindexer.start({"class": "hashing", "args": {"dim": 24}}, switch=True)
    fill = svc.reindexer.backfill
    assert fill is not None
    fill.join(30)
    _push(svc, _doc("d9", "after the switch"))
    assert svc.pin().number == 2
    svc.stop()
    records = _records(settings)
    assert records[0]["generation"] == 1
    assert records[-1]["generation"] == 2
    assert records[-1]["epoch"] == svc.index.epoch
    _chain_holds(records)
    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == len(records)


# -- signatures and damage ----------------------------------------------------------------


def test_signed_records_verify_only_with_the_same_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, **{"audit.hmac_key_env": "AUDIT_TEST_KEY"})
    with pytest.raises(ConfigError, match="AUDIT_TEST_KEY"):
        _service(settings)
    monkeypatch.setenv("AUDIT_TEST_KEY", "s3cret")
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    _push(svc, _doc("b", "two"))
    svc.stop()
    records = _records(settings)
    assert all(r["sig"] == signature(r, b"s3cret") for r in records)
    good = _verify(settings, b"s3cret")
    assert good.ok
    assert good.signatures_checked == 2
    assert _verify(settings).signatures_unchecked == 2
    wrong = _verify(settings, b"guess")
    assert [f.line for f in wrong.findings] == [1, 2]

    # Rewriting a record and its hash does not get past the signature.
    path = settings.audit.log_path(settings.state_dir)
    forged = dict(records[1], counts={**records[1]["counts"], "upserts": 0})
    forged["hash"] = record_hash(forged)
    path.write_bytes(canonical(records[0]) + b"\n" + canonical(forged) + b"\n")
    report = _verify(settings, b"s3cret")
    assert report.findings[0].line == 2
    assert "signature" in report.findings[0].what


def test_verify_names_the_line_of_a_changed_removed_or_rehashed_record(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    svc = _service(settings)
    for i in range(4):
        _push(svc, _doc(f"d{i}", f"document {i}", i))
    svc.stop()
    path = settings.audit.log_path(settings.state_dir)
    lines = path.read_bytes().splitlines(keepends=True)

    changed = lines[1].replace(b'"upserts":1', b'"upserts":7')
    path.write_bytes(b"".join([lines[0], changed, *lines[2:]]))
    first = _verify(settings).findings[0]
    assert (first.line, first.epoch) == (2, 2)
    assert "changed after it was written" in first.what

    path.write_bytes(b"".join([lines[0], *lines[2:]]))  # a record removed
    first = _verify(settings).findings[0]
    assert first.line == 2
    assert "links to" in first.what

    rec = json.loads(lines[1])
    rec["counts"]["upserts"] = 7
    rec["hash"] = record_hash(rec)  # rehashed: the next record's link breaks
    path.write_bytes(b"".join([lines[0], canonical(rec) + b"\n", *lines[2:]]))
    first = _verify(settings).findings[0]
    assert (first.line, first.epoch) == (3, 3)

    # The last record gone looks like a stop between a commit and its append: the index
    # still holds that record, and the next start appends it.
    path.write_bytes(b"".join(lines[:3]))
    assert _verify(settings).ok
    path.write_bytes(b"".join(lines[:2]))  # the last two gone: that is no crash
    report = _verify(settings)
    assert not report.ok
    assert "epochs 3–4, which have no record" in report.findings[0].what


def test_history_compacted_away_is_not_verifiable_but_not_broken(tmp_path: Path) -> None:
    settings = _settings(tmp_path, **{"index.retention_s": DAY_S, "index.seal_rows": 1})
    svc = _service(settings)
    _push(svc, _doc("a", "first version", 0))
    _push(svc, _doc("a", "second version", 10))
    _push(svc, _doc("c", "a later document", 20))
    index = svc.index
    assert isinstance(index, LsmIndex)
    index.seal_all()
    index.compact(force=True)
    svc.stop()
    report = _verify(settings)
    assert report.ok, report.findings
    gone = [e for epochs in report.not_verifiable.values() for e in epochs]
    assert gone == [1]
    assert "retained history" in next(iter(report.not_verifiable))
    assert report.epochs_checked == 2


def test_the_http_rollback_is_recorded_and_status_shows_the_last_record(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from streamrag.serve.app import create_app

    settings = _settings(tmp_path)
    svc = _service(settings)
    _push(svc, _doc("a", "one"))
    _push(svc, _doc("b", "two", 1))
    with TestClient(create_app(svc, manage_service=False)) as client:
        done = client.post("/v1/admin/rollback", json={"epoch": 1})
        assert done.status_code == 200, done.text
        assert done.json()["epoch"] == 3
        status = client.get("/v1/status").json()["audit"]
    records = _records(settings)
    assert [(r["kind"], r["epoch"]) for r in records] == [
        ("commit", 1),
        ("commit", 2),
        ("rollback", 3),
    ]
    assert status["records"] == 3
    assert status["last_epoch"] == 3
    assert status["last_hash"] == records[-1]["hash"]
    assert status["signed"] is False
    svc.stop()


def test_records_of_a_dropped_generation_are_not_checked_against_its_successor(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path, **{"batcher.max_batch_size": 16})
    svc = _service(settings)
    _push(svc, *[_doc(f"d{i}", f"document {i}") for i in range(5)])
    for dim in (24, 40):  # generation 2 twice: built, served, left and dropped, built again
        svc.reindexer.start({"class": "hashing", "args": {"dim": dim}}, switch=True)
        fill = svc.reindexer.backfill
        assert fill is not None
        fill.join(30)
        assert svc.pin().number == 2
        _push(svc, _doc(f"new{dim}", f"served by {dim} dimensions"))
        if dim == 24:
            svc.reindexer.rollback()
            _push(svc, _doc("back", "generation one again"))
            svc.reindexer.drop(2)
    svc.stop()
    records = _records(settings)
    assert [r["generation"] for r in records] == [1, 2, 1, 2]
    _chain_holds(records)
    from streamrag.runtime.generations import Book

    book = Book.load(settings.state_dir)
    assert book is not None
    report = verify(
        settings.audit.log_path(settings.state_dir),
        index_dir=lambda g: index_home(settings.state_dir, g) / "index",
        spec=lsm_spec(settings.index),
        serving=book.serving.number,
        created={e.number: e.created_us for e in book.entries},
    )
    assert report.ok, report.findings
    assert report.epochs_checked == 3
    assert list(report.not_verifiable.values()) == [[records[1]["epoch"]]]
    # Without the book's dates, the first generation 2's record meets the second's index.
    assert not _verify(settings).ok


@pytest.mark.parametrize("history", ["full", "current"])
def test_changes_the_index_leaves_out_are_not_in_the_digest(tmp_path: Path, history: str) -> None:
    settings = _settings(tmp_path, **{"index.history": history, "batcher.max_batch_size": 8})
    svc = _service(settings)
    # Versions out of order in one push: without history the older one is never stored.
    _push(svc, _doc("a", "a at two", 2), _doc("a", "a at one", 1), _doc("b", "b", 1))
    _push(svc, _doc("a", "a at three", 3))
    _push(svc, _doc("a", "a at zero, long superseded", 0))  # stale without history
    svc.stop()
    records = _records(settings)
    report = _verify(settings)
    assert report.ok, report.findings
    assert report.epochs_checked == len(records)
    # The last change is older than every version held: filed in the history, or left out.
    assert records[-1]["counts"]["changes"] == 1
    assert records[-1]["digest"]["chunks"] == (1 if history == "full" else 0)
    if history == "full":
        assert sum(r["digest"]["chunks"] for r in records) == 5  # every version
