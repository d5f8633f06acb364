"""Embedders the embedding worker of ``test_ahead.py`` builds in its own process.

They live in a module (not in the test file's functions) so that a pickled copy
can be loaded in the worker, which imports them by name.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from streamrag.embed.hashing import HashingEmbedder
from streamrag.testing import CountingEmbedder

POISON = "zzpoison"
"""A word the poisoned embedder refuses, in whichever process it runs."""


class Poisoned(HashingEmbedder):
    """The hashing embedder, raising for any call with a text that holds :data:`POISON`."""

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if any(POISON in t for t in texts):
            msg = "cannot embed a poisoned text"
            raise ValueError(msg)
        return super().embed_many(texts)


class Recording(HashingEmbedder):
    """The hashing embedder that keeps the pid of the process of each call, by text."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__(dim=dim)
        self.pids: dict[str, int] = {}

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        pid = os.getpid()
        self.pids.update(dict.fromkeys(texts, pid))
        return super().embed_many(texts)


class OtherVersion(HashingEmbedder):
    """Reports another version in every process but the one that made it."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__(dim=dim)
        self.home = os.getpid()

    @property
    def version(self) -> str:
        """Its version here; another one in a worker process."""
        return super().version + ("" if os.getpid() == self.home else "-elsewhere")


class Waiting(CountingEmbedder):
    """Says nothing of the lock, and waits 2 ms a call with it released (as on a network)."""

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Wait, then embed."""
        time.sleep(0.002)
        return super().embed_many(texts)
