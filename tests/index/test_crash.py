"""SIGKILL a writer at random points; the reopened index equals the reference at its epoch.

Each run continues the same index directory: the child recovers what the last
kill left, prints ``ready``, then acknowledges every epoch it committed. The
parent kills it with SIGKILL after a random number of acknowledgements — the
child is then somewhere in a commit, a checkpoint or a compaction — reopens
the directory and compares it with an in-memory index fed the same epochs.
The reopened epoch is the last acknowledged one, or the one after if the kill
landed between the durable log write and the acknowledgement.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from streamrag.index import LsmIndex, SearchFilter

from .crash_writer import DIM, SPEC, batch_for
from .reference import unit

ROOT = Path(__file__).resolve().parents[2]
RUNS = 24


def _state(index: LsmIndex) -> tuple[object, ...]:
    queries = np.stack([unit(50_000 + i, DIM) for i in range(3)])
    _, now = index.search_many(queries, 1000, SearchFilter())
    _, then = index.search_many(queries, 1000, SearchFilter(as_of_us=200))
    docs = {d: index.doc_state("default", f"d{d}") for d in range(30)}
    return (
        index.epoch,
        index.stats().live_chunks,
        [[(h.doc_id, h.position, h.epoch, round(h.score, 5)) for h in q] for q in now],
        [[(h.doc_id, h.position, h.epoch) for h in q] for q in then],
        {d: None if s is None else (s.version, s.deleted, s.hashes) for d, s in docs.items()},
    )


def test_sigkill_at_random_points_loses_nothing_committed(tmp_path: Path) -> None:
    rng = random.Random(20240601)
    path = tmp_path / "index"
    reference = LsmIndex(DIM, SPEC)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for run in range(RUNS):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.index.crash_writer", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", run
        acked = reference.epoch
        for _ in range(rng.randrange(0, 25)):
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
            acked = int(line)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Lines still in the pipe were printed before the kill: acknowledged too.
        for line in proc.stdout.read().split():
            acked = int(line)
        proc.stdout.close()
        reopened = LsmIndex(DIM, SPEC, path=path)
        assert reopened.epoch in (acked, acked + 1), (run, acked, reopened.epoch)
        while reference.epoch < reopened.epoch:
            reference.commit(batch_for(reference.epoch + 1))
        assert _state(reopened) == _state(reference), run
        if run % 2:
            reopened.close()  # a clean stop now and then: a final checkpoint
        else:
            assert reopened._wal is not None
            reopened._wal.close()  # or just let go, as after a crash
