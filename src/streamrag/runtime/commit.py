"""One micro-batch, one commit: how a batch of changes becomes one epoch, exactly once.

A commit is five steps (:meth:`Committer.apply`):

1. **Plan** (:func:`plan`). Which changes the index wants: with history, every
   version once (a change read twice, or one older than the retained history,
   is not — :meth:`~streamrag.index.base.VectorIndex.wants`); without, only the
   newest change per document. For every chunk of those changes: is its vector
   *reused* (the document's current chunk with the same content hash), *shared*
   (the same text earlier in this batch) or *embedded*?
2. **Embed** what is new (:class:`Embedding`), in calls the adaptive controller
   sizes — taking the vectors a worker process made ahead where it has them
   all (:mod:`streamrag.embed.ahead`) — with retries, backoff and bisection
   (:func:`~streamrag.embed.resilient.embed_resilient`), on the embedder the
   :class:`~streamrag.embed.choice.EmbedderChoice` picks for the call (the
   configured one, its fallback while it fails, or a fast variant while changes
   wait too long). Every chunk records the embedder that made its vector.
3. **Set poison aside**. A text the embedder refuses on its own while others
   succeed is poison: its document is dead-lettered whole (stage ``embed``)
   and the rest commit. No epoch ever has a document with a missing vector.
4. **Build the batch**: documents, chunks, vectors and the cursor
   (:mod:`streamrag.runtime.cursor`) taken between two polls, with the counts
   as they will be once this commit is in and the commit's audit record.
5. **Commit** it: the index writes the batch as one write-ahead-log record,
   fsynced before the epoch becomes visible.

**Why exactly once.** The documents and the stream position are in one log
record, so after a crash either both are in or neither is. A restart resumes
from the last record's cursor and reads again only what that commit had not
covered. A change read twice is found by its version ``(event_time, offset)``
and chunk ids derive from the document, so applying it again changes nothing:
the index ends as if there had been no crash. Dead letters of step 3 are
written before the commit; a crash in between leaves a letter for a change
that is still waiting, which is refused again on replay and kept once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from streamrag.batching import AdaptiveController, PendingBatch
from streamrag.changes import Op
from streamrag.chunking import chunk_id
from streamrag.embed.ahead import EmbedAhead
from streamrag.embed.base import Embedder
from streamrag.embed.choice import Choice, EmbedderChoice
from streamrag.embed.resilient import EmbedOutcome, RetryPolicy, embed_resilient
from streamrag.errors import EmbedderError
from streamrag.index.base import (
    CommitBatch,
    CommitResult,
    DocOp,
    DocState,
    KnowsEmbedders,
    VectorIndex,
)
from streamrag.index.versions import is_newer, newest_per_doc
from streamrag.ingest import DeadLetter
from streamrag.runtime.cursor import Cursor
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.stages import Prepared, change_letter
from streamrag.timing import US_PER_S, Clock

__all__ = ["Committed", "Committer", "Embedding", "Plan", "observe", "plan"]


@dataclass(slots=True)
class Plan:
    """What one micro-batch commits: documents and chunks, and where each vector comes from.

    ``texts``, ``ids``, ``positions`` and ``hashes`` have one entry per chunk
    (a *slot*); each slot is in exactly one of ``embed``, ``reuse`` (with the
    index row whose vector it takes) or ``alias`` (with the earlier slot of
    the same text).
    """

    docs: list[DocOp] = field(default_factory=list)
    doc_rows: list[int] = field(default_factory=list)
    """The change (row of the batch) behind each document."""
    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    embed: list[int] = field(default_factory=list)
    reuse: list[int] = field(default_factory=list)
    reuse_rows: list[int] = field(default_factory=list)
    alias: list[int] = field(default_factory=list)
    alias_of: list[int] = field(default_factory=list)
    stale: int = 0
    """Changes left out: read twice, beaten, or older than the retained history."""
    keep: list[int] | None = None
    """After poison was set aside: the slots kept (None: all)."""
    _first: dict[bytes, int] = field(default_factory=dict)

    held: dict[tuple[str, str], tuple[int, int] | None] = field(default_factory=dict)
    """The version the index held for each planned document before this commit (None:
    none): looked up once per document, it also tells :func:`past_versions` its answer."""

    def add_chunks(
        self, tenant: str, doc_id: str, prep: Prepared, current: Mapping[bytes, int]
    ) -> int:
        """Add an upsert's chunks; ``current`` maps the document's current hashes to rows."""
        first = len(self.texts)
        seen = self._first
        hashes = prep.hashes
        for slot, (_, h) in enumerate(zip(prep.chunks, hashes, strict=True), first):
            row = current.get(h) if current else None
            src = seen.get(h)
            if row is not None:
                self.reuse.append(slot)
                self.reuse_rows.append(row)
            elif src is not None:
                self.alias.append(slot)
                self.alias_of.append(src)
            else:
                self.embed.append(slot)
            if src is None:
                seen[h] = slot
        n = len(hashes)
        self.ids.extend([chunk_id(tenant, doc_id, pos) for pos in range(n)])
        self.positions.extend(range(n))
        self.texts.extend(prep.chunks)
        self.hashes.extend(hashes)
        return first


def plan(pending: PendingBatch, index: VectorIndex, *, history: bool) -> Plan:
    """Step 1: the documents and chunks one micro-batch commits (see the module docstring).

    The index is asked for each document's state once, however many of its
    changes the batch holds; :attr:`Plan.held` keeps the versions it had.
    """
    changes = pending.changes
    times = changes.event_times.tolist()
    offsets = changes.offsets.tolist()
    ops = changes.ops.tolist()
    keys = list(zip(changes.tenants, changes.doc_ids, strict=True))
    candidates = _candidates(keys, times, offsets, history=history)
    out = Plan(stale=len(changes) - len(candidates))
    prepared = pending.prepared or [None] * len(changes)
    sources, payloads = changes.sources, changes.payloads
    wants, doc_state = index.wants, index.doc_state
    docs, doc_rows, add_chunks, held = out.docs, out.doc_rows, out.add_chunks, out.held
    states: dict[tuple[str, str], DocState | None] = {}
    no_state: dict[bytes, int] = {}  # a new document: no chunk to reuse (never written to)
    delete = Op.DELETE
    for i in candidates:
        key = keys[i]
        tenant, doc_id = key
        t, o = times[i], offsets[i]
        if not wants(tenant, doc_id, t, o):
            out.stale += 1
            continue
        doc_rows.append(i)
        if key in states:
            state = states[key]
        else:
            state = states[key] = doc_state(tenant, doc_id)
            held[key] = None if state is None else state.version
        source = sources[i]
        if ops[i] == delete:
            docs.append(DocOp(tenant, doc_id, delete, t, o, source))
            continue
        prep = prepared[i]
        assert prep is not None  # every upsert was chunked before it was queued
        current = no_state
        if state is not None and not state.deleted and state.hashes:
            current = dict(zip(state.hashes, state.rows, strict=True))
        first = add_chunks(tenant, doc_id, prep, current)
        payload = payloads[i]
        domain = payload.get("domain", "")
        metadata = payload.get("metadata") or None
        docs.append(
            DocOp(
                *(tenant, doc_id, Op.UPSERT, t, o, source),
                *(str(domain), first, len(prep.hashes)),
                metadata,
            )
        )
    return out


def _candidates(
    keys: list[tuple[str, str]], times: list[int], offsets: list[int], *, history: bool
) -> list[int]:
    """Rows worth asking the index about: each version once, or the newest per document.

    Which version is newest is the index's rule (:mod:`streamrag.index.versions`).
    """
    if history:
        seen: set[tuple[tuple[str, str], int, int]] = set()
        out = []
        for i, key in enumerate(keys):
            v = (key, times[i], offsets[i])
            if v not in seen:
                seen.add(v)
                out.append(i)
        return out
    return list(newest_per_doc(keys, times, offsets).values())


class Embedding:
    """Step 2: texts into vectors, in calls the adaptive controller sizes, resiliently."""

    def __init__(
        self,
        embedder: Embedder,
        *,
        clock: Clock,
        metrics: Metrics,
        retry: RetryPolicy | None = None,
        controller: AdaptiveController | None = None,
        queued: Callable[[], int] = lambda: 0,
        sleep: Callable[[float], None] = time.sleep,
        choice: EmbedderChoice | None = None,
        ahead: EmbedAhead | None = None,
        waiting: Callable[[], Sequence[Prepared | None]] = list,
    ) -> None:
        self.choice = choice or EmbedderChoice(embedder, clock=clock)
        self.ahead = ahead
        """The worker process that embeds queued chunks before their commit, if any."""
        self.waiting = waiting
        """What was prepared for the changes that wait in the batcher."""
        self._sent_to: int | None = None  # the worker that got what waits
        self._catching_up = threading.Lock()
        self.clock = clock
        self.metrics = metrics
        self.retry = retry or RetryPolicy()
        self.controller = controller
        self.queued = queued
        self.sleep = sleep
        self.rate = 0.0
        """Texts per second over recent calls (sizes a stopping flush)."""
        self.retries = 0

    @property
    def embedder(self) -> Embedder:
        """The configured embedder (the one whose vector space the index holds)."""
        return self.choice.primary

    def _ahead(self) -> EmbedAhead | None:
        """The worker, if it may embed for the configured embedder.

        None after a generation switch, and once it is refused (the embedder
        releases the lock, does not pickle): reads then spend nothing on it.
        """
        ahead = self.ahead
        if ahead is None or ahead.refused is not None:
            return None
        return ahead if ahead.version == self.choice.primary.version else None

    def send_ahead(self, prepared: Sequence[Prepared | None], *, backlog: bool) -> None:
        """Hand the chunks of newly queued changes to the worker (:mod:`streamrag.embed.ahead`).

        The worker is started by the first backlog (or the first change, when
        eager) if the embedder holds the interpreter lock (said or measured:
        :meth:`~streamrag.embed.ahead.EmbedAhead.holds_lock`), and started
        again after it died, every ``restart_s`` at most.
        Once ready, it also gets the changes that waited meanwhile.
        """
        ahead = self._ahead()
        if ahead is None:
            return
        if not ahead.ready:
            if ahead.started or (
                (backlog or ahead.eager) and ahead.holds_lock(_texts_of(prepared))
            ):
                ahead.start()
            return
        if not self.catch_up_ahead():  # else these were sent with all that waits
            ahead.submit(_texts_of(prepared))

    def catch_up_ahead(self) -> bool:
        """Send a worker that is newly ready all that waits in the batcher; True if it did."""
        ahead = self._ahead()
        if ahead is None or not ahead.ready or ahead.pid == self._sent_to:
            return False
        with self._catching_up:  # the reader's thread and the committer's may both ask
            if ahead.pid == self._sent_to:
                return False
            self._sent_to = ahead.pid
            ahead.submit(_texts_of(self.waiting()))
        return True

    @property
    def ahead_ready(self) -> bool:
        """Whether a worker embeds ahead for the configured embedder now."""
        ahead = self._ahead()
        return ahead is not None and ahead.ready

    @property
    def ahead_started(self) -> bool:
        """Whether a worker was started for the configured embedder (and not refused)."""
        ahead = self._ahead()
        return ahead is not None and ahead.started

    def discard_ahead(self, pending: PendingBatch) -> None:
        """The changes of ``pending`` are committed: the worker's vectors for them may go."""
        ahead = self.ahead
        if ahead is not None and ahead.started:
            ahead.discard(_texts_of(pending.prepared))

    def ready_ahead(self, pending: PendingBatch) -> bool:
        """Whether the worker has embedded every chunk of ``pending`` (False without one)."""
        ahead = self._ahead()
        if ahead is None or not ahead.ready:
            return False
        return ahead.ready_for(_texts_of(pending.prepared))

    def fill(
        self,
        texts: list[str],
        slots: list[int],
        vectors: npt.NDArray[np.float32],
        step: int,
        *,
        made_by: list[str] | None = None,
        lag_us: int | None = None,
    ) -> dict[int, str]:
        """Embed the texts at ``slots`` into ``vectors``, ``step`` at a time.

        ``made_by[slot]`` is set to the version of the embedder that made each
        vector; ``lag_us`` is how long the oldest change has waited (it may pick
        the fast variant). Returns the slots whose text the embedder refuses on
        its own, with the reason. Raises :class:`~streamrag.errors.EmbedderError`
        when every embedder it may use fails for all texts.
        """
        poisoned: dict[int, str] = {}
        ahead = self._ahead()
        if ahead is not None and not ahead.started:
            ahead = None
        for lo in range(0, len(slots), max(1, step)):
            part = slots[lo : lo + max(1, step)]
            part_texts = [texts[s] for s in part]
            got = ahead.take(part_texts, _AHEAD_WAIT_S) if ahead is not None else None
            if got is not None and ahead is not None:  # made by the configured embedder
                vectors[part] = got.vectors
                if made_by is not None:
                    for s in part:
                        made_by[s] = ahead.version
                self._observe(len(part), got.seconds, steady=True)
                continue
            # Measured on the injected clock, so a test's synthetic embedder can set it.
            started = self.clock.now_us()
            out, used = self._embed(part_texts, lag_us)
            vectors[part] = out.vectors
            if made_by is not None:
                for s in part:
                    made_by[s] = used.version
            for j, reason in out.failed.items():
                poisoned[part[j]] = reason
            if out.retries or out.failed:
                self.retries += out.calls - 1
                self.metrics.embed_retries.inc(out.calls - 1)
            took = max(0, self.clock.now_us() - started) / US_PER_S
            self._observe(len(part), took, steady=not out.failed and out.calls == 1)
        return poisoned

    def _embed(self, texts: list[str], lag_us: int | None) -> tuple[EmbedOutcome, Embedder]:
        """One call's texts on the chosen embedder; on the fallback if the configured one fails."""
        choice = self.choice
        picked = choice.for_batch(lag_us)
        if picked.probe:  # one text, one try: a dead endpoint costs a single call
            try:
                embed_resilient(picked.embedder, texts[:1], _ONE_TRY, sleep=self.sleep)
            except EmbedderError as exc:
                alt = choice.failed(picked, exc)
                assert alt is not None  # probes happen only with a fallback
                picked = alt
            else:
                choice.succeeded(picked)
                picked = Choice(picked.embedder, "primary", "answering again")
        try:
            out = embed_resilient(picked.embedder, texts, self.retry, sleep=self.sleep)
        except EmbedderError as exc:
            alt = choice.failed(picked, exc)
            if alt is None:
                raise
            self.metrics.embed_fallbacks.inc()
            return embed_resilient(alt.embedder, texts, self.retry, sleep=self.sleep), alt.embedder
        choice.succeeded(picked)
        return out, picked.embedder

    def _observe(self, n: int, took: float, *, steady: bool) -> None:
        self.metrics.embed_seconds.observe(took)
        if took > 0:
            rate = n / took
            self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate
        if self.controller is not None and steady:
            action = self.controller.observe(n, took, queued=self.queued())
            self.metrics.batch_decisions.labels(action=action).inc()
            self.metrics.batch_target.set(self.controller.target)


_ONE_TRY = RetryPolicy(attempts=1)


def _texts_of(prepared: Sequence[Prepared | None]) -> list[str]:
    """The chunk texts of prepared changes, in order (a delete has none)."""
    return [c for p in prepared if p is not None for c in p.chunks]


_AHEAD_WAIT_S = 30.0
"""Longest a commit waits for the worker's vectors before it embeds them itself."""


@dataclass(slots=True)
class Committed:
    """A micro-batch once committed: the batch, the index's answer, and the counts it moves."""

    pending: PendingBatch
    batch: CommitBatch
    result: CommitResult
    cursor: Cursor
    letters: list[DeadLetter]
    delta: dict[str, int]
    """Counts to add to the pipeline's: applied, stale, dead-lettered, chunks, commits."""


class Committer:
    """Steps 1–5 of the module docstring for one micro-batch."""

    def __init__(
        self,
        index: VectorIndex,
        embedding: Embedding,
        *,
        history: bool,
        store_letters: Callable[[list[DeadLetter]], None],
    ) -> None:
        self.index = index
        self.embedding = embedding
        self.history = history
        self.store_letters = store_letters
        self.mirrors: list[Callable[[CommitBatch], None]] = []
        """Called with each batch before it is committed: other index generations take it
        first (:mod:`streamrag.runtime.generations`)."""
        self.lock = threading.RLock()
        """Held for a whole commit: a switch of generation happens between two commits."""
        self.seal: Callable[[CommitBatch, PendingBatch, VectorIndex], CommitBatch] = _as_is
        """Called with each batch just before it is committed (after the mirrors); what it
        returns is committed: the audit log writes the epoch's record into its cursor
        (:mod:`streamrag.runtime.audit`)."""

    def apply(self, pending: PendingBatch, capture: Callable[[], Cursor], step: int) -> Committed:
        """Commit one micro-batch; ``capture`` takes the cursor, ``step`` sizes embed calls."""
        with self.lock:
            return self._apply(pending, capture, step)

    def _apply(self, pending: PendingBatch, capture: Callable[[], Cursor], step: int) -> Committed:
        index = self.index
        retries = self.embedding.retries
        p = plan(pending, index, history=self.history)
        vectors = np.empty((len(p.texts), index.dim), dtype=np.float32)
        configured = self.embedding.embedder.version
        made_by = [configured] * len(p.texts)
        lag = self.embedding.clock.now_us() - pending.first_arrival_us if len(p.embed) else None
        poisoned = self.embedding.fill(
            p.texts, p.embed, vectors, step or len(p.embed), made_by=made_by, lag_us=lag
        )
        if p.reuse:
            vectors[p.reuse] = index.vectors_at(p.reuse_rows)
            if isinstance(index, KnowsEmbedders):
                for slot, v in zip(p.reuse, index.embedders_at(p.reuse_rows), strict=True):
                    made_by[slot] = v
        if p.alias:
            vectors[p.alias] = vectors[p.alias_of]
            for slot, src in zip(p.alias, p.alias_of, strict=True):
                made_by[slot] = made_by[src]
                if src in poisoned:
                    poisoned[slot] = poisoned[src]
        letters = _set_poison_aside(p, pending, vectors, poisoned)
        vectors = vectors[p.keep] if p.keep is not None else vectors
        if p.keep is not None:
            made_by = [made_by[r] for r in p.keep]
        embedded = len(p.embed) - sum(1 for s in p.embed if s in poisoned)
        delta = {
            "applied": len(pending.changes) - len(letters),
            "stale": p.stale,
            "dead_lettered": len(letters),
            "poison": len(letters),
            "chunks_embedded": embedded,
            "chunks_reused": len(p.reuse) + len(p.alias),
            "commits": 1,
            "past_versions": past_versions(p.docs, index, p.held),
            "embed_retries": self.embedding.retries - retries,
        }
        cursor = capture()
        for count, value in delta.items():  # the counts once this commit is in, written with it
            cursor.stats[count] += value
        cursor.audit = self._audit(p, pending, delta)
        if letters:
            self.store_letters(letters)  # before the commit (see "Why exactly once")
        batch = _batch(p, vectors, configured, made_by, cursor)
        for mirror in self.mirrors:  # first: see streamrag.runtime.generations
            mirror(batch)
        batch = self.seal(batch, pending, index)  # after the mirrors: the serving epoch's record
        result = index.commit(batch)
        delta["stale"] += result.stale_docs
        return Committed(pending, batch, result, cursor, letters, delta)

    def _audit(self, p: Plan, pending: PendingBatch, delta: Mapping[str, int]) -> dict[str, Any]:
        """The commit's audit record, in the same log record as its documents."""
        upserts = sum(1 for d in p.docs if d.op == Op.UPSERT)
        return {
            "changes": len(pending.changes),
            "upserts": upserts,
            "deletes": len(p.docs) - upserts,
            "stale": p.stale,
            "dead_lettered": delta["dead_lettered"],
            "chunks_embedded": delta["chunks_embedded"],
            "chunks_reused": delta["chunks_reused"],
            "cut_by": pending.reason,
            "first_arrival_us": pending.first_arrival_us,
            "embedder": self.embedding.embedder.version,
            "embedder_in_use": self.embedding.choice.in_use,
        }


def _batch(
    p: Plan, vectors: npt.NDArray[np.float32], configured: str, made_by: list[str], cursor: Cursor
) -> CommitBatch:
    """Step 4: the commit of the plan's documents and chunks, with the cursor."""
    return CommitBatch(
        docs=p.docs,
        chunk_ids=np.asarray(p.ids, dtype=np.int64),
        positions=np.asarray(p.positions, dtype=np.int32),
        texts=p.texts,
        hashes=p.hashes,
        vectors=vectors,
        embedder_version=configured,
        chunk_embedders=None if all(v == configured for v in made_by) else made_by,
        cursor=cursor.to_mapping(),
    )


def _as_is(batch: CommitBatch, pending: PendingBatch, index: VectorIndex) -> CommitBatch:
    return batch


def _set_poison_aside(
    p: Plan, pending: PendingBatch, vectors: npt.NDArray[np.float32], poisoned: Mapping[int, str]
) -> list[DeadLetter]:
    """Step 3: drop the documents that own a refused chunk (none is half-written)."""
    p.keep = None
    if not poisoned:
        return []
    letters: list[DeadLetter] = []
    docs: list[DocOp] = []
    keep: list[int] = []
    for k, d in enumerate(p.docs):
        rows = range(d.first_chunk, d.first_chunk + d.n_chunks) if d.op == Op.UPSERT else ()
        bad = [poisoned[r] for r in rows if r in poisoned]
        if bad:
            reason = f"the embedder refuses chunk text of this document: {bad[0]}"
            letters.append(change_letter(pending.changes, p.doc_rows[k], "embed", reason))
            continue
        if d.op == Op.UPSERT:
            d = msgspec.structs.replace(d, first_chunk=len(keep))
            keep.extend(rows)
        docs.append(d)
    p.docs = docs
    p.ids = [p.ids[r] for r in keep]
    p.positions = [p.positions[r] for r in keep]
    p.texts = [p.texts[r] for r in keep]
    p.hashes = [p.hashes[r] for r in keep]
    p.keep = keep
    return letters


def past_versions(
    docs: Sequence[DocOp],
    index: VectorIndex,
    held: Mapping[tuple[str, str], tuple[int, int] | None] | None = None,
) -> int:
    """How many of a commit's documents will not become current (older than another).

    ``held`` is the version the index holds per document (None: none), when the
    caller looked it up already (:attr:`Plan.held`); otherwise the index is asked.
    """
    newest: dict[tuple[str, str], tuple[int, int]] = {}
    for d in docs:
        key = (d.tenant, d.doc_id)
        v = (d.event_time, d.offset)
        top = newest.get(key)
        if top is None:
            if held is not None and key in held:
                top = held[key]
            else:
                state = index.doc_state(d.tenant, d.doc_id)
                top = None if state is None else state.version
            newest[key] = v if top is None or is_newer(v, top) else top
        elif is_newer(v, top):
            newest[key] = v
    return sum(1 for d in docs if is_newer(newest[(d.tenant, d.doc_id)], (d.event_time, d.offset)))


def observe(
    metrics: Metrics,
    done: Committed,
    index: VectorIndex,
    *,
    pending: int,
    freshness_s: float | None,
) -> None:
    """A commit in the metrics: counts, batch size and cut, freshness, index size.

    (Its dead letters were counted when they were stored.)
    """
    m, d, batch = metrics, done.delta, done.pending
    m.batch_chunks.observe(batch.chunks)
    m.batch_reasons.labels(reason=batch.reason).inc()
    m.applied.inc(d["applied"])
    m.stale.inc(d["stale"])
    m.past_versions.inc(d["past_versions"])
    m.chunks_embedded.inc(d["chunks_embedded"])
    m.chunks_reused.inc(d["chunks_reused"])
    m.commits.inc()
    if freshness_s is not None:
        m.freshness.observe(freshness_s)
    m.epoch.set(done.result.epoch)
    stats = index.stats()
    m.live_chunks.set(stats.live_chunks)
    m.live_docs.set(stats.live_docs)
    m.pending.set(pending)
