r"""Server-sent events: ``event:`` and ``data:`` lines, a blank line after each event.

>>> sse({"text": "hi"}, event="delta")
b'event: delta\ndata: {"text":"hi"}\n\n'
>>> sse("[DONE]")
b'data: [DONE]\n\n'
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["SSE_HEADERS", "sse"]

_encode = msgspec.json.Encoder().encode

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
"""Headers that keep proxies from buffering a stream."""


def sse(data: Any, *, event: str | None = None) -> bytes:
    """One event: ``data`` as JSON (a string is sent as it is)."""
    body = data.encode() if isinstance(data, str) else _encode(data)
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + body + b"\n\n"
