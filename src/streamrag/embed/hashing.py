"""A deterministic hashing embedder: fast, dependency-free, for tests and benchmarks.

Each lower-cased word is hashed (BLAKE2b, so the result is the same in every
process) to one of ``dim`` buckets with a sign; a text's vector is the signed
count of its words per bucket, L2-normalized. Texts that share words score high
with each other, which is enough to test retrieval end to end. It knows nothing
of meaning: use MiniLM or your own model for real retrieval.

>>> e = HashingEmbedder(dim=64)
>>> v = e.embed_many(["the cat sat", "the cat sat", "stock prices fell"])
>>> v.shape, round(float(v[0] @ v[1]), 3), float(v[0] @ v[2]) < 0.5
((3, 64), 1.0, True)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from streamrag.errors import ArgumentError

__all__ = ["HashingEmbedder"]

_WORD = re.compile(r"\w+")


class HashingEmbedder:
    """Signed feature hashing of words into ``dim`` dimensions."""

    in_process = True
    """Computes on this CPU, no I/O (see :func:`streamrag.embed.base.in_process`)."""

    holds_gil = True
    """Computes in Python, holding the interpreter lock: a job embeds its backlog in a
    worker process (:mod:`streamrag.embed.ahead`)."""

    def __init__(self, dim: int = 384, *, max_cache: int = 1_000_000) -> None:
        if dim <= 0:
            msg = f"dim must be positive, found {dim}"
            raise ArgumentError(msg)
        self._dim = dim
        self._max_cache = max_cache
        self._cache: dict[str, int] = {}

    @property
    def dim(self) -> int:
        """Vector length."""
        return self._dim

    @property
    def version(self) -> str:
        """Identifies the hashing scheme and dimension."""
        return f"hashing-blake2b-v1-d{self._dim}"

    def _feature(self, word: str) -> int:
        digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        bucket = digest % self._dim
        # Encode the sign in the low bit: feature = 2 * bucket + (1 if negative).
        feature = 2 * bucket + ((digest >> 63) & 1)
        if len(self._cache) >= self._max_cache:
            self._cache.clear()
        self._cache[word] = feature
        return feature

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts; rows are unit length (all-zero for a text without words)."""
        n = len(texts)
        dim = self._dim
        get = self._cache.get
        feature = self._feature
        findall = _WORD.findall
        feats: list[int] = []
        counts = np.empty(n, dtype=np.int64)
        for i, text in enumerate(texts):
            words = findall(text.lower())
            counts[i] = len(words)
            feats.extend([c if (c := get(w)) is not None else feature(w) for w in words])
        f = np.asarray(feats, dtype=np.int64)
        rows = np.repeat(np.arange(n, dtype=np.int64), counts)
        signs = 1.0 - 2.0 * (f & 1)
        flat = rows * dim + (f >> 1)
        out = np.bincount(flat, weights=signs, minlength=n * dim).reshape(n, dim)
        vectors = out.astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its word cache (a copy fills its own)."""
        return {**self.__dict__, "_cache": {}}

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self._dim})"
