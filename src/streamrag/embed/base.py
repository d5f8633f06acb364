"""The embedder contract, and how a configured embedder is found and built.

An embedder turns texts into vectors, many at a time::

    embed_many(texts) -> float32 array of shape (len(texts), dim)

Rows should be L2-normalized (scores are inner products); the pipeline checks
shape, type and finiteness and normalizes anyway. ``version`` names the model
and its settings: every chunk records it, so a change of model is traceable.
An embedder may also offer ``count_tokens(text) -> int`` (:class:`CountsTokens`);
chunking then measures chunks in the model's own tokens. One with a slow start
offers ``load()`` (:class:`Loadable`). Callers check these with ``isinstance``.

The configuration names an embedder by a registered short name (``minilm``,
``hashing``) or by import path (``"mypkg.embedders:MyEmbedder"``), with keyword
arguments in ``args``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from streamrag.errors import ConfigError, EmbedderError

__all__ = [
    "REGISTRY",
    "CountsTokens",
    "Embedder",
    "Loadable",
    "build_embedder",
    "check_vectors",
    "in_process",
]

REGISTRY: dict[str, str] = {
    "hashing": "streamrag.embed.hashing:HashingEmbedder",
    "minilm": "streamrag.embed.sentence_transformers:SentenceTransformerEmbedder",
    "minilm-onnx": "streamrag.embed.onnx:OnnxEmbedder",
    "openai": "streamrag.embed.remote:OpenAIEmbedder",
    "sentence-transformers": "streamrag.embed.sentence_transformers:SentenceTransformerEmbedder",
    "tei": "streamrag.embed.remote:TEIEmbedder",
}
"""Short names accepted in ``embedder.class``."""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors, in batches."""

    @property
    def dim(self) -> int:
        """Length of each vector."""
        ...

    @property
    def version(self) -> str:
        """Model name and settings, recorded with every chunk."""
        ...

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Return one row per text, shape ``(len(texts), dim)``, float32."""
        ...


def in_process(embedder: object) -> bool | None:
    """Whether ``embedder`` says it computes on this process's CPU, with no I/O to wait on.

    An embedder says so with a class attribute ``in_process = True`` (hashing,
    ONNX, sentence-transformers); one that calls a service says ``in_process =
    False`` (OpenAI, TEI), since a call can wait on the network for as long as
    its timeout. None: it does not say (an embedder class of the user's); then
    its query calls are measured (:mod:`streamrag.embed.computes_here`). Only
    queries whose embedders compute here may be answered on the server's event
    loop (:class:`~streamrag.serve.batcher.QueryBatcher`): their time is
    bounded by the work, which the batcher measures.
    """
    said = getattr(type(embedder), "in_process", None)
    return said if isinstance(said, bool) else None


@runtime_checkable
class CountsTokens(Protocol):
    """An embedder that counts tokens as its model does: chunks are then measured in them."""

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` (without special tokens)."""
        ...


@runtime_checkable
class Loadable(Protocol):
    """An embedder with a slow start (a model to load): a job loads it before it serves."""

    def load(self) -> None:
        """Load the model now rather than on the first call."""
        ...


def build_embedder(class_path: str, args: Mapping[str, Any] | None = None) -> Embedder:
    """Import and construct the embedder named by ``class_path``.

    >>> build_embedder("hashing", {"dim": 8}).dim
    8
    >>> build_embedder("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamrag.errors.ConfigError: config key 'embedder.class' = 'nope': expected one of ...
    """
    target = REGISTRY.get(class_path, class_path)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        names = ", ".join(repr(n) for n in REGISTRY)
        msg = (
            f"config key 'embedder.class' = {class_path!r}: expected one of {names} "
            "or an import path 'package.module:ClassName'"
        )
        raise ConfigError(msg)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"config key 'embedder.class' = {class_path!r}: cannot import {module_name!r} ({exc})"
        raise ConfigError(msg) from None
    factory = getattr(module, attr, None)
    if factory is None:
        msg = f"config key 'embedder.class' = {class_path!r}: {module_name!r} has no {attr!r}"
        raise ConfigError(msg)
    try:
        embedder = factory(**dict(args or {}))
    except TypeError as exc:
        msg = f"config key 'embedder.args' = {dict(args or {})!r}: {exc}"
        raise ConfigError(msg) from None
    for needed in ("dim", "version", "embed_many"):
        if not hasattr(embedder, needed):
            msg = (
                f"config key 'embedder.class' = {class_path!r}: the object has no {needed!r}; "
                "an embedder needs dim, version and embed_many(texts)"
            )
            raise ConfigError(msg)
    return embedder  # type: ignore[no-any-return]


def check_vectors(vectors: object, n: int, dim: int, who: str) -> npt.NDArray[np.float32]:
    """Validate an embedder's output and return it as L2-normalized float32 rows."""
    arr = np.asarray(vectors)
    if arr.shape != (n, dim):
        msg = f"{who} returned shape {arr.shape} for {n} texts; expected ({n}, {dim})"
        raise EmbedderError(msg)
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if n and not np.isfinite(arr).all():
        msg = f"{who} returned NaN or infinite values; check the model and its inputs"
        raise EmbedderError(msg)
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    np.divide(arr, norms, out=arr, where=norms > 0)
    return arr
