"""Record formats: each source's records reach the decoder that knows their shape.

A JSONL file holds streamrag's own changes, a Kafka topic may hold Debezium
events, a folder holds PDF files. Every reader marks its batches with the name
of its decoder (:attr:`RawBatch.decoder <streamrag.sources.base.RawBatch>`,
None for streamrag's own format), and :class:`DecoderSet` hands each batch to
that decoder.

**One outcome per record.** Whatever the format, a decoder turns each record
into exactly one change or exactly one dead letter. The job's counts rest on it
(``ingested = applied + dead_lettered + pending``): a record that became no
change, or two, would leave them off. A format whose record means "nothing"
(a Debezium tombstone after its delete) maps it to the change it implies (the
delete of that key) rather than dropping it.

:class:`ChangeColumns` is how a decoder builds its :class:`ChangeBatch`, one
checked change at a time (:func:`check_change` holds the rules every format
shares: a non-empty id and tenant, an upsert with text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec
import numpy as np

from streamrag.changes import ChangeBatch, Op
from streamrag.errors import DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.normalize import normalize_text
from streamrag.sources.base import RawBatch
from streamrag.timing import Timestamp

__all__ = [
    "ChangeColumns",
    "DecoderSet",
    "RecordDecoder",
    "check_change",
    "check_size",
    "decode_each",
    "reason",
    "show",
]

OneRecord = Callable[[bytes, bytes | None, Timestamp | None], tuple[str, str, int, int, Any]]
"""Decodes one record (line, key, record time) to ``(doc_id, tenant, op, event_time, payload)``."""


@runtime_checkable
class RecordDecoder(Protocol):
    """Turns the records of raw batches into changes and dead letters, one outcome each."""

    stage: str
    """The stage named in dead letters (``decode`` for every record format)."""

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode every record; never raises, whatever the bytes."""
        ...


def check_change(
    doc_id: str,
    tenant: str,
    op: Op,
    *,
    text: str | None = None,
    title: str | None = None,
    domain: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """The rules every format shares; returns ``(doc_id, tenant, payload)`` or raises DecodeError.

    >>> check_change(" a ", "t", Op.UPSERT, text="Hello")
    ('a', 't', {'text': 'Hello'})
    """
    doc_id = doc_id.strip()
    if not doc_id:
        msg = "the document id is empty; give every record a stable, non-empty document id"
        raise DecodeError(msg)
    tenant = tenant.strip()
    if not tenant:
        msg = "the tenant is empty; omit it for the default tenant, or name the tenant"
        raise DecodeError(msg)
    if op is Op.DELETE:
        return doc_id, tenant, {}
    body = normalize_text(text) if text is not None else ""
    if not body:
        msg = (
            "an upsert needs a non-empty text; send the document body, or a delete to "
            "remove the document"
        )
        raise DecodeError(msg)
    payload: dict[str, Any] = {"text": body}
    if title:
        payload["title"] = title
    if domain:
        payload["domain"] = domain
    if metadata:
        payload["metadata"] = dict(metadata)
    return doc_id, tenant, payload


class ChangeColumns:
    """Accumulates checked changes column by column, then makes one :class:`ChangeBatch`."""

    def __init__(self) -> None:
        self.tenants: list[str] = []
        self.doc_ids: list[str] = []
        self.ops: list[int] = []
        self.times: list[int] = []
        self.payloads: list[Mapping[str, Any]] = []
        self.sources: list[str] = []
        self.offsets: list[int] = []

    def add(
        self,
        tenant: str,
        doc_id: str,
        op: int,
        event_time: Timestamp,
        payload: Mapping[str, Any],
        source: str,
        offset: int,
    ) -> None:
        """One change, already checked."""
        self.tenants.append(tenant)
        self.doc_ids.append(doc_id)
        self.ops.append(op)
        self.times.append(event_time)
        self.payloads.append(payload)
        self.sources.append(source)
        self.offsets.append(offset)

    def batch(self) -> ChangeBatch:
        """The changes added so far, as columns."""
        return ChangeBatch(
            tenants=self.tenants,
            doc_ids=self.doc_ids,
            ops=np.asarray(self.ops, dtype=np.int8),
            event_times=np.asarray(self.times, dtype=np.int64),
            payloads=self.payloads,
            sources=self.sources,
            offsets=np.asarray(self.offsets, dtype=np.int64),
        )


class DecoderSet:
    """Hands each raw batch to the decoder its reader named (None: streamrag's own format)."""

    stage = "decode"

    def __init__(
        self, default: RecordDecoder, named: Mapping[str, RecordDecoder] | None = None
    ) -> None:
        self.default = default
        self.named = dict(named or {})

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode runs of batches that share a decoder, in order; unknown names dead-letter."""
        parts: list[ChangeBatch] = []
        letters: list[DeadLetter] = []
        run: list[RawBatch] = []
        for raw in [*raws, None]:
            if run and (raw is None or raw.decoder != run[0].decoder):
                changes, refused = self._one(run)
                parts.append(changes)
                letters.extend(refused)
                run = []
            if raw is not None:
                run.append(raw)
        if not parts:
            return ChangeBatch.empty(), letters
        return (parts[0] if len(parts) == 1 else ChangeBatch.concat(parts)), letters

    def _one(self, run: list[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        name = run[0].decoder
        decoder = self.default if name is None else self.named.get(name)
        if decoder is not None:
            return decoder.decode(run)
        known = ", ".join(sorted(self.named)) or "none"
        reason = (
            f"no decoder named {name!r} is configured (configured: {known}); the source "
            "that read this record and the decoders were built from different settings"
        )
        letters = [
            DeadLetter(raw.source, off, self.stage, reason, line[:200].decode("utf-8", "replace"))
            for raw in run
            for line, off in zip(raw.lines, raw.offsets, strict=True)
        ]
        return ChangeBatch.empty(), letters


def decode_each(
    raws: Sequence[RawBatch], stage: str, limit: int, one: OneRecord
) -> tuple[ChangeBatch, list[DeadLetter]]:
    """Run ``one`` over every record within the size limit; any error makes a dead letter.

    The loop every record format shares: one outcome per record, whatever
    ``one`` raises, with the record's source and offset.
    """
    out = ChangeColumns()
    letters: list[DeadLetter] = []
    for raw in raws:
        sizes = raw.sizes or {}
        for i, (line, offset) in enumerate(zip(raw.lines, raw.offsets, strict=True)):
            try:
                check_size(sizes.get(i, len(line)), limit)
                key = raw.keys[i] if raw.keys is not None else None
                time = raw.times[i] if raw.times is not None else None
                doc_id, tenant, op, ts, payload = one(line, key, time)
            except Exception as exc:  # any error dead-letters the record, never the read
                letters.append(
                    DeadLetter(raw.source, offset, stage, reason(exc), show(line, limit))
                )
                continue
            out.add(tenant, doc_id, op, ts, payload, raw.source, offset)
    return out.batch(), letters


def check_size(size: int, limit: int) -> None:
    """Refuse a record above ``ingest.max_document_bytes``."""
    if size > limit:
        msg = (
            f"record is {size:,} bytes, above ingest.max_document_bytes={limit:,}; "
            "split the document or raise the limit"
        )
        raise DecodeError(msg)


def reason(exc: Exception) -> str:
    """The dead letter's reason for an error met while decoding a record."""
    if isinstance(exc, RecursionError):
        return (
            "JSON nested too deeply to decode (RecursionError); flatten the record: "
            "column values should be scalars or shallow objects"
        )
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: {exc}; write each record as UTF-8 encoded JSON"
    if isinstance(exc, msgspec.DecodeError):
        return f"not JSON: {exc}; each record must be one JSON object"
    if isinstance(exc, ValueError):
        return str(exc)
    return f"the decoder failed on this record: {type(exc).__name__}: {exc}"


def show(line: bytes, limit: int) -> str:
    """The record as the dead letter keeps it (cut at 64 kB)."""
    text = line[: min(limit, 64_000)].decode("utf-8", "backslashreplace")
    return text if len(line) <= 64_000 else text + "…[cut]"
