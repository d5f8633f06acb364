"""The standard benchmark workload: synthetic documents as a streamrag JSONL change stream.

Everything is derived from one seed, so two runs with the same parameters write
byte-identical files. Words are made up from consonant-vowel syllables and drawn
from a Zipf distribution over the vocabulary, which gives the skewed term
frequencies of real text. Event times increase with the position in the stream,
except that a fraction of lines swap their time with a nearby line (local
disorder, as a real change feed has). After the inserts, a few documents are
updated and a few deleted, so the final state is not simply "every line".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

__all__ = ["Change", "Workload", "WorkloadSpec", "final_state", "make_workload"]

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_EPOCH0 = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of the synthetic stream."""

    n_docs: int = 20_000
    words_per_doc: int = 100
    vocab_size: int = 20_000
    zipf_s: float = 1.07
    n_domains: int = 10
    disorder: float = 0.10
    disorder_window: int = 50
    update_fraction: float = 0.05
    delete_fraction: float = 0.01
    seed: int = 20240601


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the stream."""

    doc_id: str
    op: str
    event_time: str
    text: str
    domain: str

    def to_json(self) -> str:
        """The JSONL line (without newline)."""
        rec: dict[str, str] = {"doc_id": self.doc_id, "op": self.op, "event_time": self.event_time}
        if self.op == "upsert":
            rec["text"] = self.text
            rec["domain"] = self.domain
        return json.dumps(rec, separators=(",", ":"))


@dataclass
class Workload:
    """The generated stream plus what the benchmarks need to query it."""

    spec: WorkloadSpec
    vocab: list[str]
    probs: np.ndarray
    changes: list[Change] = field(default_factory=list)

    @property
    def upsert_texts(self) -> list[str]:
        """Texts of every upsert, in stream order (what the pipeline embeds)."""
        return [c.text for c in self.changes if c.op == "upsert"]

    def write(self, path: Path) -> int:
        """Write the stream as JSONL; return its size in bytes."""
        data = "".join(c.to_json() + "\n" for c in self.changes).encode()
        path.write_bytes(data)
        return len(data)

    def queries(self, n: int, seed: int, lo: int = 3, hi: int = 6) -> list[str]:
        """``n`` queries of ``lo``..``hi`` words drawn from the workload's word distribution."""
        rng = np.random.default_rng(seed)
        lengths = rng.integers(lo, hi + 1, size=n)
        words = rng.choice(len(self.vocab), size=int(lengths.sum()), p=self.probs)
        out: list[str] = []
        pos = 0
        for m in lengths.tolist():
            out.append(" ".join(self.vocab[w] for w in words[pos : pos + m]))
            pos += m
        return out

    def last_event_time(self) -> datetime:
        """The newest event time in the stream."""
        return max(_parse(c.event_time) for c in self.changes)


def _parse(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def format_time(t: datetime) -> str:
    """ISO-8601 with a ``Z``, second precision."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def make_vocab(size: int, rng: np.random.Generator) -> list[str]:
    """``size`` distinct pronounceable made-up words (letters only)."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    base = len(syllables)
    # Number i is written in base len(syllables) with at least two digits; the
    # mapping is a bijection, so words are distinct. A permutation spreads short
    # and long words over the Zipf ranks.
    codes = rng.permutation(size)
    words = []
    for i in codes.tolist():
        digits = [i % base, (i // base) % base]
        rest = i // (base * base)
        while rest:
            digits.append(rest % base)
            rest //= base
        words.append("".join(syllables[d] for d in digits))
    return words


def make_workload(spec: WorkloadSpec) -> Workload:
    """Generate the change stream described by ``spec``, deterministically."""
    rng = np.random.default_rng(spec.seed)
    vocab = make_vocab(spec.vocab_size, rng)
    ranks = np.arange(1, spec.vocab_size + 1, dtype=np.float64)
    probs = ranks**-spec.zipf_s
    probs /= probs.sum()
    n_upd = int(spec.n_docs * spec.update_fraction)
    n_del = int(spec.n_docs * spec.delete_fraction)
    n_texts = spec.n_docs + n_upd
    lengths = rng.integers(
        int(spec.words_per_doc * 0.9), int(spec.words_per_doc * 1.1) + 1, size=n_texts
    )
    words = rng.choice(spec.vocab_size, size=int(lengths.sum()), p=probs)
    texts: list[str] = []
    pos = 0
    for m in lengths.tolist():
        texts.append(" ".join(vocab[w] for w in words[pos : pos + m]))
        pos += m
    domains = rng.integers(0, spec.n_domains, size=n_texts)

    # Stream layout: every document once, then updates and deletes of documents
    # that appeared well before (so that local disorder cannot reorder a later
    # version before its original).
    rows: list[tuple[str, str, int, str]] = []  # doc_id, op, text index, domain
    for i in range(spec.n_docs):
        rows.append((f"doc-{i:06d}", "upsert", i, f"domain-{domains[i]}"))
    margin = 2 * spec.disorder_window
    targets = rng.permutation(max(1, spec.n_docs - margin))[: n_upd + n_del]
    for j, t in enumerate(targets[:n_upd].tolist()):
        ti = spec.n_docs + j
        rows.append((f"doc-{t:06d}", "upsert", ti, f"domain-{domains[ti]}"))
    for t in targets[n_upd : n_upd + n_del].tolist():
        rows.append((f"doc-{t:06d}", "delete", -1, ""))

    times = np.arange(len(rows), dtype=np.int64)  # seconds after _EPOCH0
    n_swap = int(len(rows) * spec.disorder / 2)  # each swap disorders two lines
    firsts = rng.choice(len(rows) - spec.disorder_window - 1, size=n_swap, replace=False)
    offsets = rng.integers(1, spec.disorder_window + 1, size=n_swap)
    for a, d in zip(firsts.tolist(), offsets.tolist(), strict=True):
        b = a + d
        times[a], times[b] = times[b], times[a]

    changes = [
        Change(
            doc_id,
            op,
            format_time(_EPOCH0 + timedelta(seconds=int(t))),
            texts[ti] if ti >= 0 else "",
            domain,
        )
        for (doc_id, op, ti, domain), t in zip(rows, times.tolist(), strict=True)
    ]
    return Workload(spec, vocab, probs, changes)


def final_state(changes: list[Change]) -> dict[str, Change]:
    """Live documents after last-writer-wins by (event time, position); deletes removed."""
    best: dict[str, tuple[tuple[str, int], Change]] = {}
    for pos, c in enumerate(changes):
        key = (c.event_time, pos)
        cur = best.get(c.doc_id)
        if cur is None or key > cur[0]:
            best[c.doc_id] = (key, c)
    return {d: c for d, (_, c) in best.items() if c.op == "upsert"}
