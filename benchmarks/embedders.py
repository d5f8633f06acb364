"""MiniLM three ways — PyTorch, ONNX fp32, ONNX int8 — on one thread: speed and agreement.

For each embedder, in a process of its own (so that torch is loaded only where
it runs, and each peak RSS is its own), on the bundled sample corpus
(``src/streamrag/data/sample_changes.jsonl``; every document fits one chunk, so
its chunk texts are its upsert texts):

1. **the bare model**: passages/s embedding the chunk texts in batches of 32 on
   one thread — the raw library (sentence-transformers' ``encode`` of each
   batch, or a plain ONNX Runtime loop over the same batches, tokenized and
   padded per batch, mean-pooled in numpy) and streamrag's embedder
   (``embed_many`` of each batch), in the same process; the CPU time of the
   process gives the same rates less disturbed by other load on the machine;
2. **ingest through the pipeline**: a fresh ``Service`` over a copy of the
   corpus, embedder configured by ``embedder.class``/``embedder.args``, model
   loaded before the clock starts, ``run_until_caught_up``; passages/s are the
   chunks it embedded over the time, and the ratio to the bare model is that
   of the same round;
3. **single-query latency**: ``embed_many([question])``, 200 calls after 20 of
   warm-up, cycling through questions about the corpus (those of
   ``serving.py``), p50/p99; and ``Service.retrieve_many`` of one question,
   k = 5 (embedding and search, no HTTP);
4. **agreement with PyTorch**: cosine of each text's and question's vector to
   torch's (min, mean), and recall@10 of exact search over the live documents
   (last version of each, deletes applied) with torch's vectors as the truth.

``--repeats`` rounds (3) run the three embedders in turn, so that a noisy
moment of a shared machine hits all of them; throughputs are the best round,
latencies the median of the rounds' percentiles.

Then, per embedder, ``streamrag run`` over the corpus (default serve settings),
driven by ``loadgen.py`` at concurrency 1 (1 s warm-up, 10 s): retrieval end to
end over HTTP. The ONNX files are made first, once, into the run's own cache
(the time that takes is reported too).

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/embedders.py`` (about 8
minutes on 2 shared cores). Writes ``results/embedders.{json,md}``.
``python benchmarks/embedders.py one --name onnx-int8 --work DIR`` is one
embedder's in-process measurements (one JSON object on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import proc_status_kib
from run import machine_info
from server import ServerProcess
from serving import sample_corpus

HERE = Path(__file__).resolve().parent
BATCH = 32
K = 5
QUERY_REPS = 200
QUERY_WARMUP = 20
GOAL_INGEST_VS_TORCH = 2.0
GOAL_RETRIEVE_P50_MS = 10.0


def embedders(cache: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (embedder.class, embedder.args), all on one thread."""
    return {
        "torch": ("minilm", {"threads": 1}),
        "onnx-fp32": ("minilm-onnx", {"precision": "fp32", "threads": 1, "cache_dir": str(cache)}),
        "onnx-int8": ("minilm-onnx", {"precision": "int8", "threads": 1, "cache_dir": str(cache)}),
    }


def log(msg: str) -> None:
    print(f"[embedders] {msg}", file=sys.stderr, flush=True)


def read_corpus(path: Path) -> tuple[list[str], list[int]]:
    """Every distinct upsert text, and which of them the live documents hold."""
    changes = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the corpus carries a few malformed lines on purpose
        if isinstance(rec, dict) and rec.get("doc_id") and rec.get("event_time"):
            changes.append(rec)
    texts = list(dict.fromkeys(r["text"].strip() for r in changes if r.get("text")))
    live: dict[str, str] = {}
    for rec in sorted(changes, key=lambda r: r["event_time"]):  # the newest version wins
        if rec.get("op", "upsert") == "delete":
            live.pop(rec["doc_id"], None)
        elif rec.get("text"):
            live[rec["doc_id"]] = rec["text"].strip()
    return texts, sorted(texts.index(t) for t in live.values())


# -- one embedder, in its own process -----------------------------------------------


def _rate(n: int, run: Any) -> dict[str, Any]:
    """Run ``run()`` once; passages/s by wall clock and by process CPU time."""
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"seconds": wall, "cpu_seconds": cpu, "per_s": n / wall, "cpu_per_s": n / cpu}


def _raw_library(name: str, emb: Any, texts: list[str]) -> Any:
    """A function embedding ``texts`` in batches of 32 with the library alone."""
    if name == "torch":
        model = emb.load()  # the SentenceTransformer itself

        def st() -> None:
            for i in range(0, len(texts), BATCH):
                model.encode(texts[i : i + BATCH], batch_size=BATCH, show_progress_bar=False)

        return st
    from tokenizers import Tokenizer

    from streamrag.embed.onnx_build import load_or_build

    files = load_or_build(emb.cache_dir, emb.precision)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(files.model, options, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_str(files.tokenizer)
    tok.enable_truncation(max_length=256)
    tok.enable_padding()

    def plain() -> None:
        for i in range(0, len(texts), BATCH):
            enc = tok.encode_batch(texts[i : i + BATCH])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            hidden = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            m = mask[:, :, None].astype(np.float32)
            v = (hidden * m).sum(axis=1) / m.sum(axis=1)
            v /= np.linalg.norm(v, axis=1, keepdims=True)

    return plain


def _latency(call: Any, queries: list[str]) -> dict[str, float]:
    for i in range(QUERY_WARMUP):
        call(queries[i % len(queries)])
    times = []
    for i in range(QUERY_REPS):
        q = queries[(i * 7) % len(queries)]
        t0 = time.perf_counter()
        call(q)
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


def one(name: str, work: Path, vectors: bool) -> dict[str, Any]:
    """One round of every in-process measurement of one embedder (see the module docstring)."""
    from streamrag.config import load_settings
    from streamrag.embed.base import build_embedder
    from streamrag.index.base import SearchFilter
    from streamrag.runtime.service import Service

    cls, args = embedders(work / "models")[name]
    source = work / "changes.jsonl"
    texts, _ = read_corpus(source)
    questions = json.loads((work / "queries.json").read_text())
    t0 = time.perf_counter()
    emb = build_embedder(cls, args)
    emb.load()  # type: ignore[attr-defined]
    out: dict[str, Any] = {"name": name, "class": cls, "args": args, "version": emb.version}
    out["load_s"] = time.perf_counter() - t0

    def bare() -> None:
        for i in range(0, len(texts), BATCH):
            emb.embed_many(texts[i : i + BATCH])

    raw = _raw_library(name, emb, texts)
    raw()  # warm-up of both
    bare()
    out["raw"] = _rate(len(texts), raw)
    out["bare"] = _rate(len(texts), bare)
    overrides = {
        "embedder.class": cls,
        "embedder.args": args,
        "source.path": str(source),
        "state_dir": str(work / f"{name}-state-{time.monotonic_ns()}"),
        "answer.cache.enabled": False,
    }
    service = Service(load_settings(overrides=overrides, environ={}))
    service.embedder.load()  # type: ignore[attr-defined]
    t1, c1 = time.perf_counter(), time.process_time()
    service.pipeline.run_until_caught_up()
    seconds, cpu = time.perf_counter() - t1, time.process_time() - c1
    embedded = service.status()["counts"]["chunks_embedded"]
    out["pipeline"] = {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "chunks_embedded": embedded,
        "per_s": embedded / seconds,
        "cpu_per_s": embedded / cpu,
        # Per passage, the pipeline against the bare model just before it.
        "ratio_to_bare": (embedded / seconds) / out["bare"]["per_s"],
    }
    out["query"] = _latency(lambda q: emb.embed_many([q]), questions)
    flt = SearchFilter(tenant=service.settings.ingest.default_tenant)
    out["retrieve_in_process"] = _latency(lambda q: service.retrieve_many([q], K, flt), questions)
    service.stop()
    if vectors:
        texts_v, questions_v = emb.embed_many(texts), emb.embed_many(questions)
        np.savez(work / f"{name}.npz", texts=texts_v, questions=questions_v)
    out["peak_rss_mib"] = proc_status_kib().get("VmHWM", 0) / 1024
    log(
        f"{name}: raw {out['raw']['per_s']:.1f}/s, bare {out['bare']['per_s']:.1f}/s, "
        f"pipeline {out['pipeline']['per_s']:.1f}/s, query p50 {out['query']['p50_ms']:.2f} ms"
    )
    return out


def merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one embedder: the best throughput of each, the median latency."""
    out = dict(rounds[0])
    for key in ("raw", "bare", "pipeline"):
        out[key] = {
            "rounds": [r[key] for r in rounds],
            "per_s": max(r[key]["per_s"] for r in rounds),
            "cpu_per_s": max(r[key]["cpu_per_s"] for r in rounds),
        }
    out["pipeline"]["ratio_to_bare"] = float(
        np.median([r["pipeline"]["ratio_to_bare"] for r in rounds])
    )
    out["pipeline"]["chunks_embedded"] = rounds[-1]["pipeline"]["chunks_embedded"]
    for key in ("query", "retrieve_in_process"):
        out[key] = {
            stat: float(np.median([r[key][stat] for r in rounds])) for stat in ("p50_ms", "p99_ms")
        }
        out[key]["rounds"] = [r[key] for r in rounds]
    out["load_s"] = [r["load_s"] for r in rounds]
    out["peak_rss_mib"] = max(r["peak_rss_mib"] for r in rounds)
    return out


# -- the parent: prepare, run each, serve each, compare ---------------------------


def _run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    sys.stderr.write(done.stderr[-4000:] if done.returncode else "")
    if done.returncode:
        raise RuntimeError(f"{cmd[2:5]} exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def prepare(work: Path) -> dict[str, Any]:
    """Make the ONNX files into the run's cache; the seconds each took, and their sizes."""
    script = (
        "import json, sys, time\n"
        "from streamrag.embed.onnx_build import load_or_build, model_folder\n"
        "out = {}\n"
        "for p in ('fp32', 'int8'):\n"
        "    t = time.perf_counter(); load_or_build(sys.argv[1], p)\n"
        "    out[p + '_build_s'] = time.perf_counter() - t\n"
        "    path = model_folder(sys.argv[1]) / f'model-{p}.onnx'\n"
        "    out[p + '_mib'] = path.stat().st_size / 2**20\n"
        "print(json.dumps(out))\n"
    )
    return _run_json([sys.executable, "-c", script, str(work / "models")], 900)


def serve_c1(name: str, work: Path, duration: float) -> dict[str, Any]:
    """``streamrag run`` with this embedder; loadgen at concurrency 1."""
    cls, args = embedders(work / "models")[name]
    folder = work / f"serve-{name}"
    folder.mkdir()
    settings = {
        "embedder.class": cls,
        "embedder.args": args,
        "answer.cache.enabled": False,
    }
    srv = ServerProcess(folder, work / "changes.jsonl", settings)
    try:
        srv.start()
        with httpx.Client(timeout=30.0) as client:
            ready = srv.wait_caught_up(client, 1, timeout=600)
        cmd = [sys.executable, str(HERE / "loadgen.py"), "--url", srv.url]
        cmd += ["--queries", str(work / "queries.json"), "--concurrency", "1"]
        cmd += ["--duration", str(duration), "--warmup", "1", "-k", str(K)]
        out = _run_json(cmd, duration + 60)
        out["ready_s"] = ready
    finally:
        out_code = srv.stop()
    out["exit"] = out_code
    return out


def quality(work: Path, live: list[int]) -> dict[str, dict[str, float]]:
    """Cosine to torch's vectors and recall@10 against torch's exact top 10."""
    ref = np.load(work / "torch.npz")
    truth = np.argsort(-(ref["questions"] @ ref["texts"][live].T), axis=1)[:, :10]
    out = {}
    for name in ("torch", "onnx-fp32", "onnx-int8"):
        v = np.load(work / f"{name}.npz")
        cos = np.concatenate([np.sum(v[k] * ref[k], axis=1) for k in ("texts", "questions")])
        found = np.argsort(-(v["questions"] @ v["texts"][live].T), axis=1)[:, :10]
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, found, strict=True)])
        out[name] = {
            "cosine_min": float(cos.min()),
            "cosine_mean": float(cos.mean()),
            "recall_at_10": float(recall),
            "texts": len(cos),
            "questions": len(found),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", default="all", choices=["all", "one"])
    p.add_argument("--name", default="onnx-int8")
    p.add_argument("--work", type=Path)
    p.add_argument("--repeats", type=int, default=3, help="rounds over all embedders")
    p.add_argument("--vectors", action="store_true", help="one: save the vectors too")
    p.add_argument("--serve-seconds", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    a = p.parse_args(argv)
    if a.mode == "one":
        print(json.dumps(one(a.name, a.work, a.vectors)))
        return 0
    started = time.perf_counter()
    res: dict[str, Any] = {"machine": machine_info(), "batch": BATCH, "repeats": a.repeats}
    res["versions"] = {
        pkg: metadata.version(pkg)
        for pkg in ("torch", "sentence-transformers", "onnxruntime", "onnx", "tokenizers")
    }
    with tempfile.TemporaryDirectory(prefix="streamrag-embedders-") as tmp:
        work = Path(tmp)
        _, questions = sample_corpus(work / "changes.jsonl")
        (work / "queries.json").write_text(json.dumps(questions))
        texts, live = read_corpus(work / "changes.jsonl")
        res["corpus"] = {"texts": len(texts), "live_docs": len(live), "questions": len(questions)}
        log("making the ONNX files (once)")
        res["build"] = prepare(work)
        log(f"built: {res['build']}")
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in embedders(work)}
        for r in range(a.repeats):  # rounds interleave the embedders: noise hits them all
            for name in rounds:
                log(f"round {r + 1}/{a.repeats}: {name}")
                cmd = [sys.executable, __file__, "one", "--name", name, "--work", str(work)]
                rounds[name].append(_run_json([*cmd, *(["--vectors"] if r == 0 else [])], 1800))
        res["embedders"] = {name: merge(rs) for name, rs in rounds.items()}
        for name in embedders(work / "models"):
            log(f"{name}: streamrag run, loadgen at concurrency 1")
            res["embedders"][name]["http_c1"] = serve_c1(name, work, a.serve_seconds)
        res["quality"] = quality(work, live)
    res["machine"]["loadavg_1m_at_end"] = os.getloadavg()[0]
    res["run_s"] = time.perf_counter() - started
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "embedders.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.out / "embedders.md").write_text(markdown(res))
    log(f"wrote {a.out / 'embedders.md'}")
    return 0


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        )
    except OSError:
        return "?"
    return done.stdout.strip() or "?"


def markdown(res: dict[str, Any]) -> str:
    """The results as a Markdown page."""
    m, e, q, b = res["machine"], res["embedders"], res["quality"], res["build"]
    torch = e["torch"]
    v = res["versions"]
    lines = [
        "# Embedders: MiniLM through PyTorch, ONNX fp32 and ONNX int8",
        "",
        f"`benchmarks/embedders.py`, {m['date_utc']}, commit `{_commit()}`. Machine: "
        f"{m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}; {m['platform']}; load average {m['loadavg_1m_at_start']:.2f} at start, "
        f"{m['loadavg_1m_at_end']:.2f} at end (the machine is shared). torch {v['torch']}, "
        f"sentence-transformers {v['sentence-transformers']}, onnxruntime {v['onnxruntime']}, "
        f"onnx {v['onnx']}, tokenizers {v['tokenizers']}. One thread everywhere. Run time "
        f"{res['run_s']:.0f} s.",
        "",
        f"Corpus: the bundled sample ({res['corpus']['texts']} distinct upsert texts, each one "
        f"chunk; {res['corpus']['live_docs']} live documents), {res['corpus']['questions']} "
        f"questions about it (those of `serving.py`). {res['repeats']} rounds over the three "
        "embedders in turn: throughputs are the best round, latencies the median of the rounds.",
        "",
        "## Speed",
        "",
        "| embedder | raw library, passages/s | streamrag embedder, passages/s (× raw) | "
        "× torch | CPU-time passages/s (× torch) | pipeline ingest, passages/s (× bare) | "
        "pipeline × torch (by CPU time) | query p50 / p99 ms | retrieve in-process p50 / p99 ms | "
        "HTTP c=1 p50 / p99 ms | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in e.values():
        h, bare, raw, pipe = r["http_c1"], r["bare"], r["raw"], r["pipeline"]
        ret, query = r["retrieve_in_process"], r["query"]
        cells = [
            r["version"],
            f"{raw['per_s']:.1f}",
            f"{bare['per_s']:.1f} ({bare['per_s'] / raw['per_s']:.2f})",
            f"{bare['per_s'] / torch['bare']['per_s']:.2f}",
            f"{bare['cpu_per_s']:.1f} ({bare['cpu_per_s'] / torch['bare']['cpu_per_s']:.2f})",
            f"{pipe['per_s']:.1f} ({pipe['ratio_to_bare']:.2f})",
            f"{pipe['per_s'] / torch['pipeline']['per_s']:.2f} "
            f"({pipe['cpu_per_s'] / torch['pipeline']['cpu_per_s']:.2f})",
            f"{query['p50_ms']:.2f} / {query['p99_ms']:.2f}",
            f"{ret['p50_ms']:.2f} / {ret['p99_ms']:.2f}",
            f"{h.get('p50_ms', float('nan')):.2f} / {h.get('p99_ms', float('nan')):.2f}",
            f"{r['peak_rss_mib']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "- *raw library*: sentence-transformers' `encode(batch_size=32)`, or a plain ONNX "
        "Runtime loop over the same batches of 32 in corpus order (padded per batch).",
        "- *streamrag embedder*: `embed_many` over the batches of 32 (the ONNX embedder orders "
        "each call's texts by length; int8 runs each text alone). *CPU-time passages/s* is the "
        "embedder's rate by process CPU time, which other load on the machine disturbs less.",
        "- *pipeline ingest*: a fresh `Service` replaying the corpus (`run_until_caught_up`), "
        "chunks embedded per second; × bare against the bare embedder of the same round "
        "(median); by CPU time: all of the process's threads.",
        "- *query*: `embed_many([question])`; *retrieve in-process*: `Service.retrieve_many` of "
        f"one question, k = {K}; *HTTP c=1*: `streamrag run` with the default serve settings, "
        "`loadgen.py` at concurrency 1, client latency.",
        "",
        "## Agreement with PyTorch",
        "",
        "| embedder | cosine min | cosine mean | recall@10 |",
        "|---|---|---|---|",
    ]
    for name, r in q.items():
        lines.append(
            f"| {e[name]['version']} | {r['cosine_min']:.5f} | {r['cosine_mean']:.5f} | "
            f"{r['recall_at_10']:.4f} |"
        )
    first = next(iter(q.values()))
    lines += [
        "",
        f"Cosine over {first['texts']} vectors (every text and question) against torch's; "
        f"recall@10: exact search of {first['questions']} questions over the live documents, "
        "torch's top 10 as the truth.",
        "",
        "## Making the ONNX files (once per cache)",
        "",
        f"fp32: {b['fp32_build_s']:.1f} s (export with torch, checked against it), "
        f"{b['fp32_mib']:.1f} MiB; int8: {b['int8_build_s']:.1f} s more (calibration, "
        f"smoothing, quantization, checked against fp32), {b['int8_mib']:.1f} MiB.",
        "",
        "## Against the goals",
        "",
    ]
    int8 = e["onnx-int8"]
    ingest_x = int8["pipeline"]["per_s"] / torch["pipeline"]["per_s"]
    http = int8["http_c1"].get("p50_ms", float("nan"))
    lines += [
        f"- Ingest with int8 ≥ {GOAL_INGEST_VS_TORCH:.0f}× torch's: "
        f"{ingest_x:.2f}× — {'met' if ingest_x >= GOAL_INGEST_VS_TORCH else 'not met'}.",
        f"- Retrieval end to end at concurrency 1 ≤ {GOAL_RETRIEVE_P50_MS:.0f} ms p50 (int8): "
        f"{http:.2f} ms — {'met' if http <= GOAL_RETRIEVE_P50_MS else 'not met'}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
