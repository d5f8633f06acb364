"""A brute-force reference of the versioned index, and helpers to build commits.

The reference keeps the log of every change committed, with its epoch, and
answers a query by working out, per document, which change is in force at the
epoch and event time asked for, then scoring that change's chunks. It states
the index's semantics in the fewest lines: every change is a version, the
newest is current, deletes as tombstones, ``as_of`` / ``epoch`` reads within the
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
class Reference:
    """The index's semantics, by brute force over the log of every change it took.

    As of event time T at epoch N, each document shows the change with the greatest
    ``(time, offset)`` at or before T among those committed by N and not undone by a
    rollback made by N; it exists iff that change is an upsert with chunks. With
    ``history=False`` only changes newer than the current version are taken, and
    ``as_of`` is refused.
    """

    dim: int
    retention: int
    history: bool = True
    epoch: int = 0
    log: list[tuple[int, Change]] = field(default_factory=list)
    undone: list[tuple[int, int, int]] = field(default_factory=list)  # lo, hi, made at
    high: int = MIN
    epoch_high: list[int] = field(default_factory=lambda: [MIN])

    def commit(self, changes: list[Change]) -> None:
        self.epoch += 1
        e = self.epoch
        taken = changes
        if not self.history:
            current = self.state(e - 1, NEVER)
            newest: dict[tuple[str, str], Change] = {}
            for c in changes:
                key = (c.tenant, c.doc)
                if key not in newest or (c.time, c.offset) > (newest[key].time, newest[key].offset):
                    newest[key] = c
            taken = [
                c
                for key, c in newest.items()
                if key not in current or (c.time, c.offset) > _version(current[key])
            ]
        for c in taken:
            self.log.append((e, c))
        for c in changes:
            self.high = max(self.high, c.time)
        self.epoch_high.append(self.high)

    # -- what is in force --------------------------------------------------

    def in_force(self, epoch: int) -> list[tuple[int, Change]]:
        return [
            (e, c)
            for e, c in self.log
            if e <= epoch and not any(lo <= e <= hi and at <= epoch for lo, hi, at in self.undone)
        ]

    def state(self, epoch: int, as_of: int) -> dict[tuple[str, str], Change]:
        """Per document, the change in force at ``epoch`` as of event time ``as_of``."""
        return {k: c for k, (_, c) in self._state(epoch, as_of).items()}

    def _state(self, epoch: int, as_of: int) -> dict[tuple[str, str], tuple[int, Change]]:
        best: dict[tuple[str, str], tuple[int, Change]] = {}
        for e, c in self.in_force(epoch):
            if c.time > as_of:
                continue
            key = (c.tenant, c.doc)
            b = best.get(key)
            if b is None or (c.time, c.offset) > _version(b[1]):
                best[key] = (e, c)
        return best

    @property
    def docs(self) -> dict[tuple[str, str], tuple[tuple[int, int], bool, list[np.ndarray]]]:
        """The current version of every document: (version, deleted, chunk vectors)."""
        out = {}
        for key, c in self.state(self.epoch, NEVER).items():
            gone = c.op == Op.DELETE or not c.seeds
            out[key] = (_version(c), gone, [] if gone else [unit(s, self.dim) for s in c.seeds])
        return out

    # -- what may be read --------------------------------------------------

    def history_floor(self) -> int:
        return MIN if self.high == MIN else max(MIN, self.high - self.retention)

    def epoch_floor(self) -> int:
        return min(self.epoch, bisect.bisect_left(self.epoch_high, self.history_floor()))

    def readable(self, epoch: int) -> bool:
        if epoch > self.epoch or epoch < self.epoch_floor():
            return False
        return not any(lo <= epoch <= hi for lo, hi, _ in self.undone)

    def rollback(self, target: int) -> int:
        if not self.readable(target):
            raise IndexStoreError(f"cannot roll back to {target}")
        if target == self.epoch:
            return target
        self.undone.append((target + 1, self.epoch, self.epoch + 1))
        self.epoch += 1
        self.epoch_high.append(self.high)
        return self.epoch

    def search(
        self, q: np.ndarray, k: int, flt: SearchFilter
    ) -> tuple[int, list[tuple[str, str, int, int, float]]]:
        epoch = self.epoch if flt.epoch is None else flt.epoch
        if not self.readable(epoch):
            raise QueryError(f"epoch {epoch}")
        if flt.as_of_us is not None and (not self.history or flt.as_of_us < self.history_floor()):
            raise QueryError("as_of")
        t = NEVER if flt.as_of_us is None else flt.as_of_us
        found = []
        for (tenant, doc), (e, c) in self._state(epoch, t).items():
            if c.op == Op.DELETE or tenant != flt.tenant:
                continue
            if flt.domains is not None and c.domain not in flt.domains:
                continue
            if flt.doc_ids is not None and doc not in flt.doc_ids:
                continue
            if flt.start_us is not None and c.time < flt.start_us:
                continue
            if flt.end_us is not None and c.time >= flt.end_us:
                continue
            if not all(_meta_ok(c.metadata, p) for p in flt.metadata):
                continue
            for p, s in enumerate(c.seeds):
                found.append((tenant, doc, p, e, float(unit(s, self.dim) @ q)))
        found.sort(key=lambda x: -x[4])
        return epoch, found[:k]


def _version(c: Change) -> tuple[int, int]:
    return (c.time, c.offset)


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
