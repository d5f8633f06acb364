"""SIGKILL at random moments, restart, and end with exactly the index the input describes.

The job runs as a real process (``python -m streamrag run CONFIG --once``) over
a 20,000-change stream: upserts, updates, deletes, event times out of order
within the bound, and malformed lines. It is killed with SIGKILL at random
moments — some chosen by time, some inside a commit (the embedder kills its own
process mid-batch, or a moment after returning, while the commit's log record
is being written) — and restarted each time. At the end the index is compared
with a reference computed from the input by a plain model of last-writer-wins:
no change lost, none applied twice, no deleted document back, and exactly one
dead letter per malformed line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.ingest import DeadLetterStore

ROOT = Path(__file__).resolve().parents[2]
N_CHANGES = 20_000
BOUND_S = 60
T0 = 1_704_067_200  # 2024-01-01T00:00:00Z
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]


@dataclass
class Expected:
    live: dict[str, tuple[int, str]]  # doc id -> (event time µs, text)
    deleted: set[str]
    malformed: list[int]  # byte offsets of the malformed lines


def _stream(seed: int) -> tuple[list[str], Expected]:
    """The input lines and, by a plain model, what the index must end with."""
    rng = random.Random(seed)
    lines: list[str] = []
    latest: dict[str, tuple[int, int, str, str]] = {}  # doc -> (t, offset, op, text)
    malformed: list[int] = []
    offset = 0
    for i in range(N_CHANGES):
        t_s = T0 + i - rng.randrange(0, BOUND_S)  # out of order within the bound
        doc = f"doc-{rng.randrange(2500)}"
        roll = rng.random()
        if roll < 0.02:
            line = rng.choice(
                [
                    '{"doc_id": "x", "event_time": ',  # cut off
                    json.dumps({"event_time": t_s, "text": "no id"}),
                    json.dumps({"doc_id": doc, "event_time": "not a time", "text": "t"}),
                    json.dumps({"doc_id": doc, "event_time": t_s, "op": "upsert"}),  # no text
                    "not json at all",
                ]
            )
            malformed.append(offset)
        elif roll < 0.15:
            line = json.dumps({"doc_id": doc, "event_time": t_s, "op": "delete"})
            _keep(latest, doc, t_s * 10**6, offset, "delete", "")
        else:
            text = f"{doc} revision {i} " + " ".join(rng.choice(WORDS) for _ in range(8))
            line = json.dumps({"doc_id": doc, "event_time": t_s, "text": text})
            _keep(latest, doc, t_s * 10**6, offset, "upsert", text)
        lines.append(line)
        offset += len(line.encode()) + 1
    live = {d: (t, text) for d, (t, _, op, text) in latest.items() if op == "upsert"}
    deleted = {d for d, (_, _, op, _) in latest.items() if op == "delete"}
    return lines, Expected(live, deleted, malformed)


def _keep(latest: dict[str, Any], doc: str, t: int, offset: int, op: str, text: str) -> None:
    held = latest.get(doc)
    if held is None or (t, offset) > (held[0], held[1]):
        latest[doc] = (t, offset, op, text)


def _config(tmp: Path, data: Path) -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
source: {{path: {data}, max_read_bytes: 65536}}
embedder: {{class: "tests.runtime.embedders:SelfKilling", args: {{dim: 64}}}}
batcher: {{max_batch_size: 64, max_delay_ms: 5, adaptive: false}}
event_time: {{max_out_of_orderness_ms: {BOUND_S * 1000}}}
index: {{checkpoint_every: 16, seal_rows: 1024}}
""",
        encoding="utf-8",
    )
    return cfg


def _start(cfg: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamrag", "run", str(cfg), "--once"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wal_bytes(state: Path) -> int:
    index = state / "index"
    return sum(p.stat().st_size for p in index.glob("wal-*.log")) if index.exists() else 0


@pytest.mark.timeout(300)
def test_sigkill_at_random_moments_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path,
) -> None:
    lines, expected = _stream(seed=5)
    data = tmp_path / "changes.jsonl"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    cfg = _config(tmp_path, data)
    base_env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    rng = random.Random(11)

    kills = in_commit = 0
    deadline = time.monotonic() + 240
    while kills < 12 and time.monotonic() < deadline:
        env = dict(base_env)
        by_embedder = kills % 3 == 2  # every third kill lands inside a commit by design
        if by_embedder:
            env["KILLTEST_AT_CALL"] = str(rng.randrange(2, 12))
            env["KILLTEST_AFTER_US"] = str(rng.choice([0, 200, 1000, 3000]))
        proc = _start(cfg, env)
        if not by_embedder:
            # Wait for the restarted job to commit something, then kill it at a
            # random moment of its work.
            seen = _wal_bytes(tmp_path / "state")
            while proc.poll() is None and _wal_bytes(tmp_path / "state") == seen:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.25))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
        proc.stdout and proc.stdout.close()
        proc.stderr and proc.stderr.close()
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            in_commit += by_embedder
        else:
            assert proc.returncode == 0  # it finished before the kill: start over
            break
    assert kills >= 10, f"only {kills} kills landed before the job finished"
    assert in_commit >= 3

    final = _start(cfg, base_env)
    out, err = final.communicate(timeout=180)
    assert final.returncode == 0, err.decode()[-2000:]
    status = json.loads(out)

    # The accounting: every line read once, applied or refused once.
    counts = status["counts"]
    assert counts["ingested"] == N_CHANGES
    assert counts["dead_lettered"] == len(expected.malformed)
    assert counts["applied"] == N_CHANGES - len(expected.malformed)
    assert counts["pending"] == 0
    assert status["recovery"]["resumed_from_epoch"] is not None

    # The index: exactly what last-writer-wins over the input says.
    settings = IndexSettings(checkpoint_every=16, seal_rows=1024)
    index = LsmIndex(64, lsm_spec(settings), path=tmp_path / "state" / "index")
    try:
        rows = index.export()
        docs: dict[str, tuple[int, str]] = {}
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids))  # nothing applied twice
        for hit, _ in rows:
            assert hit.doc_id not in docs  # one chunk per (short) document
            docs[hit.doc_id] = (hit.event_time, hit.text)
        assert set(docs) == set(expected.live)  # nothing lost, nothing resurrected
        assert docs == expected.live  # and each at its newest version
        assert not set(docs) & expected.deleted
        for doc in expected.deleted:
            state = index.doc_state("default", doc)
            assert state is not None
            assert state.deleted
    finally:
        index.close()

    # The dead letters: one per malformed line, whatever the replays.
    letters = list(DeadLetterStore(tmp_path / "state" / "deadletter.jsonl").read())
    assert sorted(le.offset for le in letters) == expected.malformed
