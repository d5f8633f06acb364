"""Decode raw lines into changes, schema on read.

Each line is a JSON object::

    {"doc_id": "runbook-42", "op": "upsert", "event_time": "2024-05-01T12:00:00Z",
     "text": "...", "tenant": "acme", "domain": "ops", "title": "...", "metadata": {...}}

``doc_id`` and ``event_time`` (ISO-8601 with a zone, or epoch seconds) are
required; ``op`` defaults to ``upsert``, which needs a non-empty ``text``;
``tenant`` defaults to the configured default. Unknown fields are ignored.

A line that fails any check becomes a :class:`~streamrag.ingest.deadletter.DeadLetter`
with a reason that says what was expected and what to do; decoding never raises
for bad input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec
import numpy as np

from streamrag.changes import ChangeBatch, Op
from streamrag.ingest.deadletter import DeadLetter
from streamrag.ingest.normalize import normalize_text
from streamrag.sources.base import RawBatch
from streamrag.timing import parse_timestamp

__all__ = ["Decoder"]


class _Record(msgspec.Struct, kw_only=True):
    doc_id: str
    event_time: str | int | float
    op: Literal["upsert", "delete"] = "upsert"
    tenant: str | None = None
    text: str | None = None
    title: str | None = None
    domain: str | None = None
    metadata: dict[str, Any] | None = None


_OPS = {"upsert": Op.UPSERT, "delete": Op.DELETE}


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
            for line, offset in zip(raw.lines, raw.offsets, strict=True):
                try:
                    if len(line) > limit:
                        msg = (
                            f"record is {len(line)} bytes, above ingest.max_document_bytes="
                            f"{limit}; split the document or raise the limit"
                        )
                        raise ValueError(msg)
                    rec = decode(line)
                    tenant, doc_id, op, ts, payload = self._check(rec, default_tenant)
                except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
                    letters.append(
                        DeadLetter(source, offset, self.stage, _reason(exc), _show(line, limit))
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
            raise ValueError(msg)
        tenant = rec.tenant.strip() if rec.tenant else default_tenant
        try:
            ts = parse_timestamp(rec.event_time)
        except ValueError as exc:
            msg = f"field 'event_time': {exc}"
            raise ValueError(msg) from None
        op = _OPS[rec.op]
        if op is Op.DELETE:
            return tenant, doc_id, op, ts, {}
        text = normalize_text(rec.text) if rec.text is not None else ""
        if not text:
            msg = (
                "an upsert needs a non-empty 'text' field; send the document body, "
                'or use "op": "delete" to remove the document'
            )
            raise ValueError(msg)
        payload: dict[str, Any] = {"text": text}
        if rec.title:
            payload["title"] = rec.title
        if rec.domain:
            payload["domain"] = rec.domain
        if rec.metadata:
            payload["metadata"] = rec.metadata
        return tenant, doc_id, op, ts, payload


def _reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: {exc}; write each line as UTF-8 encoded JSON"
    if isinstance(exc, msgspec.ValidationError):  # a subclass of DecodeError: test it first
        return f"does not match the change schema: {exc}"
    if isinstance(exc, msgspec.DecodeError):
        return f"not a JSON object: {exc}; each line must be one JSON object"
    return str(exc)


def _show(line: bytes, limit: int) -> str:
    text = line[: min(limit, 64_000)].decode("utf-8", "backslashreplace")
    return text if len(line) <= 64_000 else text + "…[cut]"
