"""Stable chunk identities and content hashes.

A chunk's id depends only on ``(tenant, doc_id, position)``: the same document
always yields the same ids, whatever the run, the machine or the arrival order
(invariant 3, stream = batch). Its content hash depends only on its text and
tells whether a chunk changed between two versions of a document; an unchanged
chunk keeps its vector instead of being embedded again.

>>> chunk_id("acme", "doc-1", 0) == chunk_id("acme", "doc-1", 0)
True
>>> chunk_id("acme", "doc-1", 0) != chunk_id("other", "doc-1", 0)
True
>>> len(content_hash("hello")), content_hash("hello") == content_hash("hello ")
(16, False)
"""

from __future__ import annotations

import hashlib

__all__ = ["chunk_id", "chunk_id_text", "content_hash"]


def chunk_id(tenant: str, doc_id: str, position: int) -> int:
    """A signed 64-bit id for the chunk at ``position`` of a document."""
    key = f"{tenant}\x1f{doc_id}\x1f{position}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little", signed=True)


def chunk_id_text(cid: int) -> str:
    """A chunk id as clients see it: 16 hex digits of its unsigned 64 bits.

    >>> chunk_id_text(-1)
    'ffffffffffffffff'
    """
    return f"{cid & 0xFFFFFFFFFFFFFFFF:016x}"


def content_hash(text: str) -> bytes:
    """A 128-bit digest of a chunk's text."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
