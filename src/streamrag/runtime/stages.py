"""The stages of the data path, each with one result shape: what goes on, and what is refused.

A stage takes a batch and returns a :class:`StageResult`: ``out``, what goes on
to the next stage, and ``letters``, the records it refused, each a
:class:`~streamrag.ingest.DeadLetter` with its source, offset, stage and
reason. No stage raises because of one record: whatever a record makes it
throw, the record becomes a letter and the rest of the batch goes on
(invariant 4). The pipeline records and counts every letter in one place
(:class:`LetterSink`).

=============  ==========================  =====================================
stage          in → out                    refused (stage of the letter)
=============  ==========================  =====================================
decode         raw lines → changes         not JSON, not a change (``decode``)
redact         changes → redacted changes  dropped by the redaction policy, or a
                                           detector failed (``redact``), see
                                           :mod:`streamrag.ingest.pii`
event time     changes → window output     late (``window-late:W``), no value
                                           (``window-value:W``), a failure
                                           (``window-error``) — side outputs:
                                           the changes are indexed all the same
chunk          changes → chunked changes   chunking failed (``chunk``)
embed          chunks → vectors            poison text (``embed``), see
                                           :mod:`streamrag.runtime.commit`
=============  ==========================  =====================================

The model is Bytewax's ``WindowOut(down, late)``: the stream that goes on and
the side output, returned together.

Letters hold raw records — a line that failed to decode is not a change yet,
so no stage has redacted it — and :class:`LetterSink` scrubs their records and
reasons with the job's redactor before it stores or logs them.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from streamrag.changes import ChangeBatch, Op
from streamrag.chunking import Splitter, content_hash
from streamrag.errors import InputError
from streamrag.eventtime import EventTimeStage, StageOutput
from streamrag.ingest import DeadLetter, DeadLetterStore
from streamrag.ingest.formats import RecordDecoder
from streamrag.ingest.pii import Redactor
from streamrag.runtime.metrics import Metrics
from streamrag.sources.base import RawBatch
from streamrag.timing import Clock

__all__ = [
    "ChunkStage",
    "Chunked",
    "DecodeStage",
    "EventTimeStep",
    "LetterSink",
    "Prepared",
    "RedactStage",
    "Stage",
    "StageResult",
    "change_letter",
]

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out")
T = TypeVar("T")

log = logging.getLogger("streamrag.pipeline")


@dataclass(slots=True)
class StageResult(Generic[T]):
    """What a stage passes on, and what it refused."""

    out: T
    letters: list[DeadLetter] = field(default_factory=list)


class Stage(Protocol[In, Out]):
    """One step of the data path: never raises because of a record."""

    name: str

    def __call__(self, batch: In, /) -> StageResult[Out]:
        """Process ``batch``; refused records come back as letters."""
        ...


class DecodeStage:
    """Raw records into changes, schema on read, each by its source's format.

    See :mod:`streamrag.ingest.formats`.
    """

    name = "decode"

    def __init__(self, decoder: RecordDecoder) -> None:
        self.decoder = decoder

    def __call__(self, raws: list[RawBatch]) -> StageResult[ChangeBatch]:
        """Decode every line; a line that is not a valid change becomes a letter."""
        changes, letters = self.decoder.decode(raws)
        return StageResult(changes, letters)


class RedactStage:
    """Personal data out of every upsert before anything else sees it (:mod:`streamrag.ingest.pii`).

    Each upsert's text, title and metadata go through the redactor under the
    policy of its source: the source a configured connector names, else
    ``source_name(partition)`` (``push``, ``replay`` or ``input``). A change the
    policy drops, or one a detector fails on, becomes a ``redact`` letter whose
    reason names entity types and counts, never values. Deletes pass as they
    are; so does everything when there is no redactor. What was found is
    counted per entity type in ``streamrag_redactions_total``, except on a
    replay after a restart (those changes were counted when first read).
    """

    name = "redact"

    def __init__(
        self,
        redactor: Redactor | None,
        metrics: Metrics | None = None,
        *,
        source_name: Callable[[str], str] | None = None,
    ) -> None:
        self.redactor = redactor
        self.metrics = metrics
        self.source_name = source_name or (lambda _: "input")
        self._names: dict[str, str] = {}
        self.scrub: Callable[[DeadLetter], DeadLetter] | None = (
            None if redactor is None else redactor.scrub_letter
        )
        """Masks a letter's raw record and reason (None without a redactor)."""

    def name_of(self, partition: str, named: dict[str, str]) -> str:
        """The policy's name for the source of ``partition``."""
        name = named.get(partition) or self._names.get(partition)
        if name is None:
            if len(self._names) > 100_000:
                self._names.clear()
            name = self._names[partition] = self.source_name(partition)
        return name

    def _provenance(
        self, changes: ChangeBatch, named: dict[str, str]
    ) -> list[Mapping[str, Any]] | None:
        """The payloads without the journal's own fields where another source claims them.

        ``pushed_by`` and ``redactions`` go into the audit record, so only
        changes read from the push journal may carry them; a file or a queue
        that sends them has them removed. None when no change carries them.
        """
        payloads = changes.payloads
        claimed = [i for i, p in enumerate(payloads) if "redactions" in p or "pushed_by" in p]
        if not claimed:
            return None
        out = list(payloads)
        for i in claimed:
            if self.name_of(changes.sources[i], named) != "push":
                out[i] = {k: v for k, v in out[i].items() if k not in _JOURNAL_ONLY}
        return out

    def __call__(
        self, changes: ChangeBatch, raws: Sequence[RawBatch] = (), /, *, replay: bool = False
    ) -> StageResult[ChangeBatch]:
        """Redact the upserts of ``changes`` (read from ``raws``); refused ones become letters."""
        if not len(changes):
            return StageResult(changes)
        named = {r.source: r.decoder for r in raws if r.decoder is not None}
        payloads = self._provenance(changes, named)
        redactor = self.redactor
        if redactor is None:
            return StageResult(changes if payloads is None else replace(changes, payloads=payloads))
        payloads = list(changes.payloads) if payloads is None else payloads
        ops = changes.ops.tolist()
        upserts = [p for p, op in zip(payloads, ops, strict=True) if op != Op.DELETE]
        try:
            clean = redactor.screen_out(upserts)
        except Exception:  # each change then meets the redactor on its own, and its letter
            clean = False
        if clean:
            # Nothing any detector looks for in the whole batch (plain prose): every change
            # goes on as it is, with what the push journal had taken out still counted.
            if self.metrics is not None and not replay:
                journal: Counter[str] = Counter()
                for p in upserts:
                    if p.get("redactions"):
                        journal.update(p["redactions"])
                for entity, n in journal.items():
                    self.metrics.redactions.labels(entity=entity).inc(n)
            return StageResult(replace(changes, payloads=payloads))
        keep: list[int] = []
        letters: list[DeadLetter] = []
        counts: Counter[str] = Counter()
        for i, op in enumerate(ops):
            if op == Op.DELETE:
                keep.append(i)
                continue
            carried = payloads[i].get("redactions")  # what the push journal took out
            try:
                done = redactor.redact(payloads[i], self.name_of(changes.sources[i], named))
            except Exception as exc:  # a stage error must not stop the stream
                letters.append(change_letter(changes, i, "redact", _redaction_failed(exc)))
                continue
            if done.counts:  # most changes hold nothing to redact
                counts.update(done.counts)
            if done.payload is None:
                letters.append(change_letter(changes, i, "redact", done.reason or "dropped"))
                continue
            payloads[i] = done.payload
            if carried:
                counts.update(carried)
                if done.counts:
                    total = Counter(carried) + Counter(done.counts)
                    payloads[i] = {**done.payload, "redactions": dict(sorted(total.items()))}
            keep.append(i)
        if counts and self.metrics is not None and not replay:
            for entity, n in counts.items():
                self.metrics.redactions.labels(entity=entity).inc(n)
        out = replace(changes, payloads=payloads)
        return StageResult(out if len(keep) == len(changes) else out.take(keep), letters)


_JOURNAL_ONLY = ("pushed_by", "redactions")
"""Payload fields only the push journal writes: who pushed a change, what it redacted."""


def _redaction_failed(exc: Exception) -> str:
    """A letter's reason for a failed redaction: never the error's message, which may quote."""
    if isinstance(exc, InputError):  # the redactor's own, naming the detector
        return str(exc)
    return (
        f"the redaction failed ({type(exc).__name__}); the change was not applied, so nothing "
        "of it was stored unredacted"
    )


class Prepared(msgspec.Struct, frozen=True, gc=False):
    """A change's chunks and their content hashes, made before it is queued.

    One is made for every upsert and lives until its change is committed, often
    across several garbage-collector passes: as an untracked ``msgspec.Struct``
    (``gc=False``) holding tuples of strings and bytes (which the collector
    untracks once it has seen them), it adds nothing for those passes to visit
    and nothing that counts towards the next full collection. Strings, bytes
    and an integer cannot form a reference cycle, which makes that safe.
    """

    chunks: tuple[str, ...]
    hashes: tuple[bytes, ...]
    tokens: int


@dataclass(slots=True)
class Chunked:
    """Changes with the chunks of each upsert (``None`` for a delete)."""

    changes: ChangeBatch
    prepared: list[Prepared | None]

    @property
    def chunk_counts(self) -> list[int]:
        """Chunks per change, as the batcher counts them (a delete counts as one)."""
        return [len(p.chunks) if p else 1 for p in self.prepared]


class ChunkStage:
    """Each upsert into token-bounded chunks with their content hashes.

    Any :class:`~streamrag.chunking.Splitter` does: ``TokenSplitter`` or
    ``StructuredSplitter`` (whose chunks carry their heading path as a first line).
    """

    name = "chunk"

    def __init__(self, splitter: Splitter) -> None:
        self.splitter = splitter

    def __call__(self, changes: ChangeBatch) -> StageResult[Chunked]:
        """Chunk every upsert; a change that cannot be chunked becomes a letter."""
        prepared: list[Prepared | None] = []
        letters: list[DeadLetter] = []
        keep: list[int] = []
        split = self.splitter.split_counted
        for i, (op, payload) in enumerate(zip(changes.ops.tolist(), changes.payloads, strict=True)):
            if op == Op.DELETE:
                prepared.append(None)
                keep.append(i)
                continue
            try:
                chunks, tokens = split(payload["text"])
            except Exception as exc:  # a stage error must not stop the stream
                reason = f"chunking failed: {type(exc).__name__}: {exc}"
                raw = repr(dict(payload))[:64_000]
                letters.append(
                    DeadLetter(changes.sources[i], int(changes.offsets[i]), "chunk", reason, raw)
                )
                continue
            hashes = tuple([content_hash(c) for c in chunks])
            prepared.append(Prepared(tuple(chunks), hashes, tokens))
            keep.append(i)
        if len(keep) < len(changes):
            changes = changes.take(keep)
        return StageResult(Chunked(changes, prepared), letters)


class EventTimeStep:
    """The event-time stage as a step: window output on, side outputs as letters.

    Its letters are side outputs, not refusals: the changes behind them go on
    to the index. A failure of the stage itself becomes a ``window-error``
    letter for each change (and an empty output), never a lost read.
    """

    name = "event-time"

    def __init__(self, stage: EventTimeStage, inputs: Callable[[str], str] | None = None) -> None:
        self.stage = stage
        self.inputs = inputs
        """Partition → watermark input, for sources whose partitions share one (a folder)."""
        self._named: dict[str, str] = {}

    def input_of(self, partition: str) -> str:
        """The watermark input ``partition`` counts towards."""
        if self.inputs is None:
            return partition
        named = self._named.get(partition)
        if named is None:
            if len(self._named) > 100_000:
                self._named.clear()
            named = self._named[partition] = self.inputs(partition)
        return named

    def __call__(self, changes: ChangeBatch) -> StageResult[StageOutput]:
        """Window the changes; late ones and those without a value become side outputs."""
        try:
            grouped = changes
            if self.inputs is not None:
                grouped = replace(changes, sources=[self.input_of(p) for p in changes.sources])
            out = self.stage.process(grouped)
        except Exception as exc:
            log.exception("the event-time stage failed on %d changes", len(changes))
            reason = (
                f"the event-time stage failed: {type(exc).__name__}: {exc}; the change was "
                "applied to the index but not counted in the windows"
            )
            letters = [
                change_letter(changes, i, "window-error", reason) for i in range(len(changes))
            ]
            return StageResult(StageOutput([], []), letters)
        return StageResult(out, self.side_outputs(out, changes))

    @staticmethod
    def side_outputs(out: StageOutput, changes: ChangeBatch | None) -> list[DeadLetter]:
        """Letters for the late changes and the changes without a window's value."""
        if changes is None:
            return []
        letters = []
        for name, el in out.late:
            reason = (
                f"late for window {name!r}: event time {el.event_time} µs is behind "
                f"the watermark {el.watermark} µs beyond the allowed lateness; the "
                "change was applied to the index but not counted in the window"
            )
            letters.append(change_letter(changes, el.index, f"window-late:{name}", reason))
        for name, row, reason in out.invalid:
            letters.append(change_letter(changes, row, f"window-value:{name}", reason))
        return letters


class LetterSink:
    """Where every refused record goes: the dead-letter store, the metrics and the log.

    Counting them in the pipeline's totals is the pipeline's part, under its
    lock (a record moves from one count to another in one step). ``scrub``
    (the redactor's) masks personal data in each letter's raw record and reason
    first, so that neither the store nor the log holds it.
    """

    def __init__(
        self,
        store: DeadLetterStore,
        metrics: Metrics,
        clock: Clock,
        *,
        side_outputs: bool = True,
        scrub: Callable[[DeadLetter], DeadLetter] | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.side_outputs = side_outputs
        self.scrub = scrub

    def _scrubbed(self, letters: list[DeadLetter]) -> list[DeadLetter]:
        scrub = self.scrub
        return letters if scrub is None else [scrub(letter) for letter in letters]

    def refused(self, letters: list[DeadLetter]) -> None:
        """Store, count in the metrics and log records that were not applied."""
        if not letters:
            return
        letters = self._scrubbed(letters)
        self.store.add_many(letters, self.clock.now_us())
        for letter in letters:
            self.metrics.dead_letters.labels(stage=letter.stage).inc()
            log.warning(
                "dead-lettered %s@%d (%s): %s",
                letter.source,
                letter.offset,
                letter.stage,
                letter.reason,
            )

    def side_output(self, letters: list[DeadLetter]) -> None:
        """Keep side outputs of changes that were applied (if configured); no log line each."""
        if letters and self.side_outputs:
            self.store.add_many(self._scrubbed(letters), self.clock.now_us())

    def close(self) -> None:
        """Close the dead-letter store's file."""
        self.store.close()


def change_letter(changes: ChangeBatch, row: int, stage: str, reason: str) -> DeadLetter:
    """A dead letter for a decoded change: the change itself, as JSON, is the record."""
    record = {
        "tenant": changes.tenants[row],
        "doc_id": changes.doc_ids[row],
        "op": "delete" if changes.ops[row] == Op.DELETE else "upsert",
        "event_time_us": int(changes.event_times[row]),
        **dict(changes.payloads[row]),
    }
    raw = json.dumps(record, ensure_ascii=False, default=str)[:64_000]
    return DeadLetter(changes.sources[row], int(changes.offsets[row]), stage, reason, raw)
