"""streamrag: a live RAG engine — change streams in, a fresh versioned index and answers out.

The data path, stage by stage (each stage is a subpackage or module)::

    ① sources/      read raw records; resume position = offset
    ② ingest/       decode, validate, normalize; bad records → dead-letter store
    ③ eventtime/    watermarks: how far event time has progressed
    ④ (partition)   semantic key → shard                       (planned)
    ⑤ chunking/     split documents; stable chunk ids; content hashes
    ⑥ batching/     micro-batches by size, tokens, deadline and watermark
    ⑦ embed/        texts → unit vectors, in batches (MiniLM, hashing, yours)
    ⑧ index/        versioned vector index: one epoch per micro-batch
    ⑨ runtime/      wires ①–⑧: intake.py reads through stages.py, flush.py + commit.py make
                    each micro-batch one epoch with its cursor.py; threads, metrics
    ⑩ serve/        HTTP API: retrieve, answers (cache, context, LLM), OpenAI-compatible
    ⑪ (feedback)    clicks → rerank weights                     (planned)

Core types live in :mod:`streamrag.changes` (``Change``, ``ChangeBatch``),
:mod:`streamrag.timing` (integer-microsecond UTC time, clocks),
:mod:`streamrag.config` (``Settings``) and :mod:`streamrag.errors`.
:mod:`streamrag.testing` is the test kit.

Heavy modules load on first use, so ``import streamrag`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Change",
    "ChangeBatch",
    "Embedder",
    "ExactIndex",
    "Op",
    "Pipeline",
    "Service",
    "Settings",
    "StreamragError",
    "create_app",
    "load_settings",
]

_WHERE = {
    "Change": "streamrag.changes",
    "ChangeBatch": "streamrag.changes",
    "Op": "streamrag.changes",
    "Embedder": "streamrag.embed.base",
    "ExactIndex": "streamrag.index.exact",
    "Pipeline": "streamrag.runtime.pipeline",
    "Service": "streamrag.runtime.service",
    "Settings": "streamrag.config",
    "load_settings": "streamrag.config",
    "StreamragError": "streamrag.errors",
    "create_app": "streamrag.serve.app",
}

if TYPE_CHECKING:
    from streamrag.changes import Change, ChangeBatch, Op
    from streamrag.config import Settings, load_settings
    from streamrag.embed.base import Embedder
    from streamrag.errors import StreamragError
    from streamrag.index.exact import ExactIndex
    from streamrag.runtime.pipeline import Pipeline
    from streamrag.runtime.service import Service
    from streamrag.serve.app import create_app


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        msg = f"module 'streamrag' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
