"""A writer process for the crash test: commits deterministic epochs until it is killed.

Run as ``python -m tests.index.crash_writer DIR``. It opens (or recovers) the
index in DIR, prints ``ready`` and then, after each commit returns, the epoch
it committed. Every few epochs it runs maintenance (checkpoints, compactions),
so a kill can land in any of them.
"""

from __future__ import annotations

import sys

import numpy as np

from streamrag.changes import Op
from streamrag.index import CommitBatch, LsmIndex, LsmSpec
from streamrag.index.ann import AnnSpec
from streamrag.index.compaction import CompactionSpec

from .reference import Change, make_batch

DIM = 8
SPEC = LsmSpec(
    seal_rows=5,
    ann=AnnSpec(min_rows=2**62),
    compaction=CompactionSpec(fanout=2, seal_rows=5),
    retention_us=10**9,
    checkpoint_every=4,
)


def batch_for(epoch: int) -> CommitBatch:
    """The micro-batch of ``epoch``: the same in every process."""
    rng = np.random.default_rng(epoch)
    changes = []
    for j in range(int(rng.integers(1, 5))):
        doc = f"d{int(rng.integers(0, 30))}"
        op = Op.DELETE if rng.random() < 0.2 else Op.UPSERT
        n = int(rng.integers(1, 4)) if op == Op.UPSERT else 0
        seeds = tuple(epoch * 100 + j * 10 + i for i in range(n))
        changes.append(Change(doc, op, int(rng.integers(0, 400)), epoch * 10 + j, seeds))
    return make_batch(changes, DIM)


def main() -> None:
    index = LsmIndex(DIM, SPEC, path=sys.argv[1])
    print("ready", flush=True)
    epoch = index.epoch
    while True:
        epoch += 1
        index.commit(batch_for(epoch))
        print(epoch, flush=True)
        if epoch % 3 == 0:
            index.maintain()
        if epoch % 7 == 0:
            index.compact(force=True)


if __name__ == "__main__":
    main()
