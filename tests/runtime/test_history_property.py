"""History is true whatever the arrival order and the micro-batch cuts (a property test).

Hypothesis generates change streams of a few documents — edits, deletes,
re-creations, equal event times, changes that arrive late within a bound — and
feeds each one in two arrival orders, through a live pipeline cut into random
micro-batches (with a clean restart or a crash on the way) and through
``replay``. Every ``as_of`` answer at every event time, at several epochs, must
equal a brute-force bitemporal reference: as of T at epoch E, a document shows
the change with the greatest ``(event_time, offset)`` at or before T among the
changes committed by E, and exists iff that change is an upsert.
"""

from __future__ import annotations

import random
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.config import Settings, load_settings
from streamrag.index.base import CommitBatch, CommitResult, SearchFilter
from streamrag.runtime.replay import replay
from streamrag.runtime.service import Service
from streamrag.testing import ManualClock, change_line
from streamrag.timing import US_PER_S

DOCS = ["a", "b", "c", "d"]
WORDS = ["red", "green", "blue", "amber", "teal"]
LATENESS_S = 6


@dataclass(frozen=True)
class Change:
    doc: str
    delete: bool
    time_s: int
    text: str


def _text(words: list[str]) -> str:
    return " ".join(words)


changes = st.lists(
    st.builds(
        Change,
        st.sampled_from(DOCS),
        st.sampled_from([False, False, False, True]),
        st.integers(1, 30),  # few distinct times: equal event times are common
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=9).map(_text),
    ),
    min_size=12,
    max_size=40,
)


def _arrival(stream: list[Change], seed: int) -> list[Change]:
    """The stream in event-time order, each change delayed by up to LATENESS_S."""
    rng = random.Random(seed)
    keyed = [(c.time_s + rng.uniform(0, LATENESS_S), i, c) for i, c in enumerate(stream)]
    return [c for _, _, c in sorted(keyed)]


def _write(path: Path, arrival: list[Change]) -> list[tuple[int, Change]]:
    """Write the changes as JSONL; returns each change with its byte offset."""
    out, data, at = [], b"", 0
    for c in arrival:
        if c.delete:
            line = change_line(c.doc, c.time_s, op="delete")
        else:
            line = change_line(c.doc, c.time_s, c.text)
        raw = (line + "\n").encode()
        out.append((at, c))
        data += raw
        at += len(raw)
    path.write_bytes(data)
    return out


def _settings(path: Path, state: Path, batch: int) -> Settings:
    return load_settings(
        overrides={
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
            "chunking.max_tokens": 4,
            "chunking.overlap_tokens": 1,
            "chunking.tokens": "words",
            "batcher.max_batch_size": batch,
            "batcher.max_delay_ms": 5,
            "event_time.max_out_of_orderness_ms": LATENESS_S * 1000,
            "index.retention_s": 10**8,
            "index.checkpoint_every": 3,
            "index.seal_rows": 5,
            "index.ann": "exact",
            "source.path": str(path),
            "state_dir": str(state),
        },
        environ={},
    )


def _expected(
    offsets: list[tuple[int, Change]], committed: set[int], as_of_s: int
) -> dict[str, tuple[int, int]]:
    """The brute-force reference: per document, the version in force, if it exists."""
    best: dict[str, tuple[int, int, Change]] = {}
    for off, c in offsets:
        if off not in committed or c.time_s > as_of_s:
            continue
        b = best.get(c.doc)
        if b is None or (c.time_s, off) > (b[0], b[1]):
            best[c.doc] = (c.time_s, off, c)
    return {doc: (t * US_PER_S, off) for doc, (t, off, c) in best.items() if not c.delete}


def _answer(service: Service, epoch: int, as_of_s: int) -> dict[str, tuple[int, int]]:
    """What the index says, checked to be one whole version per document."""
    q = np.ones((1, service.index.dim), dtype=np.float32) / np.sqrt(service.index.dim)
    flt = SearchFilter(epoch=epoch, as_of_us=as_of_s * US_PER_S)
    _, hits = service.index.search_many(q, 500, flt)
    found: dict[str, set[tuple[int, int]]] = defaultdict(set)
    chunks: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for h in hits[0]:
        found[h.doc_id].add((h.event_time, h.offset))
        chunks[h.doc_id].append((h.position, h.text))
    out = {}
    for doc, versions in found.items():
        assert len(versions) == 1, (doc, versions)  # never two versions at once
        out[doc] = versions.pop()
        positions = sorted(p for p, _ in chunks[doc])
        assert positions == list(range(len(positions))), (doc, positions)  # whole versions
    return out


def _check(
    service: Service,
    offsets: list[tuple[int, Change]],
    epochs: dict[int, set[int]],
    texts: dict[int, str],
    label: str,
) -> None:
    times = range(0, 32)
    for epoch, committed in epochs.items():
        for t in times:
            got = _answer(service, epoch, t)
            want = _expected(offsets, committed, t)
            assert got == want, (label, epoch, t, got, want)
    # The text served is the version's own text.
    latest = max(epochs)
    for t in times:
        q = np.ones((1, service.index.dim), dtype=np.float32)
        _, hits = service.index.search_many(q, 500, SearchFilter(epoch=latest, as_of_us=t * 10**6))
        for h in hits[0]:
            assert h.text in texts[h.offset], (label, h.text, texts[h.offset])


def _live(path: Path, state: Path, rng: random.Random, arrival: list[Change]) -> Any:
    """A live run cut at random; returns the service and what each epoch committed."""
    offsets = _write(path, arrival)
    data = path.read_bytes()
    path.write_bytes(b"")
    ends = [off for off, _ in offsets[1:]] + [len(data)]
    batch = rng.choice([1, 2, 3, 5, 8])
    clock = ManualClock(1_800_000_000 * US_PER_S)
    committed: dict[int, set[int]] = {}
    seen: set[int] = set()
    past = [0]

    def hook(b: CommitBatch, r: CommitResult) -> None:
        seen.update(d.offset for d in b.docs)
        committed[r.epoch] = set(seen)
        past[0] += r.past_docs

    def open_service() -> Service:
        svc = Service(_settings(path, state, batch), clock=clock)
        svc.pipeline.on_commit.append(hook)
        return svc

    service = open_service()
    restart_at = rng.randrange(len(arrival) + 1)
    written = 0
    while written < len(arrival):
        n = rng.randrange(1, 5)
        upto = min(len(arrival), written + n)
        with path.open("ab") as f:
            f.write(data[offsets[written][0] : ends[upto - 1]])
        written = upto
        for _ in range(rng.randrange(1, 3)):
            clock.advance_ms(rng.choice([0, 2, 7]))
            service.pipeline.poll()
            service.pipeline.flush(force=rng.random() < 0.4)
        if 0 <= restart_at <= written:
            restart_at = -1
            if rng.random() < 0.5:  # a clean stop: commit, checkpoint
                service.pipeline.close()
                service.index.close()
            else:  # a crash: nothing pending is committed, no checkpoint
                service.index.abandon()
                service.pipeline.reader.close()
                service.pipeline.dead_letters.close()
            service = open_service()
    service.pipeline.run_until_caught_up(final=True)
    service.pipeline.close()
    # The pipeline's count (restored from the cursor after a restart) is the index's.
    assert service.pipeline.stats.past_versions == past[0]
    return service, offsets, committed


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(stream=changes, seed=st.integers(0, 2**16))
def test_every_as_of_answer_matches_the_bitemporal_reference(
    stream: list[Change], seed: int
) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="streamrag-history-") as tmp:
        root = Path(tmp)
        for order in range(2):
            arrival = _arrival(stream, seed * 2 + order)
            path = root / f"order{order}.jsonl"
            service, offsets, committed = _live(path, root / f"live{order}", rng, arrival)
            texts = {off: c.text for off, c in offsets}
            # Every change was committed once the stream was caught up.
            assert set().union(*committed.values()) == {off for off, _ in offsets}
            # Several epochs, the last included (epochs undone by a crash are gone).
            epochs = sorted(committed)
            picked = {*rng.sample(epochs, min(4, len(epochs))), epochs[-1]}
            sample = {e: committed[e] for e in picked}
            _check(service, offsets, sample, texts, f"live order {order}")
            service.index.close()

            # The same file as one bounded batch: the same answers at its last epoch.
            batch = replay(_settings(path, root / f"replay{order}", 64)).service
            everything = {off for off, _ in offsets}
            _check(batch, offsets, {batch.index.epoch: everything}, texts, f"replay order {order}")
            batch.index.close()
