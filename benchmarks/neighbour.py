"""What a partly busy neighbour costs queries: the same Python work in a thread or a process.

    .venv/bin/python benchmarks/neighbour.py       # ~1.5 minutes; not part of `make bench`

Queries while ingest runs take longer than at rest (``contention.py``). Part of
that is the interpreter lock the ingest threads share with the query workers,
and part is the cores themselves. Serving from processes other than the
writer's would remove the first part only. This separates the two: two
threads answer queries (the hashing embedder, then a search of a 50,000-row
LSM index with its maintenance done) as fast as they can, alone, then beside a
neighbour that runs pure Python for ``duty`` of every 10 ms — once as a thread
of the same process (it competes for the lock and a core) and once as a
process of its own (it competes for a core only). The modes take turns, two
rounds each.

Results: ``benchmarks/results/neighbour.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index import clustered, load
from run import machine_info

from streamrag.embed.hashing import HashingEmbedder
from streamrag.index import SearchFilter
from streamrag.index.lsm import LsmIndex

HERE = Path(__file__).resolve().parent
DIM = 384
WORDS = [f"w{i}" for i in range(2000)]
MODES = ("alone", "thread", "process")


def busy(stop: Any, duty: float) -> None:
    """Run Python for ``duty`` of every 10 ms until ``stop`` is set."""
    x = 0
    while not stop.is_set():
        until = time.perf_counter() + 0.010 * duty
        while time.perf_counter() < until:
            for i in range(200):
                x += i * i
        stop.wait(0.010 * (1 - duty))


def queries(index: LsmIndex, seconds: float) -> list[float]:
    """Latencies (s) of two threads embedding and searching random 3-6-word queries."""
    emb = HashingEmbedder(dim=DIM)
    out: list[float] = []
    end = time.perf_counter() + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < end:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6)))
            started = time.perf_counter()
            v = np.asarray(emb.embed_many([text]), dtype=np.float32)
            index.search_many(v, 5, SearchFilter())
            out.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def phase(index: LsmIndex, mode: str, duty: float, seconds: float) -> dict[str, float]:
    """Query for ``seconds`` with the neighbour ``mode`` beside."""
    stop: Any = threading.Event() if mode == "thread" else mp.Event()
    neighbour: threading.Thread | mp.Process | None = None
    if mode == "thread":
        neighbour = threading.Thread(target=busy, args=(stop, duty))
    elif mode == "process":
        neighbour = mp.Process(target=busy, args=(stop, duty))
    if neighbour is not None:
        neighbour.start()
    try:
        lat = np.asarray(queries(index, seconds)) * 1000
    finally:
        stop.set()
        if neighbour is not None:
            neighbour.join()
    return {
        "queries": int(lat.size),
        "qps": lat.size / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


def markdown(results: dict[str, Any]) -> str:
    """The results as a table: each mode's medians over its rounds."""
    lines = [
        "# Queries beside a partly busy neighbour: a thread or a process",
        "",
        f"Run {results['started']} with `{results['command']}`; machine: "
        f"{results['machine']['cpu_count']} cores, {results['machine']['cpu_model']}. Two threads "
        f"query a {results['rows']:,}-row index (hashing embedder, then search) for "
        f"{results['seconds']:g} s per phase; the neighbour runs Python for the duty share of "
        "every 10 ms. Medians of the rounds.",
        "",
        "| neighbour's duty | alone p50 / p99 | thread beside p50 / p99 | process beside p50 / p99 "
        "| p99 thread / alone | p99 process / alone |",
        "|---:|---|---|---|---:|---:|",
    ]
    for duty, modes in results["duties"].items():
        med = {
            m: {k: float(np.median([r[k] for r in modes[m]])) for k in ("p50_ms", "p99_ms")}
            for m in MODES
        }
        cells = [f"{med[m]['p50_ms']:.2f} / {med[m]['p99_ms']:.2f} ms" for m in MODES]
        alone = med["alone"]["p99_ms"]
        lines.append(
            f"| {float(duty):.0%} | {' | '.join(cells)} | {med['thread']['p99_ms'] / alone:.2f}× "
            f"| {med['process']['p99_ms'] / alone:.2f}× |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--duties", type=float, nargs="*", default=[0.15, 0.3])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    index = LsmIndex(DIM)
    data = clustered(args.rows, DIM, seed=1)
    load(index, data, np.arange(args.rows, dtype=np.int64), 1000)
    while index.maintain():
        pass
    results: dict[str, Any] = {
        "command": "benchmarks/neighbour.py " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "rows": args.rows,
        "seconds": args.seconds,
        "duties": {},
    }
    for duty in args.duties:
        modes: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                modes[mode].append(phase(index, mode, duty, args.seconds))
        results["duties"][str(duty)] = modes
    index.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "neighbour.json").write_text(json.dumps(results, indent=1))
    (args.out / "neighbour.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
