"""What turning a search's rows into hits costs, by batch size and segment count.

    .venv/bin/python benchmarks/hits.py            # ~1 minute

A search returns rows and scores (:mod:`streamrag.index.hits`); the first read
of a hit builds the hits of every query of the search. This times that first
build right after each search — when the scan has just swept the caches, as in
the server — over two indexes of 384-dimensional rows committed in batches of
1,024 and sealed, none merged: 21,200 rows in 3 segments (the size of
``run.py``'s 20,000 documents) and 100,000 rows in 13 (a bulk load that
maintenance has not merged yet, or an index that ingest is ahead of). Medians
over the searches of 512 queries, k = 5. Run it with ``PYTHONPATH`` pointing at
another checkout's ``src`` to compare two versions of the code on one machine.

Results: ``benchmarks/results/hits.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index import DIM, T0_US, clustered, load
from run import machine_info

from streamrag.index import SearchFilter
from streamrag.index.compaction import CompactionSpec
from streamrag.index.lsm import LsmIndex, LsmSpec

HERE = Path(__file__).resolve().parent
BATCHES = (1, 4, 16, 64)
QUERIES = 512


def build_times(rows: int) -> dict[str, Any]:
    """Median µs of the first hit build after a search, per batch size, over ``rows`` rows."""
    data = clustered(rows, DIM, seed=21)
    index = LsmIndex(DIM, LsmSpec(compaction=CompactionSpec(fanout=10**6)), background=False)
    load(index, data, np.full(rows, T0_US, dtype=np.int64), 1024)
    index.seal_all()
    queries = clustered(QUERIES, DIM, seed=22)
    flt = SearchFilter()
    out: dict[str, Any] = {
        "rows": rows,
        "segments": sum(1 for v in index.pin().views if v.rows),
        "us_by_batch": {},
    }
    for m in BATCHES:
        took = []
        for lo in range(0, QUERIES - m + 1, m):
            _, hits = index.search_many(queries[lo : lo + m], 5, flt)
            started = time.perf_counter()
            for h in hits:
                list(h)
            took.append(time.perf_counter() - started)
        out["us_by_batch"][str(m)] = round(statistics.median(took) * 1e6, 1)
    index.close()
    return out


def markdown(res: dict[str, Any]) -> str:
    """The results as a table."""
    m = res["machine"]
    lines = [
        "# Building hits from a search's rows",
        "",
        f"Run {m['date_utc']} with `benchmarks/hits.py`; machine: {m['cpu_count']} cores, "
        f"{m['cpu_model']}, shared. First build right after each search, median µs, k = 5.",
        "",
        "| rows | segments | " + " | ".join(f"{b} per search" for b in BATCHES) + " |",
        "|---:|---:|" + "---:|" * len(BATCHES),
    ]
    for case in res["cases"]:
        times = " | ".join(f"{case['us_by_batch'][str(b)]:,}" for b in BATCHES)
        lines.append(f"| {case['rows']:,} | {case['segments']} | {times} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    res: dict[str, Any] = {
        "machine": machine_info(),
        "cases": [build_times(n) for n in (21_200, 100_000)],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hits.json").write_text(json.dumps(res, indent=1))
    (args.out / "hits.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
