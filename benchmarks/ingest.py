"""In-process ingest throughput: the raw embedder against the whole pipeline.

Run as its own process (so that its peak RSS is its own, and torch stays out of
the parent)::

    python benchmarks/ingest.py --jsonl changes.jsonl --embedder hashing --repeats 3

Each repeat first embeds, with a fresh embedder in batches of ``--batch``, the
chunks the pipeline makes of every upsert (normalized and split by the job's
splitter: the same texts the pipeline embeds; chunks/s), then replays the file through a fresh
:class:`~streamrag.runtime.service.Service` with ``run_until_caught_up``
(changes/s). Embedder models are loaded before the clock starts. One JSON object
is printed on stdout; progress goes to stderr.

With ``--queries`` the last repeat's service is also searched in process; with
``--against exact`` a second service with that index is built over the same
file and both are searched in alternated rounds (:func:`time_search_against`),
so their ratio is measured in one process at one time, not in two runs minutes apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import yaml

from streamrag.config import load_settings
from streamrag.embed.base import Embedder, build_embedder
from streamrag.index.base import SearchFilter
from streamrag.ingest.normalize import normalize_text
from streamrag.runtime.build import build_splitter
from streamrag.runtime.collector import tune_collector
from streamrag.runtime.service import Service
from streamrag.runtime.thread_cpu import thread_cpu_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import MAINTENANCE_THREAD, wait_idle


def proc_status_kib(pid: int | str = "self") -> dict[str, int]:
    """``VmRSS``/``VmHWM`` (KiB) of a process from ``/proc/<pid>/status``."""
    out: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def read_upsert_texts(path: Path) -> tuple[list[str], int]:
    """Texts of the upserts in a JSONL change file, and the number of lines."""
    texts: list[str] = []
    n = 0
    dec = msgspec.json.Decoder()
    with path.open("rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            n += 1
            rec = dec.decode(line)
            if rec.get("op", "upsert") == "upsert" and rec.get("text"):
                texts.append(rec["text"].strip())
    return texts, n


def _embedder(name: str, dim: int) -> Embedder:
    args = {"dim": dim} if name == "hashing" else {}
    emb = build_embedder(name, args)
    load = getattr(emb, "load", None)
    if callable(load):
        load()
    return emb


def chunk_texts(name: str, dim: int, texts: list[str], embedder: Embedder) -> list[str]:
    """The chunks the pipeline embeds for ``texts``: normalized, split by its splitter.

    The bare embedder is timed on these, so that both sides embed the same
    texts: a model with a short window (MiniLM) embeds several chunks of a long
    document, where embedding the document whole would truncate it.
    """
    overrides: dict[str, Any] = {"embedder.class": name}
    if name == "hashing":
        overrides["embedder.args"] = {"dim": dim}
    settings = load_settings(overrides=overrides, environ={})
    splitter = build_splitter(settings, embedder)
    return [chunk for text in texts for chunk in splitter.split(normalize_text(text))]


def time_embedder(name: str, dim: int, texts: list[str], batch: int) -> float:
    """Seconds for a fresh embedder to embed ``texts`` in batches of ``batch``."""
    emb = _embedder(name, dim)
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        emb.embed_many(texts[i : i + batch])
    return time.perf_counter() - started


def _proc_cpu_s(pid: int | None) -> float:
    """User plus system CPU seconds of process ``pid`` so far (0 when it is gone or None)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # utime and stime: fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_pipeline(
    name: str,
    dim: int,
    jsonl: Path,
    batch: int,
    state: Path,
    index_kind: str = "lsm",
    extra: dict[str, Any] | None = None,
    cpu: dict[str, float] | None = None,
) -> tuple[float, Service]:
    """Seconds for a fresh Service to replay ``jsonl``, and the service.

    ``cpu``, when given, is filled with the CPU seconds each role used during the
    replay: the pipeline's own thread (this one: reading and committing), the
    index's maintenance thread, the embedding worker process (embedding ahead;
    its start included) and the process's other threads (the worker's pipes,
    the file watch, scan helpers).
    """
    overrides: dict[str, Any] = {
        "embedder.class": name,
        "source.path": str(jsonl),
        "state_dir": str(state),
        "batcher.max_batch_size": batch,
        "index.kind": index_kind,
        **(extra or {}),
    }
    if name == "hashing":
        overrides["embedder.args"] = {"dim": dim}
    service = Service(load_settings(overrides=overrides, environ={}))
    load = getattr(service.embedder, "load", None)
    if callable(load):
        load()
    threads0, own0 = thread_cpu_seconds(), time.thread_time()
    started = time.perf_counter()
    service.pipeline.run_until_caught_up()
    elapsed = time.perf_counter() - started
    if cpu is not None:
        own = time.thread_time() - own0
        threads = thread_cpu_seconds()
        ahead = service.pipeline.embedding.ahead
        maint = threads.get(MAINTENANCE_THREAD, 0.0) - threads0.get(MAINTENANCE_THREAD, 0.0)
        everything = sum(threads.values()) - sum(threads0.values())
        cpu.update(
            pipeline_thread=own,
            maintenance=maint,
            embedding_worker=_proc_cpu_s(ahead.pid if ahead is not None else None),
            other_threads=max(0.0, everything - own - maint),
        )
    service.pipeline.close()
    return elapsed, service


def time_search(service: Service, queries: list[str], k: int) -> dict[str, float]:
    """In-process ``Service.retrieve_many`` latency for 1 and 16 queries per call (no HTTP).

    Timed once index maintenance is idle: steady state. Right after a bulk load
    the default index still builds its half-precision copies, on the other core
    and with the interpreter lock now and then; searches timed meanwhile measure that.
    """
    settled = wait_idle(lambda: thread_cpu_seconds().get(MAINTENANCE_THREAD, 0.0))
    flt = SearchFilter(tenant=service.settings.ingest.default_tenant)
    out: dict[str, float] = {"settle_s": -1.0 if settled is None else settled}
    for size, calls in ((1, 1000), (16, 100)):
        times = []
        for c in range(calls):
            i = (c * size) % max(1, len(queries) - size)
            t0 = time.perf_counter()
            service.retrieve_many(queries[i : i + size], k, flt)
            times.append(time.perf_counter() - t0)
        ms = float(np.median(times) * 1000)
        out[f"batch{size}_median_ms"] = ms
        out[f"batch{size}_p99_ms"] = float(np.percentile(times, 99) * 1000)
        out[f"batch{size}_qps_bound"] = size / (ms / 1000)
    return out


def time_search_against(
    services: dict[str, Service], queries: list[str], k: int, rounds: int = 6
) -> dict[str, Any]:
    """Two or more services over the same documents, searched in alternated rounds.

    Each round times ``_AB_CALLS`` single-query calls and a tenth as many
    16-query calls against every service in turn, the order reversed every other
    round, so that a slow moment of a shared machine falls on both. Per service:
    the median of each round's median, and the rounds. Call once every service's
    maintenance is idle.
    """
    names = list(services)
    flt = {n: SearchFilter(tenant=s.settings.ingest.default_tenant) for n, s in services.items()}
    got: dict[str, dict[int, list[float]]] = {n: {1: [], 16: []} for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            service = services[name]
            for size, calls in ((1, _AB_CALLS), (16, _AB_CALLS // 10)):
                times = []
                for c in range(calls):
                    i = (c * 7 * size + r) % max(1, len(queries) - size)
                    t0 = time.perf_counter()
                    service.retrieve_many(queries[i : i + size], k, flt[name])
                    times.append(time.perf_counter() - t0)
                got[name][size].append(float(np.median(times) * 1000))
    return {
        "rounds": rounds,
        "calls_per_round": _AB_CALLS,
        "kinds": {
            name: {
                f"batch{size}_{what}": value
                for size in (1, 16)
                for what, value in (
                    ("median_ms", float(np.median(got[name][size]))),
                    ("rounds_ms", got[name][size]),
                )
            }
            for name in names
        },
    }


_AB_CALLS = 200


def main(argv: list[str] | None = None) -> int:
    """Run the repeats and print the JSON result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jsonl", type=Path, required=True)
    p.add_argument("--embedder", default="hashing", help="hashing | minilm")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--label", default="")
    p.add_argument("--queries", type=Path, help="JSON list of queries: also time search")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--index-kind", default="lsm", help="lsm (the default) | exact")
    p.add_argument(
        "--against",
        help="with --queries: also build a service with this index kind (e.g. exact) "
        "on the last repeat and search both in alternated rounds",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another setting for the pipeline (dotted key, YAML value), e.g. embedder.ahead=off",
    )
    a = p.parse_args(argv)
    extra = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in a.set)}
    tag = f"[ingest {a.label or a.embedder}]"
    # The process is set up as `streamrag run` sets up its own (the garbage collector's
    # young threshold, ingest.gc_young), for the bare embedder and the pipeline alike.
    tune_collector(load_settings(overrides=extra, environ={}).ingest)

    docs, lines = read_upsert_texts(a.jsonl)
    if a.embedder != "hashing":
        print(f"{tag} loading {a.embedder} …", file=sys.stderr, flush=True)
    warm = _embedder(a.embedder, a.dim)  # imports and warms the model files once
    texts = chunk_texts(a.embedder, a.dim, docs, warm)  # counted in the model's tokens
    del warm
    gc.collect()
    baseline = proc_status_kib()
    raw_s: list[float] = []
    pipe_s: list[float] = []
    cpus: list[dict[str, float]] = []
    counts: dict[str, Any] = {}
    search: dict[str, float] | None = None
    against: dict[str, Any] | None = None
    peak: dict[str, int] | None = None
    with tempfile.TemporaryDirectory(prefix="streamrag-bench-") as tmp:
        for r in range(a.repeats):
            raw_s.append(time_embedder(a.embedder, a.dim, texts, a.batch))
            gc.collect()
            cpus.append({})
            elapsed, service = time_pipeline(
                *(a.embedder, a.dim, a.jsonl, a.batch, Path(tmp) / f"state{r}", a.index_kind),
                extra,
                cpus[-1],
            )
            pipe_s.append(elapsed)
            body = service.status()
            counts = {"counts": body["counts"], "index": body["index"]}
            if a.queries is not None and r == a.repeats - 1:
                qs = json.loads(a.queries.read_text())
                search = time_search(service, qs, a.k)
                print(f"{tag} in-process search: {search}", file=sys.stderr, flush=True)
                if a.against:
                    peak = proc_status_kib()  # the pipeline's own peak, before a second index
                    _, other = time_pipeline(
                        *(a.embedder, a.dim, a.jsonl, a.batch, Path(tmp) / "against", a.against),
                        extra,
                    )
                    wait_idle(lambda: thread_cpu_seconds().get(MAINTENANCE_THREAD, 0.0))
                    pair = {a.index_kind: service, a.against: other}
                    against = time_search_against(pair, qs, a.k)
                    print(f"{tag} alternated: {against}", file=sys.stderr, flush=True)
                    other.stop()
            service.stop()  # stops the index's maintenance thread
            del service
            gc.collect()
            print(
                f"{tag} repeat {r + 1}/{a.repeats}: embedder {len(texts) / raw_s[-1]:,.0f} docs/s, "
                f"pipeline {lines / pipe_s[-1]:,.0f} changes/s",
                file=sys.stderr,
                flush=True,
            )
    peak = peak or proc_status_kib()
    best_raw = len(texts) / min(raw_s)
    best_pipe = lines / min(pipe_s)
    result = {
        "embedder": a.embedder,
        "index_kind": a.index_kind,
        "settings": extra,
        "changes": lines,
        "texts": len(texts),
        "documents": len(docs),
        "batch": a.batch,
        "repeats": a.repeats,
        "embedder_seconds": raw_s,
        "pipeline_seconds": pipe_s,
        "embedder_docs_per_s": best_raw,
        "pipeline_changes_per_s": best_pipe,
        "pipeline_texts_per_s": len(texts) / min(pipe_s),
        # Same texts embedded both ways: the ratio of times is the pipeline's efficiency.
        "ratio": min(raw_s) / min(pipe_s),
        # Each repeat times the embedder and then the pipeline back to back: the
        # median of those paired ratios is less sensitive to a lucky or unlucky run.
        "ratio_paired_median": float(
            np.median([r / q for r, q in zip(raw_s, pipe_s, strict=True)])
        ),
        "final": counts,
        "search": search,
        "search_against": against,
        # Where the CPU went in each repeat, by role (seconds; time_pipeline), and in the
        # fastest repeat per change: what the two cores spent beside the embedder's work.
        "cpu_by_role_s": cpus,
        "cpu_per_change_us": {
            role: seconds / lines * 1e6 for role, seconds in cpus[pipe_s.index(min(pipe_s))].items()
        },
        "rss_baseline_mib": baseline.get("VmRSS", 0) / 1024,
        "peak_rss_mib": peak.get("VmHWM", 0) / 1024,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
