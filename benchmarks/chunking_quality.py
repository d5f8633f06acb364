"""Chunking quality: retrieval with each splitter, MiniLM embeddings, exact search.

Which splitter should streamrag use? This measures recall@k and MRR of the
chunks each one makes, embedded with the real MiniLM model and searched exactly
(cosine over all chunks), on three corpora:

* ``sample`` — ``src/streamrag/data/sample_changes.jsonl`` (272 upserts, plain
  text of at most 63 words, no Markdown). Every document fits one chunk, so the
  splitters are compared by the chunks they make (identical texts give
  identical retrieval); there are no questions to ask of it.
* ``handbooks`` — built here: product handbooks in Markdown (nested ``#``
  headings, code blocks, prose), sections alike from one product to the next
  as in real documentation sets; each question's answer is a fact under one
  heading, and a retrieved chunk is relevant when it holds that fact.
* ``tldr`` — real Markdown: the newest version of tldr pages (CC BY 4.0, from
  ``/work/shared/data/tldr-changes``). A question is an example's description
  (``"Display a calendar for the current year"``); a chunk is relevant when it
  is of that page and holds the example's command.

Splitters: ``tokens`` (TokenSplitter, streamrag's first one), ``text``
(semantic-text-splitter's TextSplitter alone: sentences, no structure),
``markdown`` (its MarkdownSplitter alone: structure, but sections packed
together and no heading path), ``structured`` (StructuredSplitter, one section
per chunk, heading lines kept as written) and ``structured+headers`` (the same
with each chunk headed by its heading path, the default). All count tokens
with MiniLM's tokenizer, ``max_tokens`` 128 and 64, overlap 16 and 8.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/chunking_quality.py``
(about 4 minutes on 2 shared cores). Writes ``results/chunking-quality.{json,md}``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import machine_info

from streamrag.chunking import StructuredSplitter, TokenSplitter

HERE = Path(__file__).resolve().parent
TLDR = Path("/work/shared/data/tldr-changes/events.event.jsonl.gz")
KS = (1, 3, 5, 10)


@dataclass(frozen=True)
class Question:
    """A question, the document its answer is in and a fact the answering chunk holds."""

    text: str
    doc: str
    fact: str


# --- the handbook corpus ---------------------------------------------------

PRODUCTS = [
    "Orbit", "Lumen", "Quarry", "Tessera", "Harbor", "Juniper", "Nimbus", "Vesper",
    "Cobalt", "Meridian", "Saffron", "Tundra",
]  # fmt: skip

FILLER = [
    "Most teams do this once and never touch it again.",
    "The change takes effect without a restart on recent versions.",
    "Keep the defaults unless the operations team asks otherwise.",
    "Every step is logged, so an audit can follow it later.",
    "This is the path the support team tests before each release.",
    "If anything looks different on your machine, stop and ask in the support channel.",
    "The same steps work in a container image built from the official base.",
    "Automation scripts can run these commands unattended.",
    "Read the release notes first when the major version changes.",
    "A dry run shows what would change without changing it.",
]


def _handbook(rng: random.Random, name: str) -> tuple[str, list[Question]]:
    """One product's handbook in Markdown and questions answered under its headings."""
    low = name.lower()
    ports = rng.sample(range(2000, 9999), 3)
    days = rng.randint(3, 90)
    hours = rng.randint(2, 48)
    code = rng.randint(100, 999)
    wait = rng.choice([500, 750, 1500, 2500, 4000, 6000])
    ver = (rng.randint(2, 9), rng.randint(0, 9))
    hh, mm = rng.randint(0, 23), rng.choice([0, 15, 30, 45])
    msi = f"{name}Setup-{ver[0]}.{ver[1]}.msi"
    tap = f"{low}labs/tap"
    envvar = f"{name.upper()}_LOG_LEVEL"
    maxconn = rng.choice([64, 128, 256, 512, 1024])
    region = rng.choice(["eu-west-1", "us-east-2", "ap-south-1", "ca-central-1"])

    def fill(n: int) -> str:
        return " ".join(rng.sample(FILLER, n))

    def named(text_with: str, text_without: str) -> str:
        return text_with if rng.random() < 0.4 else text_without

    doc = f"""# {name} handbook

{name} is the internal service that the platform teams run in {region}. This handbook
covers installing, configuring, operating and upgrading it. {fill(1)}

## Install

{fill(1)}

### Linux

#### Debian and Ubuntu

{named(f"Install {name} from the team repository.", "Install the package from the repository.")}
Add the signing key first, then the package:

```sh
curl -fsSL https://pkg.example.com/{low}.gpg | sudo gpg --dearmor -o /usr/share/keyrings/{low}.gpg
sudo apt-get install {low}-server={ver[0]}.{ver[1]}
```

{fill(2)}

#### Red Hat and Fedora

Use dnf with the RPM repository; the package is signed with the same key.

```sh
sudo dnf install {low}-server-{ver[0]}.{ver[1]}
```

{fill(1)}

### macOS

{named(f"{name} runs on macOS for development only.", "macOS is supported for development only.")}
Install it with Homebrew from the tap `{tap}`: `brew install {tap}/{low}`. {fill(2)}

### Windows

Download the installer `{msi}` and run it as an administrator. The service
registers itself and starts at boot. {fill(1)}

## Configuration

{fill(1)}

### Ports

{named(f"{name} listens", "The service listens")} on three ports. The public API is on
port {ports[0]}, the admin API on port {ports[1]} and the metrics endpoint on port
{ports[2]}. Open only the API port in the firewall. {fill(1)}

### Connections

The connection pool holds at most {maxconn} connections per node. Raise
`max_connections` only together with the database's own limit. {fill(2)}

### Logging

Set the environment variable `{envvar}` to `debug`, `info` or `warn`; the default is
`info`. Logs rotate daily. {fill(1)}

## Operations

### Retention

Data older than {days} days is deleted every night. {fill(1)} A legal hold on a
tenant suspends the deletion for that tenant.

### Backup and restore

{named(f"{name} takes a snapshot", "A snapshot is taken")} every day at
{hh:02d}:{mm:02d} UTC and kept for a month. Restore one with:

```sh
{low}ctl snapshot restore --latest --target /var/lib/{low}
```

{fill(1)}

### Access tokens

API tokens expire after {hours} hours. A service account can refresh its token
before it expires; a person signs in again. {fill(1)}

## Troubleshooting

### Error E{code}

Error E{code} means a lock wait timed out. Raise `lock_wait_ms` to {wait} and
check for long transactions. {fill(1)}

### The service does not start

Check that the data directory `/var/lib/{low}` is owned by the service user and
that no other process holds port {ports[0]}. {fill(1)}

## Upgrade

Upgrades to version {ver[0] + 1}.0 need a schema migration:
run `{low}ctl migrate --to {ver[0] + 1}.0` before starting the new binary.
{fill(2)}
"""
    qs = [
        (f"How do I install {name} on Debian?", f"{low}-server={ver[0]}.{ver[1]}"),
        (f"Which dnf package installs {name} on Fedora?", f"{low}-server-{ver[0]}.{ver[1]}"),
        (f"Which Homebrew tap has {name} for macOS?", f"brew install {tap}/{low}"),
        (f"What is the name of the {name} installer for Windows?", msi),
        (f"Which port does the {name} admin API listen on?", f"admin API on port {ports[1]}"),
        (f"How many connections does the {name} pool allow per node?", f"most {maxconn}"),
        (f"How do I turn on debug logging in {name}?", envvar),
        (f"How long does {name} keep data before deleting it?", f"{days} days"),
        (f"When does {name} take its daily snapshot?", f"{hh:02d}:{mm:02d} UTC"),
        (f"How do I restore a {name} backup?", f"{low}ctl snapshot restore"),
        (f"When do {name} API tokens expire?", f"after {hours} hours"),
        (f"What does error E{code} mean in {name} and how do I fix it?", f"to {wait}"),
        (f"What do I need to do before upgrading {name} to version {ver[0] + 1}?", "migrate"),
    ]
    doc_id = f"handbooks/{low}.md"
    return doc, [Question(q, doc_id, fact) for q, fact in qs]


def handbooks(seed: int = 7) -> tuple[dict[str, str], list[Question]]:
    """The handbook corpus: documents by id and its questions."""
    rng = random.Random(seed)
    docs: dict[str, str] = {}
    questions: list[Question] = []
    for name in PRODUCTS:
        text, qs = _handbook(rng, name)
        docs[f"handbooks/{name.lower()}.md"] = text
        questions.extend(qs)
    return docs, questions


# --- the tldr corpus ---------------------------------------------------------

_EXAMPLE = re.compile(r"^- (.+?):?\s*\n\n`([^`\n]+)`", re.MULTILINE)


def tldr(n_docs: int, n_questions: int, seed: int = 11) -> tuple[dict[str, str], list[Question]]:
    """The newest version of ``n_docs`` tldr pages and questions from their examples."""
    latest: dict[str, str | None] = {}
    with gzip.open(TLDR, "rt") as f:
        for line in f:
            ev = json.loads(line)
            latest[ev["doc_id"]] = ev.get("text") if ev["op"] == "upsert" else None
    pages = sorted((d, t) for d, t in latest.items() if t)
    rng = random.Random(seed)
    docs = dict(rng.sample(pages, n_docs))
    questions = []
    for doc_id, text in docs.items():
        for m in _EXAMPLE.finditer(text):
            desc, cmd = m.group(1).strip(), m.group(2).strip()
            if len(desc.split()) >= 5 and len(cmd) >= 4:
                questions.append(Question(desc, doc_id, cmd))
    rng.shuffle(questions)
    return docs, questions[:n_questions]


# --- splitters and scoring -----------------------------------------------------


def splitters(count: Callable[[str], int], max_tokens: int, overlap: int) -> dict[str, Any]:
    """Each splitter, as a function from a text to its chunks."""
    from semantic_text_splitter import MarkdownSplitter, TextSplitter

    text = TextSplitter.from_callback(count, max_tokens, overlap)
    md = MarkdownSplitter.from_callback(count, max_tokens, overlap)
    return {
        "tokens": TokenSplitter(max_tokens, overlap, count_tokens=count).split,
        "text": text.chunks,
        "markdown": md.chunks,
        "structured": StructuredSplitter(max_tokens, overlap, count, headers=False).split,
        "structured+headers": StructuredSplitter(max_tokens, overlap, count).split,
    }


class Vectors:
    """MiniLM vectors of texts, each text embedded once across all runs."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.cache: dict[str, np.ndarray] = {}
        self.seconds = 0.0

    def of(self, texts: list[str]) -> np.ndarray:
        new = sorted({t for t in texts if t not in self.cache})
        if new:
            t0 = time.perf_counter()
            vecs = self.embedder.embed_many(new)
            self.seconds += time.perf_counter() - t0
            self.cache.update(zip(new, vecs, strict=True))
        return np.stack([self.cache[t] for t in texts])


def _norm(s: str) -> str:
    return " ".join(s.split())


def evaluate(
    split: Callable[[str], list[str]],
    docs: dict[str, str],
    questions: list[Question],
    vectors: Vectors,
    count: Callable[[str], int],
) -> dict[str, Any]:
    """Recall@k, MRR@10 and chunk sizes of one splitter on one corpus."""
    t0 = time.perf_counter()
    chunks: list[tuple[str, str]] = [(d, c) for d, text in docs.items() for c in split(text)]
    split_s = time.perf_counter() - t0
    texts = [c for _, c in chunks]
    mat = vectors.of(texts)
    qv = vectors.of([q.text for q in questions])
    scores = qv @ mat.T
    order = np.argsort(-scores, axis=1)[:, : max(KS)]
    hits = {k: 0 for k in KS}
    rr = 0.0
    for qi, q in enumerate(questions):
        fact = _norm(q.fact)
        for rank, ci in enumerate(order[qi].tolist()):
            doc, text = chunks[ci]
            if doc == q.doc and fact in _norm(text):
                rr += 1 / (rank + 1)
                for k in KS:
                    hits[k] += rank < k
                break
    sizes = [count(t) for t in texts]
    n = max(1, len(questions))
    return {
        **{f"recall@{k}": round(hits[k] / n, 4) for k in KS},
        "mrr@10": round(rr / n, 4),
        "chunks": len(chunks),
        "tokens_mean": round(float(np.mean(sizes)), 1) if sizes else 0,
        "tokens_max": max(sizes) if sizes else 0,
        "split_ms": round(split_s * 1000, 1),
    }


def sample_corpus() -> list[dict[str, Any]]:
    """The upserts of the sample corpus (its lines that are JSON objects with a text)."""
    path = resources.files("streamrag") / "data" / "sample_changes.jsonl"
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        ok = isinstance(rec, dict) and rec.get("op") == "upsert" and "doc_id" in rec
        if ok and isinstance(rec.get("text"), str):
            out.append(rec)
    return out


def sample_section(split: dict[str, Any]) -> dict[str, Any]:
    """How each splitter chunks the sample corpus, against TokenSplitter's chunks."""
    texts = [r["text"] for r in sample_corpus()]
    base = [split["tokens"](t) for t in texts]
    out: dict[str, Any] = {"docs": len(texts)}
    for name, fn in split.items():
        chunks = [fn(t) for t in texts]
        out[name] = {
            "chunks": sum(len(c) for c in chunks),
            "docs_chunked_differently_from_tokens": sum(
                c != b for c, b in zip(chunks, base, strict=True)
            ),
        }
    return out


def markdown_report(res: dict[str, Any]) -> str:
    """The results as a Markdown page."""
    m = res["machine"]
    lines = [
        "# Chunking quality",
        "",
        f"`benchmarks/chunking_quality.py`, {res['date_utc']}, commit `{res['commit']}`. "
        f"Machine: {m['cpu_count']} cores, {m['cpu_model']}, {m['ram_gib']} GiB RAM; "
        f"Python {m['python']}; {m['platform']}. Embedder: {res['embedder']} (CPU), "
        f"exact cosine search over all chunks of a corpus; tokens counted with its "
        f"tokenizer. semantic-text-splitter {res['semantic_text_splitter']}. "
        f"Run time {res['seconds']} s ({res['embed_seconds']} s embedding).",
        "",
        "A question is answered at rank r when the r-th chunk retrieved is of the right",
        "document and holds the answer's fact (handbooks) or the example's command (tldr).",
        "",
    ]
    for corpus in ("handbooks", "tldr"):
        c = res["corpora"][corpus]
        lines += [
            f"## {corpus}: {c['docs']} documents, {c['questions']} questions",
            "",
            c["about"],
            "",
        ]
        for setting, rows in c["results"].items():
            lines += [
                f"### {setting}",
                "",
                "| splitter | recall@1 | recall@3 | recall@5 | recall@10 | MRR@10 | chunks "
                "| tokens mean / max | split ms |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for name, r in rows.items():
                lines.append(
                    f"| {name} | {r['recall@1']:.3f} | {r['recall@3']:.3f} | "
                    f"{r['recall@5']:.3f} | {r['recall@10']:.3f} | {r['mrr@10']:.3f} | "
                    f"{r['chunks']} | {r['tokens_mean']} / {r['tokens_max']} | {r['split_ms']} |"
                )
            lines.append("")
    s = res["corpora"]["sample"]
    lines += [
        f"## sample: {s['docs']} upserts of `sample_changes.jsonl`",
        "",
        "Plain text, at most 63 words a document: every document is one chunk at 128",
        "tokens. Documents whose chunks differ from TokenSplitter's (identical chunks",
        "retrieve identically, so no questions are needed):",
        "",
        "| splitter | chunks | documents chunked differently |",
        "|---|---|---|",
    ]
    for name, r in s.items():
        if isinstance(r, dict):
            lines.append(
                f"| {name} | {r['chunks']} | {r['docs_chunked_differently_from_tokens']} |"
            )
    lines += [
        "",
        "## Verdict",
        "",
        res["verdict"],
        "",
        "Caveat: the handbook corpus is built by this benchmark to have what real",
        "documentation sets have (sections alike across products, the product named",
        "in the heading more than in the text), which is where heading paths help most;",
        "tldr is real Markdown with one heading a page and questions that never name the",
        "page, where structure helps less. Both are small (156 and 200 questions).",
        "",
    ]
    return "\n".join(lines)


def _commit() -> str:
    head = HERE.parent / ".git"
    try:
        import subprocess

        out = subprocess.run(
            ["git", "-C", str(head.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--tldr-docs", type=int, default=300)
    ap.add_argument("--tldr-questions", type=int, default=200)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="chunking-quality")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.perf_counter()
    from streamrag.embed.sentence_transformers import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()  # MiniLM, as embedder.class "minilm" builds it
    embedder.load()
    count = embedder.count_tokens
    vectors = Vectors(embedder)
    hb_docs, hb_q = handbooks()
    corpora: dict[str, Any] = {
        "handbooks": {
            "about": (
                f"{len(PRODUCTS)} product handbooks built by the benchmark (nested headings "
                "four deep, code blocks, prose with filler sentences); sections read alike "
                "from one product to the next and name the product in about 40 % of them, "
                "as in a real documentation set. Each question names the product and asks "
                "a fact that sits under one heading."
            ),
            "docs": len(hb_docs),
            "questions": len(hb_q),
            "data": (hb_docs, hb_q),
        }
    }
    if TLDR.exists():
        td_docs, td_q = tldr(a.tldr_docs, a.tldr_questions)
        corpora["tldr"] = {
            "about": (
                f"{len(td_docs)} pages sampled from tldr-pages (real Markdown: a `#` title, a "
                "`>` description, then examples as a `- description:` line and a `` `command` ``"
                " line). A question is an example's description (5 words or more)."
            ),
            "docs": len(td_docs),
            "questions": len(td_q),
            "data": (td_docs, td_q),
        }
    for c in corpora.values():
        docs, qs = c.pop("data")
        c["results"] = {}
        for max_tokens, overlap in ((128, 16), (64, 8)):
            setting = f"max_tokens {max_tokens}, overlap {overlap}"
            rows = {}
            for name, fn in splitters(count, max_tokens, overlap).items():
                rows[name] = evaluate(fn, docs, qs, vectors, count)
                print(corpus_line(setting, name, rows[name]), flush=True)
            c["results"][setting] = rows
    corpora["sample"] = sample_section(splitters(count, 128, 16))
    res: dict[str, Any] = {
        "benchmark": "chunking_quality",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "machine": machine_info(),
        "embedder": embedder.version,
        "semantic_text_splitter": metadata.version("semantic-text-splitter"),
        "corpora": corpora,
        "seconds": round(time.perf_counter() - t0, 1),
        "embed_seconds": round(vectors.seconds, 1),
        "verdict": verdict(corpora),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.out / f"{a.name}.md").write_text(markdown_report(res))
    print(res["verdict"])


def corpus_line(setting: str, name: str, r: dict[str, Any]) -> str:
    """One progress line."""
    return (
        f"{setting:26} {name:20} R@1 {r['recall@1']:.3f} R@5 {r['recall@5']:.3f} "
        f"MRR {r['mrr@10']:.3f} chunks {r['chunks']}"
    )


def verdict(corpora: dict[str, Any]) -> str:
    """The splitter with the best mean MRR over every corpus and setting."""
    means: dict[str, list[float]] = {}
    for c in corpora.values():
        for rows in c.get("results", {}).values():
            for name, r in rows.items():
                means.setdefault(name, []).append(r["mrr@10"])
    ranked = sorted(means, key=lambda n: -float(np.mean(means[n])))
    parts = [f"{n} {np.mean(means[n]):.3f}" for n in ranked]
    return f"Mean MRR@10 over every corpus and setting: {', '.join(parts)}. Best: {ranked[0]}."


if __name__ == "__main__":
    main()
