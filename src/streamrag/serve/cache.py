"""The semantic answer cache: the same question, or nearly the same, answered once.

Writing an answer costs an LLM call (seconds); looking one up costs
microseconds. The cache keeps answers and serves them again when

* **the question is the same** once normalized — Unicode NFKC, case folded,
  punctuation dropped, whitespace collapsed (:func:`normalize`); or
* **the question is a near duplicate** of a cached one. Three tests must all
  pass: (1) the 64-bit SimHash fingerprints (:func:`simhash64`) of the two
  normalized texts differ in at most ``max_hamming`` bits; (2) the questions'
  embeddings have a cosine similarity of at least ``min_similarity``; and (3)
  the **polarity guard** (:func:`polarity`) agrees: both questions are negated
  or neither is, and they name the same numbers. "Which services use MFA?" and
  "Which services do not use MFA?" are close in words and in embedding space,
  but must never share an answer. A candidate refused by (2) or (3) is counted
  in ``streamrag_answer_cache_guard_rejections_total{reason}``.

**SimHash** maps a text to 64 bits so that similar texts get fingerprints a
few bits apart: every word is hashed to 64 bits, each bit votes +1 or −1 for
its word, and the fingerprint keeps the sign of each bit's total. Questions are
short, so common function words ("how", "do", "the") vote with a quarter of
the weight of content words: rewording them moves a fingerprint by a bit or
two, changing a content word by a dozen or more. Finding every fingerprint
within ``h`` bits of a new one uses the pigeonhole principle: cut the 64 bits
into ``h + 1`` bands; two fingerprints at most ``h`` bits apart agree exactly
on at least one band, so only entries sharing a band value are compared.

**Scope.** An answer depends on more than its question: the tenant, the
filters, the time range, ``as_of``, the epoch pin, ``k`` and how it was
generated. All of that is the :class:`CacheScope`, and both lookups only look
inside one scope — tenant A never sees tenant B's answers.

**Epochs.** Each entry remembers the epoch its chunks were read from and every
document it retrieved. Before an entry is served, the
:class:`~streamrag.runtime.epochs.EpochLog` is asked what the epochs since then
changed: if one of them touched a retrieved document (an update or a delete),
or wrote a new version the entry's filters could match (a new document could
now rank), the entry is dropped — counted in
``streamrag_answer_cache_invalidations_total`` — and the question is answered
afresh. Epochs the log cannot vouch for (a rollback, or history it no longer
holds) invalidate too. An entry read from an explicitly pinned ``epoch`` never
goes stale: that epoch never changes.

**Eviction: LRU-K.** When full, the cache evicts the entry whose K-th most
recent use is oldest (O'Neil, O'Neil and Weikum, 1993). Entries used fewer
than K times go first, least recently used first, so a burst of one-off
questions cannot push out answers that are asked again and again. K = 1 is
plain LRU.

>>> normalize("  How do I rotate the DB password?! ")
'how do i rotate the db password'
>>> a = simhash64(normalize("How do I rotate the database password?"))
>>> b = simhash64(normalize("how can I rotate the database password"))
>>> c = simhash64(normalize("how do I rotate the kafka certificate"))
>>> hamming(a, b), hamming(a, c)
(2, 22)
>>> polarity("which services use mfa").negated, polarity("which services don't use mfa").negated
(False, True)
"""

from __future__ import annotations

import hashlib
import heapq
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from streamrag.errors import ArgumentError
from streamrag.index.base import SearchFilter
from streamrag.runtime.epochs import EpochLog, NewVersion
from streamrag.runtime.metrics import Metrics
from streamrag.serve.text import FUNCTION_WORDS, normalize

__all__ = [
    "CacheHit",
    "CacheScope",
    "Polarity",
    "SemanticCache",
    "hamming",
    "normalize",
    "polarity",
    "simhash64",
]

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset(
    {
        "not",
        "no",
        "never",
        "none",
        "nobody",
        "nothing",
        "nowhere",
        "neither",
        "nor",
        "without",
        "cannot",
        "except",
        "excluding",
        "unless",
        "non",
    }
)
_BITS = np.arange(64, dtype=np.uint64)
_FUNCTION_WEIGHT = 0.25


def _hash64(feature: str) -> int:
    return int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")


def simhash64(normalized: str) -> int:
    """A 64-bit SimHash of a normalized text's words, function words weighted 1/4 (0: no words)."""
    words = normalized.split()
    if not words:
        return 0
    hashes = np.fromiter((_hash64(w) for w in words), dtype=np.uint64, count=len(words))
    weights = np.fromiter(
        (_FUNCTION_WEIGHT if w in FUNCTION_WORDS else 1.0 for w in words),
        dtype=np.float64,
        count=len(words),
    )
    bits = ((hashes[:, None] >> _BITS) & np.uint64(1)).astype(np.float64)
    votes = ((2 * bits - 1) * weights[:, None]).sum(axis=0)
    return int(sum(1 << i for i in np.flatnonzero(votes > 0).tolist()))


def hamming(a: int, b: int) -> int:
    """Number of differing bits of two fingerprints."""
    return (a ^ b).bit_count()


@dataclass(frozen=True, slots=True)
class Polarity:
    """What a near-duplicate must share: whether it is negated, and the numbers it names."""

    negated: bool
    numbers: frozenset[str]


def polarity(normalized: str) -> Polarity:
    """Negation (an odd number of negation words, ``n't`` included) and the numbers of a text."""
    negations = 0
    for word in normalized.split():
        if word in _NEGATIONS or word.endswith("n't"):
            negations += 1
    numbers = frozenset(n.replace(",", "") for n in _NUMBER.findall(normalized))
    return Polarity(negations % 2 == 1, numbers)


@dataclass(frozen=True, slots=True)
class CacheScope:
    """Everything besides the question that an answer depends on; lookups stay inside it.

    ``flt`` holds the tenant, filters, time range, ``as_of`` and epoch pin;
    ``extra`` whatever else shapes the answer (``k``, the generator, earlier
    turns of a conversation).
    """

    flt: SearchFilter
    extra: tuple[Hashable, ...] = ()


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A cached answer and how it was found."""

    value: Any
    kind: Literal["exact", "near"]
    epoch: int
    similarity: float
    question: str


@dataclass(slots=True)
class _Entry:
    id: int
    scope: CacheScope
    text: str
    fingerprint: int
    vector: npt.NDArray[np.float32] | None
    polarity: Polarity
    docs: frozenset[tuple[str, str]]
    read_epoch: int
    valid_through: int
    value: Any
    uses: deque[int]
    version: int = 0
    bands: list[tuple[int, int]] = field(default_factory=list)


class SemanticCache:
    """Answers by scope and question: exact and near-duplicate hits, epoch-checked, LRU-K."""

    def __init__(
        self,
        log: EpochLog,
        *,
        max_entries: int = 10_000,
        lru_k: int = 2,
        max_hamming: int = 6,
        min_similarity: float = 0.95,
        metrics: Metrics | None = None,
    ) -> None:
        if max_entries <= 0 or lru_k <= 0 or not 0 <= max_hamming < 64:
            msg = (
                f"cache needs max_entries > 0, lru_k > 0 and 0 <= max_hamming < 64; found "
                f"{max_entries}, {lru_k}, {max_hamming}"
            )
            raise ArgumentError(msg)
        self.log = log
        self.max_entries = max_entries
        self.lru_k = lru_k
        self.max_hamming = max_hamming
        self.min_similarity = min_similarity
        self.metrics = metrics
        n_bands = max_hamming + 1
        width = 64 // n_bands
        self._bands = [
            (i * width, 64 if i == n_bands - 1 else (i + 1) * width) for i in range(n_bands)
        ]
        self._entries: dict[int, _Entry] = {}
        self._exact: dict[tuple[CacheScope, str], int] = {}
        self._near: dict[tuple[CacheScope, int, int], set[int]] = {}
        self._young: OrderedDict[int, None] = OrderedDict()
        self._heap: list[tuple[int, int, int]] = []
        self._tick = 0
        self._next_id = 0
        self._lookups = 0
        self._hits = 0
        self._lock = threading.Lock()

    # -- lookups -------------------------------------------------------------------

    def lookup_exact(self, question: str, scope: CacheScope, epoch: int) -> CacheHit | None:
        """The answer to the same normalized question in ``scope``, if still true at ``epoch``.

        ``epoch`` is the latest committed epoch. Only hits are counted here: a
        miss is counted by the :meth:`lookup_near` that follows it.
        """
        text = normalize(question)
        with self._lock:
            eid = self._exact.get((scope, text))
            if eid is None:
                return None
            entry = self._entries[eid]
            if not self._valid(entry, epoch):
                self._drop(entry, invalidated=True)
                return None
            self._touch(entry)
            self._count("exact")
            return CacheHit(entry.value, "exact", entry.read_epoch, 1.0, entry.text)

    def lookup_near(
        self,
        question: str,
        vector: npt.NDArray[np.float32],
        scope: CacheScope,
        epoch: int,
    ) -> CacheHit | None:
        """The best near-duplicate's answer in ``scope`` that passes every guard, or None."""
        text = normalize(question)
        fp = simhash64(text)
        pol = polarity(text)
        vec = np.asarray(vector, dtype=np.float32)
        best: tuple[float, _Entry] | None = None
        with self._lock:
            seen: set[int] = set()
            for band, (lo, hi) in enumerate(self._bands):
                ids = self._near.get((scope, band, _band(fp, lo, hi)))
                if ids:
                    seen.update(ids)
            for eid in sorted(seen):
                entry = self._entries[eid]
                if hamming(fp, entry.fingerprint) > self.max_hamming or entry.vector is None:
                    continue
                sim = float(vec @ entry.vector)
                if sim < self.min_similarity:
                    self._reject("similarity")
                    continue
                if pol.negated != entry.polarity.negated:
                    self._reject("negation")
                    continue
                if pol.numbers != entry.polarity.numbers:
                    self._reject("numbers")
                    continue
                if not self._valid(entry, epoch):
                    self._drop(entry, invalidated=True)
                    continue
                if best is None or sim > best[0]:
                    best = (sim, entry)
            if best is None:
                self._count("miss")
                return None
            sim, entry = best
            self._touch(entry)
            self._count("near")
            return CacheHit(entry.value, "near", entry.read_epoch, sim, entry.text)

    # -- updates -------------------------------------------------------------------

    def put(
        self,
        question: str,
        vector: npt.NDArray[np.float32] | None,
        scope: CacheScope,
        epoch: int,
        docs: Iterable[tuple[str, str]],
        value: Any,
    ) -> None:
        """Keep ``value``, read from ``epoch``; ``docs`` are the ``(tenant, doc_id)``s it used.

        A cached answer to the same question in the same scope is replaced.
        """
        text = normalize(question)
        fp = simhash64(text)
        with self._lock:
            old = self._exact.get((scope, text))
            if old is not None:
                self._drop(self._entries[old], invalidated=False)
            while len(self._entries) >= self.max_entries:
                self._evict_one()
            entry = _Entry(
                id=self._next_id,
                scope=scope,
                text=text,
                fingerprint=fp,
                vector=None if vector is None else np.asarray(vector, dtype=np.float32).copy(),
                polarity=polarity(text),
                docs=frozenset(docs),
                read_epoch=epoch,
                valid_through=epoch,
                value=value,
                uses=deque(maxlen=self.lru_k),
            )
            self._next_id += 1
            self._entries[entry.id] = entry
            self._exact[(scope, text)] = entry.id
            for band, (lo, hi) in enumerate(self._bands):
                key = (scope, band, _band(fp, lo, hi))
                self._near.setdefault(key, set()).add(entry.id)
                entry.bands.append((band, _band(fp, lo, hi)))
            self._touch(entry)
            self._gauge()

    def clear(self) -> None:
        """Forget every answer (after a rollback)."""
        with self._lock:
            n = len(self._entries)
            self._entries.clear()
            self._exact.clear()
            self._near.clear()
            self._young.clear()
            self._heap.clear()
            if self.metrics is not None and n:
                self.metrics.cache_invalidations.inc(n)
            self._gauge()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"SemanticCache(entries={len(self)}, max_entries={self.max_entries}, "
            f"lru_k={self.lru_k}, max_hamming={self.max_hamming}, "
            f"min_similarity={self.min_similarity})"
        )

    # -- internals (under the lock) --------------------------------------------------

    def _valid(self, entry: _Entry, epoch: int) -> bool:
        """Whether nothing the entry depends on changed in epochs after it, up to ``epoch``."""
        flt = entry.scope.flt
        if flt.epoch is not None:
            return True  # a pinned epoch never changes
        if epoch <= entry.valid_through:
            return True  # already checked up to a later epoch
        changes = self.log.since(entry.valid_through, epoch)
        if changes is None:
            return False
        for c in changes:
            if flt.tenant not in c.tenants:
                continue
            if not entry.docs.isdisjoint(c.docs):
                return False
            if any(_could_match(v, flt) for v in c.upserts):
                return False
        entry.valid_through = epoch
        return True

    def _touch(self, entry: _Entry) -> None:
        self._tick += 1
        entry.uses.append(self._tick)
        entry.version += 1
        if len(entry.uses) < self.lru_k:
            self._young[entry.id] = None
            self._young.move_to_end(entry.id)
        else:
            self._young.pop(entry.id, None)
            # The K-th most recent use: the oldest one the deque keeps.
            heapq.heappush(self._heap, (entry.uses[0], entry.id, entry.version))
            if len(self._heap) > 4 * len(self._entries) + 64:
                self._heap = [
                    (e.uses[0], e.id, e.version)
                    for e in self._entries.values()
                    if len(e.uses) >= self.lru_k
                ]
                heapq.heapify(self._heap)

    def _evict_one(self) -> None:
        if self._young:
            eid, _ = self._young.popitem(last=False)
            victim = self._entries[eid]
        else:
            while True:
                _, eid, version = heapq.heappop(self._heap)
                found = self._entries.get(eid)
                if found is not None and found.version == version:
                    victim = found
                    break
        self._drop(victim, invalidated=False)
        if self.metrics is not None:
            self.metrics.cache_evictions.inc()

    def _drop(self, entry: _Entry, *, invalidated: bool) -> None:
        del self._entries[entry.id]
        self._exact.pop((entry.scope, entry.text), None)
        for band, value in entry.bands:
            key = (entry.scope, band, value)
            ids = self._near.get(key)
            if ids is not None:
                ids.discard(entry.id)
                if not ids:
                    del self._near[key]
        self._young.pop(entry.id, None)
        if invalidated and self.metrics is not None:
            self.metrics.cache_invalidations.inc()
        self._gauge()

    def _count(self, result: str) -> None:
        self._lookups += 1
        if result != "miss":
            self._hits += 1
        if self.metrics is not None:
            self.metrics.cache_lookups.labels(result).inc()
            self.metrics.cache_hit_ratio.set(self._hits / self._lookups)

    def _reject(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.cache_guard_rejections.labels(reason).inc()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.cache_entries.set(len(self._entries))


def _band(fp: int, lo: int, hi: int) -> int:
    return (fp >> lo) & ((1 << (hi - lo)) - 1)


def _could_match(v: NewVersion, flt: SearchFilter) -> bool:
    """Whether a new version could be seen by a query with ``flt`` (metadata is not checked)."""
    if v.tenant != flt.tenant:
        return False
    if flt.domains is not None and v.domain not in flt.domains:
        return False
    if flt.doc_ids is not None and v.doc_id not in flt.doc_ids:
        return False
    if flt.start_us is not None and v.event_time < flt.start_us:
        return False
    if flt.end_us is not None and v.event_time >= flt.end_us:
        return False
    return flt.as_of_us is None or v.event_time <= flt.as_of_us
