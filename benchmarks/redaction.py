"""PII redaction: recall and precision per entity type, throughput, and Presidio for comparison.

What is measured:

* **planted** — ``streamrag.ingest.pii.planted``: documents with values of every
  entity type planted at known spans (valid by construction: Luhn, mod 97,
  GB 11643, assigned country codes) and decoys that must not match (numbers one
  digit off their check digit, wrong IBAN check digits, identity numbers born on
  30 February, ``1.2.3.4.5``, dates, times, order numbers, MAC addresses,
  placeholder tokens, ...). Per entity type: recall (planted values found with
  their exact span), precision (finds that are a planted value), and the decoys
  matched, by kind. Goal: recall 1.0 on every validated type, no decoy.
* **sample** — the bundled demo corpus (``src/streamrag/data``): every text,
  title and metadata value. Goal: nothing found (it holds no personal data).
* **throughput** — MB/s of text through ``Redactor.redact`` document by
  document, on the planted corpus (dense: several values per document), the
  sample corpus, the benchmark workload's prose (``workload.py``) and log-like
  lines full of short numbers (:func:`short_numbers`); best of 3.
  And the pipeline (hashing embedder, 20,000 workload documents, and as many
  log-like lines) with redaction on against off in three alternated pairs:
  what it costs where the embedder is fastest.
* **presidio** — the raw library and best peer: presidio-analyzer's pattern
  recognizers (e-mail, phone with the default regions and CN, credit card, IBAN,
  IP) on the same planted corpus, scored by overlap (its spans may include or
  leave out a bracket), with its throughput; ratios streamrag / Presidio.
  Presidio has no recognizer for PRC identity numbers or secrets. Skipped when
  the package is not installed (``pip install 'streamrag[pii]'``).

Run: ``.venv/bin/python benchmarks/redaction.py`` (about a minute on 2 shared
cores). Writes ``results/redaction.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from importlib import metadata, resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info
from workload import WorkloadSpec, make_workload

from streamrag.config import load_settings
from streamrag.config.redaction import VALIDATED_ENTITIES, RedactionSettings
from streamrag.ingest.pii import Redactor
from streamrag.ingest.pii.planted import PlantedDoc, planted_corpus

HERE = Path(__file__).resolve().parent
PRESIDIO_TYPES = {
    "EMAIL_ADDRESS": "EMAIL",
    "PHONE_NUMBER": "PHONE",
    "CREDIT_CARD": "CARD",
    "IBAN_CODE": "IBAN",
    "IP_ADDRESS": "IP",
}
Finder = Callable[[str], list[tuple[int, int, str]]]


def _streamrag_finder(redactor: Redactor) -> Finder:
    return lambda text: [(s.start, s.end, s.entity) for s in redactor.find(text)]


def score(docs: list[PlantedDoc], find: Finder, *, exact: bool) -> dict[str, Any]:
    """Recall and precision per entity type, and decoys matched by kind."""
    planted: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    found: Counter[str] = Counter()
    wrong: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    decoys: Counter[str] = Counter()
    decoy_hits: Counter[str] = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    for doc in docs:
        spans = find(doc.text)
        for start, end, entity in spans:
            found[entity] += 1
            if not any(_match(start, end, p.start, p.end, exact) for p in doc.planted
                       if p.entity == entity):  # fmt: skip
                wrong[entity] += 1
                if len(examples[entity]) < 3:
                    examples[entity].append(doc.text[start:end])
        for p in doc.planted:
            planted[p.entity] += 1
            by_kind[p.kind]["planted"] += 1
            if any(e == p.entity and _match(s, t, p.start, p.end, exact) for s, t, e in spans):
                hit[p.entity] += 1
                by_kind[p.kind]["found"] += 1
        for d in doc.decoys:
            decoys[d.kind] += 1
            if any(s < d.end and d.start < t for s, t, _ in spans):
                decoy_hits[d.kind] += 1
    per_type = {}
    for entity in sorted(planted):
        per_type[entity] = {
            "planted": planted[entity],
            "found": hit[entity],
            "recall": round(hit[entity] / planted[entity], 4),
            "finds": found[entity],
            "false_positives": wrong[entity],
            "precision": round(1 - wrong[entity] / found[entity], 4) if found[entity] else None,
            "false_positive_examples": examples.get(entity, []),
        }
    return {
        "match": "exact span" if exact else "overlapping span",
        "per_type": per_type,
        "per_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "decoys": {k: {"placed": decoys[k], "matched": decoy_hits[k]} for k in sorted(decoys)},
        "decoys_matched": sum(decoy_hits.values()),
    }


def _match(s: int, e: int, ps: int, pe: int, exact: bool) -> bool:
    return (s, e) == (ps, pe) if exact else s < pe and ps < e


def sample_texts() -> list[str]:
    """Every text, title, doc id and metadata value of the bundled demo corpus."""
    data = resources.files("streamrag") / "data" / "sample_changes.jsonl"
    out = []
    for line in data.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # the demo's deliberately broken lines
        out += [str(rec.get(k, "")) for k in ("text", "title", "doc_id")]
        out.append(json.dumps(rec.get("metadata") or {}))
    return [t for t in out if t]


def short_numbers(n: int, seed: int = 0) -> list[str]:
    """Log-like lines full of short numbers (ids, counts, times) and no personal data.

    Every number detector's prefilter lets such text through (it holds many
    digits); only the shape of the numbers rules it out.
    """
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [f"w{rng.randrange(2000)}" for _ in range(30)]
        out.append(
            f"12:{i % 60:02d}:{rng.randrange(60):02d} worker-{rng.randrange(16)} job {i} "
            f"took {rng.randrange(1, 999)} ms, {rng.randrange(100)} retries, batch "
            f"{rng.randrange(10_000)} of {rng.randrange(10_000, 99_999)}: " + " ".join(words)
        )
    return out


def throughput(texts: list[str], run: Callable[[str], object], repeats: int = 3) -> dict[str, Any]:
    """MB/s of text and documents/s through ``run``, one document at a time; best of repeats."""
    size = sum(len(t.encode("utf-8")) for t in texts)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in texts:
            run(t)
        best = min(best, time.perf_counter() - t0)
    return {
        "docs": len(texts),
        "mb": round(size / 1e6, 3),
        "mb_per_s": round(size / best / 1e6, 2),
        "docs_per_s": round(len(texts) / best),
        "us_per_doc": round(best / len(texts) * 1e6, 2),
    }


def pipeline_cost(n_docs: int, repeats: int = 3, texts: list[str] | None = None) -> dict[str, Any]:
    """The hashing-embedder pipeline, redaction on and off, in alternated pairs.

    Over workload documents (prose), or one change per text of ``texts``. The
    ratio is the median over the pairs of on-time / off-time (each pair run
    back to back, so that load drifts hit both); the times are the best of each.
    """
    from streamrag.runtime.service import Service

    out: dict[str, Any] = {"changes": n_docs}
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "changes.jsonl"
        if texts is None:
            spec = WorkloadSpec(n_docs=n_docs, update_fraction=0, delete_fraction=0)
            make_workload(spec).write(data)
        else:
            lines = (
                json.dumps({"doc_id": f"line-{i}", "event_time": 1_714_521_600 + i, "text": t})
                for i, t in enumerate(texts[:n_docs])
            )
            data.write_text("".join(line + "\n" for line in lines))
        for on in (True, False) * repeats:  # interleaved, so that load drifts hit both
            settings = load_settings(
                overrides={
                    "source.path": str(data),
                    "state_dir": str(Path(tmp) / f"state-{time.perf_counter_ns()}"),
                    "embedder.class": "hashing",
                    "embedder.args": {"dim": 384},
                    "index.kind": "exact",
                    "audit.enabled": False,
                    "redaction.enabled": on,
                },
                environ={},
            )
            svc = Service(settings)
            t0 = time.perf_counter()
            svc.pipeline.run_until_caught_up()
            dt = time.perf_counter() - t0
            svc.stop()
            key = "on" if on else "off"
            out[f"{key}_s"] = min(out.get(f"{key}_s", float("inf")), round(dt, 3))
            times.append(dt)
    ratios = [times[i] / times[i + 1] for i in range(0, len(times), 2)]
    out["on_changes_per_s"] = round(n_docs / out["on_s"])
    out["off_changes_per_s"] = round(n_docs / out["off_s"])
    out["pair_ratios"] = [round(r, 3) for r in ratios]
    out["on_over_off_time"] = round(statistics.median(ratios), 3)
    return out


def presidio_finder() -> tuple[Finder, dict[str, Any]]:
    """Presidio's pattern recognizers, run directly (no NLP engine: patterns and validation)."""
    import tldextract
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
    )

    # The e-mail recognizer asks tldextract, which would fetch the public suffix list:
    # use the snapshot inside the package (nothing is fetched).
    tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=())
    regions = (*PhoneRecognizer.DEFAULT_SUPPORTED_REGIONS, "CN")
    recognizers = [
        EmailRecognizer(),
        PhoneRecognizer(supported_regions=regions),
        CreditCardRecognizer(),
        IbanRecognizer(),
        IpRecognizer(),
    ]

    def find(text: str) -> list[tuple[int, int, str]]:
        out = []
        for rec in recognizers:
            for r in rec.analyze(text, rec.supported_entities, None):
                entity = PRESIDIO_TYPES.get(r.entity_type)
                if entity is not None and r.score > 0:
                    out.append((int(r.start), int(r.end), entity))
        return out

    about = {
        "version": metadata.version("presidio-analyzer"),
        "recognizers": [type(r).__name__ for r in recognizers],
        "phone_regions": list(regions),
        "note": "recognizers called directly with every score above 0 kept; no NLP engine, so "
        "no context words and no names (those need a spaCy model)",
    }
    return find, about


def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """streamrag / Presidio, per entity type both cover."""
    out = {}
    for entity, o in ours["per_type"].items():
        t = theirs["per_type"].get(entity)
        if t is None:
            out[entity] = "not covered by Presidio's recognizers"
            continue
        out[entity] = {
            "recall": [o["recall"], t["recall"]],
            "precision": [o["precision"], t["precision"]],
            "recall_ratio": round(o["recall"] / t["recall"], 3) if t["recall"] else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--docs", type=int, default=2000, help="planted documents")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--pipeline-docs", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="redaction")
    a = ap.parse_args()
    t_start = time.perf_counter()
    redactor = Redactor.from_settings(RedactionSettings(), environ={})
    assert redactor is not None
    docs = planted_corpus(a.docs, seed=a.seed)
    ours = score(docs, _streamrag_finder(redactor), exact=True)
    ours_overlap = score(docs, _streamrag_finder(redactor), exact=False)
    print("planted:", {e: (r["recall"], r["precision"]) for e, r in ours["per_type"].items()},
          "decoys matched", ours["decoys_matched"], file=sys.stderr, flush=True)  # fmt: skip
    sample = sample_texts()
    sample_finds = [(t[s.start : s.end], s.entity) for t in sample for s in redactor.find(t)]
    prose = make_workload(WorkloadSpec(n_docs=3000)).upsert_texts
    planted_texts = [d.text for d in docs]

    def redact(text: str) -> object:
        return redactor.redact({"text": text})

    speed = {
        "planted": throughput(planted_texts, redact),
        "sample": throughput(sample * 5, redact),
        "workload_prose": throughput(prose, redact),
        "short_numbers": throughput(short_numbers(3000), redact),
    }
    print("throughput:", {k: v["mb_per_s"] for k, v in speed.items()}, "MB/s", file=sys.stderr)
    cost = pipeline_cost(a.pipeline_docs)
    print("pipeline on/off:", cost["on_over_off_time"], file=sys.stderr, flush=True)
    numbers_cost = pipeline_cost(a.pipeline_docs, texts=short_numbers(a.pipeline_docs, seed=1))
    print("on short numbers:", numbers_cost["on_over_off_time"], file=sys.stderr, flush=True)
    res: dict[str, Any] = {
        "benchmark": "redaction",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "machine": machine_info(),
        "detectors": list(RedactionSettings().detectors),
        "validated_types": list(VALIDATED_ENTITIES),
        "planted": {
            "docs": len(docs),
            "seed": a.seed,
            "values": sum(len(d.planted) for d in docs),
            "decoys": sum(len(d.decoys) for d in docs),
            "streamrag": ours,
            "streamrag_overlap": {"per_type": ours_overlap["per_type"]},
        },
        "sample": {"texts": len(sample), "finds": len(sample_finds), "examples": sample_finds[:5]},
        "throughput": speed,
        "pipeline": cost,
        "pipeline_short_numbers": numbers_cost,
    }
    if importlib.util.find_spec("presidio_analyzer") is not None:
        find, about = presidio_finder()
        theirs = score(docs, find, exact=False)
        their_speed = throughput(planted_texts, find, repeats=1)
        their_prose = throughput(prose, find, repeats=1)
        res["presidio"] = {
            **about,
            "planted": theirs,
            "throughput": {"planted": their_speed, "workload_prose": their_prose},
            "ratios": {
                "quality_streamrag_vs_presidio": ratios(ours_overlap, theirs),
                "throughput_planted": round(
                    speed["planted"]["mb_per_s"] / their_speed["mb_per_s"], 2
                ),
                "throughput_workload_prose": round(
                    speed["workload_prose"]["mb_per_s"] / their_prose["mb_per_s"], 2
                ),
            },
        }
        print("presidio:", {e: (r["recall"], r["precision"])
                            for e, r in theirs["per_type"].items()}, file=sys.stderr)  # fmt: skip
    else:
        res["presidio"] = {"skipped": "presidio-analyzer is not installed (streamrag[pii])"}
    res["verdict"] = verdict(res)
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
    print(res["verdict"])


def verdict(res: dict[str, Any]) -> str:
    """One paragraph: the goals, met or not."""
    per = res["planted"]["streamrag"]["per_type"]
    short = [e for e, r in per.items() if r["recall"] < 1.0]
    parts = [
        "recall 1.0 on every validated type" if not short else f"recall below 1.0: {short}",
        f"{res['planted']['streamrag']['decoys_matched']} decoys matched",
        f"{res['sample']['finds']} finds on the sample corpus",
        f"{res['throughput']['workload_prose']['mb_per_s']} MB/s on prose",
        f"pipeline time with redaction x{res['pipeline']['on_over_off_time']}",
        f"x{res['pipeline_short_numbers']['on_over_off_time']} on short numbers",
    ]
    return "; ".join(parts)


def _commit() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


if __name__ == "__main__":
    main()
