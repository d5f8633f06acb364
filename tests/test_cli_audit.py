"""``streamrag audit`` end to end on a real state directory: verify holds, and finds damage.

A job runs (``streamrag run --once``, or a real process killed with SIGKILL),
then bytes are changed on disk — in an audit record, in a segment file, in the
write-ahead log, or in a chunk's text with every file checksum made right
again — and ``streamrag audit verify`` must exit 1 naming where.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamrag.chunking import content_hash
from streamrag.cli import app
from streamrag.config import load_settings
from streamrag.index.lsm import LsmIndex
from streamrag.index.store import (
    file_checksum,
    read_manifest,
    read_rows,
    write_manifest,
    write_rows,
)
from streamrag.index.wal import WriteAheadLog, encode_record, read_records
from streamrag.runtime.service import Service

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

KILLER = """
import os, signal, sys
from streamrag.config import load_settings
from streamrag.runtime.service import Service

svc = Service(load_settings(sys.argv[1], environ=os.environ))
seen = []

def die_after_the_commit(batch, result):
    seen.append(result.epoch)
    if len(seen) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)  # committed, its audit record not appended

hooks = svc.pipeline.on_commit
hooks.insert(hooks.index(svc.audit.committed), die_after_the_commit)
svc.pipeline.run_until_caught_up()
"""


def _job(tmp: Path, n_docs: int = 12, **index: object) -> Path:
    data = tmp / "in.jsonl"
    lines = []
    for i in range(n_docs):
        text = f"document {i % 5} revision {i} about rotating passwords and keys"
        lines.append({"doc_id": f"d{i % 5}", "event_time": 1_704_067_200 + i, "text": text})
    lines.append({"doc_id": "d1", "event_time": 1_704_067_200 + n_docs, "op": "delete"})
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    extra = "".join(f"\n  {k}: {v}" for k, v in index.items())
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"state_dir: {tmp / 'state'}\n"
        f"source: {{path: {data}}}\n"
        "embedder: {class: hashing, args: {dim: 32}}\n"
        "batcher: {max_batch_size: 2, adaptive: false}\n"
        f"index:{extra or ' {}'}\n"
    )
    return cfg


def _run(cfg: Path) -> None:
    result = runner.invoke(app, ["run", "--once", str(cfg)])
    assert result.exit_code == 0, result.output


def _verify(cfg: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    wide = {"COLUMNS": "400", **(env or {})}
    result = runner.invoke(app, ["audit", "verify", "--config", str(cfg)], env=wide)
    return result.exit_code, result.output


def _log(cfg: Path) -> Path:
    return cfg.parent / "state" / "audit" / "epochs.jsonl"


def _index_dir(cfg: Path) -> Path:
    return cfg.parent / "state" / "index"


def _left_in_the_wal(cfg: Path) -> None:
    """Run the job in this process and leave it as a kill would: every commit in the log."""
    svc = Service(load_settings(cfg, environ={}))
    svc.pipeline.run_until_caught_up()
    index = svc.index
    assert isinstance(index, LsmIndex)
    index.abandon()
    svc.pipeline.reader.close()


def test_verify_holds_after_a_job_and_show_prints_its_records(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    _run(cfg)
    code, output = _verify(cfg)
    records = _log(cfg).read_text().splitlines()
    assert code == 0, output
    assert "OK" in output
    assert f"records: {len(records)}" in output
    assert f"epochs checked against the index: {len(records)}" in output

    shown = runner.invoke(app, ["audit", "show", "--config", str(cfg)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    assert f"{len(records)} records in" in shown.output
    one = runner.invoke(app, ["audit", "show", "--config", str(cfg), "--epoch", "2"])
    assert one.exit_code == 0
    assert json.loads(one.output)["epoch"] == 2
    lines = runner.invoke(app, ["audit", "show", "--config", str(cfg), "--json"])
    assert [json.loads(x)["seq"] for x in lines.output.splitlines()] == list(range(len(records)))
    missing = runner.invoke(app, ["audit", "show", "--config", str(cfg), "--epoch", "999"])
    assert missing.exit_code == 2
    assert "no record of epoch 999" in missing.output


@pytest.mark.parametrize("where", [0.05, 0.3, 0.5, 0.8, 0.999])
def test_a_flipped_byte_in_a_record_is_named_by_its_line(tmp_path: Path, where: float) -> None:
    cfg = _job(tmp_path)
    _run(cfg)
    path = _log(cfg)
    data = bytearray(path.read_bytes())
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    start, stop = ends[1], ends[2]  # the third line, its newline included
    pos = start + int((stop - start - 1) * where)
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))
    code, output = _verify(cfg)
    assert code == 1
    assert "BROKEN" in output
    assert "line 3" in output.split("\n")[0]


def test_a_flipped_byte_in_a_segment_file_is_reported_with_the_file(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    _run(cfg)
    [segment] = sorted(_index_dir(cfg).glob("grow-*.arrow"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x10
    segment.write_bytes(bytes(data))
    code, output = _verify(cfg)
    assert code == 1
    assert segment.name in output
    assert "damaged" in output


def test_a_flipped_byte_in_the_write_ahead_log_is_reported_and_the_log_left_alone(
    tmp_path: Path,
) -> None:
    cfg = _job(tmp_path)
    _left_in_the_wal(cfg)
    [(_, wal)] = WriteAheadLog.files(_index_dir(cfg))
    whole = wal.read_bytes()
    assert len(read_records(wal)[0]) >= 5

    first = bytearray(whole)
    first[40] ^= 0x01  # inside the first record: whole records follow it
    wal.write_bytes(bytes(first))
    code, output = _verify(cfg)
    assert code == 1
    assert wal.name in output
    assert "CRC-32" in output
    assert wal.read_bytes() == bytes(first)  # verify opened a snapshot, never the log itself

    last = bytearray(whole)
    last[-10] ^= 0x01  # inside the last record: it reads as torn, and the index loses it
    wal.write_bytes(bytes(last))
    code, output = _verify(cfg)
    assert code == 1
    assert "lost committed epochs" in output
    assert wal.read_bytes() == bytes(last)


def test_a_changed_chunk_text_that_passes_every_checksum_is_caught(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    _left_in_the_wal(cfg)
    [(_, wal)] = WriteAheadLog.files(_index_dir(cfg))
    records, _ = read_records(wal)
    rec = records[1]
    batch = rec.batch
    texts = list(batch.texts)
    texts[0] = texts[0].replace("passwords", "passports")
    # Text and content hash changed together, and the log record framed with a good CRC.
    forged = type(batch)(
        **{
            **{f: getattr(batch, f) for f in batch.__dataclass_fields__},
            "texts": texts,
            "hashes": [content_hash(texts[0]), *batch.hashes[1:]],
        }
    )
    out = b"".join(
        encode_record(r.epoch, r.committed_at_us, forged if r is rec else r.batch) for r in records
    )
    wal.write_bytes(out)
    code, output = _verify(cfg)
    assert code == 1
    assert "epoch 2" in output
    assert "contents differ" in output


def test_a_changed_segment_whose_checksums_were_redone_is_caught(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    _run(cfg)
    index = _index_dir(cfg)
    [segment] = sorted(index.glob("grow-*.arrow"))
    rows = read_rows(segment, 32)
    rows.texts[0] = rows.texts[0] + " (edited)"
    rows.hashes[0] = content_hash(rows.texts[0])
    write_rows(segment, rows)
    [manifest] = sorted(index.glob("manifest-*.json"))
    body = read_manifest(manifest)
    body.pop("format", None)
    body["files"][segment.name] = file_checksum(segment)
    write_manifest(manifest, body)
    code, output = _verify(cfg)
    assert code == 1
    assert "contents differ" in output


@pytest.mark.timeout(120)
def test_sigkill_between_a_commit_and_its_append_leaves_no_gap(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script), str(cfg), "3"], cwd=ROOT, env=env, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [json.loads(x)["epoch"] for x in _log(cfg).read_text().splitlines()] == [1, 2]
    code, output = _verify(cfg)
    assert code == 0, output  # epoch 3 is committed, its record held in the index
    assert "epoch 3's record is held in the index" in output

    _run(cfg)  # the restart appends it, then commits the rest
    records = [json.loads(x) for x in _log(cfg).read_text().splitlines()]
    epochs = [r["epoch"] for r in records]
    assert epochs == list(range(1, len(epochs) + 1))
    assert len(epochs) > 3
    assert [r["seq"] for r in records] == list(range(len(records)))
    code, output = _verify(cfg)
    assert code == 0, output
    assert f"epochs checked against the index: {len(epochs)}" in output


def test_a_signed_log_needs_its_secret_to_verify(tmp_path: Path) -> None:
    cfg = _job(tmp_path)
    cfg.write_text(cfg.read_text() + "audit: {hmac_key_env: AUDIT_CLI_KEY}\n")
    env = {"AUDIT_CLI_KEY": "k1"}
    result = runner.invoke(app, ["run", "--once", str(cfg)], env=env)
    assert result.exit_code == 0, result.output
    code, output = _verify(cfg, env)
    assert code == 0, output
    assert "signatures checked" in output
    code, output = _verify(cfg, {"AUDIT_CLI_KEY": "k2"})
    assert code == 1
    assert "signature does not match" in output
    code, output = _verify(cfg, {"AUDIT_CLI_KEY": ""})
    assert code == 2
    assert "AUDIT_CLI_KEY" in output
