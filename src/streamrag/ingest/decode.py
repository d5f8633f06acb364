"""Decode raw lines into changes, schema on read.

Each line is a JSON object::

    {"doc_id": "runbook-42", "op": "upsert", "event_time": "2024-05-01T12:00:00Z",
     "text": "...", "tenant": "acme", "domain": "ops", "title": "...", "metadata": {...}}

``doc_id`` and ``event_time`` (ISO-8601 with a zone, or epoch seconds) are
required; ``op`` defaults to ``upsert``, which needs a non-empty ``text``;
``tenant`` defaults to the configured default. Unknown fields are ignored.

A line that fails any check becomes a :class:`~streamrag.ingest.deadletter.DeadLetter`
with a reason that says what was expected and what to do. Decoding never raises,
whatever the input: a line nested too deeply for the decoder (``RecursionError``),
or one that trips any other error, is dead-lettered with the error named, and
the lines around it are decoded as usual. A UTF-8 byte-order mark at the start
of a line is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import numpy as np

from streamrag.changes import ChangeBatch, Op
from streamrag.errors import DecodeError
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.formats import show
from streamrag.ingest.normalize import normalize_text
from streamrag.sources.base import RawBatch
from streamrag.timing import parse_timestamp

__all__ = ["Decoder"]


class _Record(msgspec.Struct, kw_only=True):
    doc_id: str
    event_time: str | int | float
    op: Literal["upsert", "delete"] = "upsert"
    tenant: str | None = None
    """Omitted (or null): the configured default tenant. An empty string is refused."""
    text: str | None = None
    title: str | None = None
    domain: str | None = None
    metadata: dict[str, Any] | None = None
    pushed_by: str | None = None
    """The API key's name, set by ``POST /v1/documents`` (kept in the payload for the audit)."""
    redactions: dict[str, int] | None = None
    """What the push journal redacted before writing the change (kept for the audit's counts)."""


_OPS = {"upsert": Op.UPSERT, "delete": Op.DELETE}
_BOM = b"\xef\xbb\xbf"


class Decoder:
    """Turns :class:`RawBatch` lines into a :class:`ChangeBatch` plus dead letters."""

    stage = "decode"

    def __init__(self, *, default_tenant: str = "default", max_document_bytes: int = 1_000_000):
        self.default_tenant = default_tenant
        self.max_document_bytes = max_document_bytes
        self._decoder = msgspec.json.Decoder(_Record)

    def decode(self, raws: Sequence[RawBatch]) -> tuple[ChangeBatch, list[DeadLetter]]:
        """Decode every line; good ones become changes, bad ones dead letters."""
        tenants: list[str] = []
        doc_ids: list[str] = []
        ops: list[int] = []
        times: list[int] = []
        payloads: list[Mapping[str, Any]] = []
        sources: list[str] = []
        offsets: list[int] = []
        letters: list[DeadLetter] = []
        decode = self._decoder.decode
        limit = self.max_document_bytes
        default_tenant = self.default_tenant
        for raw in raws:
            source = raw.source
            sizes = raw.sizes or {}
            for i, (line, offset) in enumerate(zip(raw.lines, raw.offsets, strict=True)):
                try:
                    if line.startswith(_BOM):
                        line = line[len(_BOM) :]
                    size = sizes.get(i, len(line))
                    if size > limit:
                        msg = (
                            f"record is {size:,} bytes, above ingest.max_document_bytes="
                            f"{limit:,}; split the document or raise the limit"
                        )
                        raise DecodeError(msg)
                    rec = decode(line)
                    tenant, doc_id, op, ts, payload = self._check(rec, default_tenant)
                except Exception as exc:  # any error dead-letters the line, never the read
                    letters.append(
                        DeadLetter(source, offset, self.stage, _reason(exc), show(line, limit))
                    )
                    continue
                tenants.append(tenant)
                doc_ids.append(doc_id)
                ops.append(op)
                times.append(ts)
                payloads.append(payload)
                sources.append(source)
                offsets.append(offset)
        batch = ChangeBatch(
            tenants=tenants,
            doc_ids=doc_ids,
            ops=np.asarray(ops, dtype=np.int8),
            event_times=np.asarray(times, dtype=np.int64),
            payloads=payloads,
            sources=sources,
            offsets=np.asarray(offsets, dtype=np.int64),
        )
        return batch, letters

    @staticmethod
    def _check(rec: _Record, default_tenant: str) -> tuple[str, str, int, int, dict[str, Any]]:
        doc_id = rec.doc_id.strip()
        if not doc_id:
            msg = "field 'doc_id' is empty; give every record a stable, non-empty document id"
            raise DecodeError(msg)
        if rec.tenant is None:
            tenant = default_tenant
        else:
            tenant = rec.tenant.strip()
            if not tenant:
                msg = (
                    "field 'tenant' is empty; omit it (or send null) for the default tenant, "
                    "or name the tenant"
                )
                raise DecodeError(msg)
        try:
            ts = parse_timestamp(rec.event_time)
        except ValueError as exc:
            msg = f"field 'event_time': {exc}"
            raise DecodeError(msg) from None
        op = _OPS[rec.op]
        if op is Op.DELETE:
            return tenant, doc_id, op, ts, {"pushed_by": rec.pushed_by} if rec.pushed_by else {}
        text = normalize_text(rec.text) if rec.text is not None else ""
        if not text:
            msg = (
                "an upsert needs a non-empty 'text' field; send the document body, "
                'or use "op": "delete" to remove the document'
            )
            raise DecodeError(msg)
        payload: dict[str, Any] = {"text": text}
        if rec.title:
            payload["title"] = rec.title
        if rec.domain:
            payload["domain"] = rec.domain
        if rec.metadata:
            payload["metadata"] = rec.metadata
        if rec.pushed_by:
            payload["pushed_by"] = rec.pushed_by
        if rec.redactions:
            payload["redactions"] = rec.redactions
        return tenant, doc_id, op, ts, payload


def _reason(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return (
            "JSON nested too deeply to decode (RecursionError); flatten the record: "
            "metadata values should be scalars or shallow objects"
        )
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: {exc}; write each line as UTF-8 encoded JSON"
    if isinstance(exc, msgspec.ValidationError):  # a subclass of DecodeError: test it first
        return f"does not match the change schema: {exc}"
    if isinstance(exc, msgspec.DecodeError):
        return f"not a JSON object: {exc}; each line must be one JSON object"
    if isinstance(exc, ValueError):
        return str(exc)
    return f"the decoder failed on this record: {type(exc).__name__}: {exc}"
