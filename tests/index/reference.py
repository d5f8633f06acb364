"""A brute-force reference of the versioned index, and helpers to build commits.

The reference keeps every applied chunk version as a plain Python row with its
bitemporal stamps and answers queries by scoring every row it may see. It
states the index's semantics in the fewest lines: last writer wins per
document, deletes as tombstones, ``as_of`` / ``epoch`` reads within the
retention window, rollback.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamrag.changes import Op
from streamrag.errors import IndexStoreError, QueryError
from streamrag.index import CommitBatch, DocOp, SearchFilter
from streamrag.index.segment import NEVER

MIN = -(2**63)


@dataclass(frozen=True)
class Change:
    """One document change of a commit: ``n`` chunks with vectors from ``seeds``."""

    doc: str
    op: Op
    time: int
    offset: int
    seeds: tuple[int, ...] = ()
    tenant: str = "default"
    domain: str = ""
    metadata: dict[str, Any] | None = None


def unit(seed: int, dim: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def make_batch(changes: list[Change], dim: int) -> CommitBatch:
    docs, ids, pos, texts, hashes, vecs = [], [], [], [], [], []
    for c in changes:
        first = len(texts)
        for p, s in enumerate(c.seeds):
            ids.append(hash((c.tenant, c.doc, p)) & 0x7FFFFFFFFFFFFFFF)
            pos.append(p)
            texts.append(f"{c.doc}@{c.time}:{p}")
            hashes.append(f"{s}".encode())
            vecs.append(unit(s, dim))
        n = len(c.seeds) if c.op == Op.UPSERT else 0
        docs.append(
            DocOp(c.tenant, c.doc, c.op, c.time, c.offset, "src", c.domain, first, n, c.metadata)
        )
    return CommitBatch(
        docs=docs,
        chunk_ids=np.asarray(ids, np.int64),
        positions=np.asarray(pos, np.int32),
        texts=texts,
        hashes=hashes,
        vectors=np.asarray(vecs, np.float32).reshape(-1, dim),
        embedder_version="test",
    )


@dataclass
class Row:
    tenant: str
    doc: str
    position: int
    vector: np.ndarray
    valid_from: int
    offset: int
    created: int
    domain: str
    metadata: dict[str, Any] | None
    sup: int = NEVER
    valid_to: int = NEVER


@dataclass
class Reference:
    """The index's semantics, by brute force."""

    dim: int
    retention: int
    epoch: int = 0
    rows: list[Row] = field(default_factory=list)
    docs: dict[tuple[str, str], tuple[tuple[int, int], bool, list[int]]] = field(
        default_factory=dict
    )
    deletes: list[tuple[str, str, int, int, int]] = field(default_factory=list)
    high: int = MIN
    epoch_high: list[int] = field(default_factory=lambda: [MIN])
    rolled_back: list[tuple[int, int]] = field(default_factory=list)

    def commit(self, changes: list[Change]) -> None:
        self.epoch += 1
        e = self.epoch
        winners: dict[tuple[str, str], Change] = {}
        for c in changes:
            key = (c.tenant, c.doc)
            w = winners.get(key)
            if w is None or (c.time, c.offset) > (w.time, w.offset):
                winners[key] = c
        for key, c in winners.items():
            version = (c.time, c.offset)
            state = self.docs.get(key)
            if state is not None and state[0] >= version:
                continue
            self.high = max(self.high, c.time)
            if state is not None:
                for r in state[2]:
                    self.rows[r].sup = e
                    self.rows[r].valid_to = c.time
            if c.op == Op.DELETE or not c.seeds:
                self.docs[key] = (version, True, [])
                self.deletes.append((c.tenant, c.doc, c.time, c.offset, e))
                continue
            ids = []
            for p, s in enumerate(c.seeds):
                ids.append(len(self.rows))
                self.rows.append(
                    Row(
                        c.tenant,
                        c.doc,
                        p,
                        unit(s, self.dim),
                        c.time,
                        c.offset,
                        e,
                        c.domain,
                        c.metadata,
                    )
                )
            self.docs[key] = (version, False, ids)
        self.epoch_high.append(self.high)

    # -- what may be read --------------------------------------------------

    def history_floor(self) -> int:
        return MIN if self.high == MIN else max(MIN, self.high - self.retention)

    def epoch_floor(self) -> int:
        return min(self.epoch, bisect.bisect_left(self.epoch_high, self.history_floor()))

    def readable(self, epoch: int) -> bool:
        if epoch > self.epoch or epoch < self.epoch_floor():
            return False
        return not any(lo <= epoch <= hi for lo, hi in self.rolled_back)

    def rollback(self, target: int) -> int:
        if not self.readable(target):
            raise IndexStoreError(f"cannot roll back to {target}")
        if target == self.epoch:
            return target
        for r in self.rows:
            if r.created > target:
                r.sup, r.valid_to = r.created, r.valid_from
            elif r.sup != NEVER and r.sup > target:
                r.sup, r.valid_to = NEVER, NEVER
        self.deletes = [d for d in self.deletes if d[4] <= target]
        docs: dict[tuple[str, str], tuple[tuple[int, int], bool, list[int]]] = {}
        for i, r in enumerate(self.rows):
            if r.sup == NEVER:
                key = (r.tenant, r.doc)
                old = docs.get(key)
                docs[key] = ((r.valid_from, r.offset), False, [*(old[2] if old else []), i])
        for t, d, time, off, _ in self.deletes:
            if (t, d) not in docs or docs[(t, d)][1]:
                docs[(t, d)] = ((time, off), True, [])
        self.docs = docs
        self.rolled_back.append((target + 1, self.epoch))
        self.epoch += 1
        self.epoch_high.append(self.high)
        return self.epoch

    def search(
        self, q: np.ndarray, k: int, flt: SearchFilter
    ) -> tuple[int, list[tuple[str, str, int, int, float]]]:
        epoch = self.epoch if flt.epoch is None else flt.epoch
        if not self.readable(epoch):
            raise QueryError(f"epoch {epoch}")
        if flt.as_of_us is not None and flt.as_of_us < self.history_floor():
            raise QueryError("as_of")
        t = NEVER if flt.as_of_us is None else flt.as_of_us
        found = []
        for r in self.rows:
            if r.tenant != flt.tenant or r.created > epoch or r.valid_from > t:
                continue
            if r.sup <= epoch and r.valid_to <= t:
                continue
            if flt.domains is not None and r.domain not in flt.domains:
                continue
            if flt.doc_ids is not None and r.doc not in flt.doc_ids:
                continue
            if flt.start_us is not None and r.valid_from < flt.start_us:
                continue
            if flt.end_us is not None and r.valid_from >= flt.end_us:
                continue
            if not all(_meta_ok(r.metadata, p) for p in flt.metadata):
                continue
            found.append((r.tenant, r.doc, r.position, r.created, float(r.vector @ q)))
        found.sort(key=lambda x: -x[4])
        return epoch, found[:k]


def _meta_ok(md: dict[str, Any] | None, pred: Any) -> bool:
    if not md or pred.key not in md:
        return False
    v = md[pred.key]
    if pred.values is not None:
        return any(_same(v, w) for w in pred.values)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return (pred.gte is None or v >= pred.gte) and (pred.lt is None or v < pred.lt)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return float(a) == float(b)


def as_keys(hits: list[Any]) -> list[tuple[str, str, int, int, float]]:
    return [(h.tenant, h.doc_id, h.position, h.epoch, h.score) for h in hits]


def assert_same_topk(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    """Same rows in the same order; rows whose scores tie (1e-5) may swap places."""
    assert len(got) == len(want), (got, want)
    gs = [g[-1] for g in got]
    ws = [w[-1] for w in want]
    assert np.allclose(gs, ws, atol=1e-5), (got, want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g[:-1] != w[:-1]:
            tied = [x[:-1] for x in want if abs(x[-1] - g[-1]) <= 1e-5]
            assert g[:-1] in tied, (i, got, want)
