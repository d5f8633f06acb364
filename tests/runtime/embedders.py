"""Embedders for tests that run streamrag in a subprocess (named in its config).

* :class:`SelfKilling` — the hashing embedder that SIGKILLs its own process on
  a chosen call (``KILLTEST_AT_CALL``), either while embedding or a
  moment after returning, so the kill lands inside a commit: between taking a
  batch and its log record, or in the middle of writing it.
* :class:`Slow` — the hashing embedder at a fixed rate, far below what a source
  can deliver: for backpressure tests.
* :class:`Gated` — holds a re-index's backfill at a gate the test opens.
* :class:`BackfillKiller` — SIGKILLs its process during a re-index's backfill.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from streamrag.embed.hashing import HashingEmbedder


class SelfKilling(HashingEmbedder):
    """Kills its process on call ``KILLTEST_AT_CALL`` (1-based)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim=dim)
        self.calls = 0
        self.kill_at = int(os.environ.get("KILLTEST_AT_CALL", "0"))
        self.after_us = int(os.environ.get("KILLTEST_AFTER_US", "0"))

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.calls == self.kill_at:
            if self.after_us <= 0:
                os.kill(os.getpid(), signal.SIGKILL)  # in the middle of embedding
            timer = threading.Timer(self.after_us / 1e6, os.kill, (os.getpid(), signal.SIGKILL))
            timer.daemon = True
            timer.start()  # fires while the commit that follows is under way
        return super().embed_many(texts)


class Slow(HashingEmbedder):
    """Embeds at most ``texts_per_s`` texts per second (it sleeps for the rest)."""

    def __init__(self, dim: int = 64, texts_per_s: float = 500.0) -> None:
        super().__init__(dim=dim)
        self.texts_per_s = texts_per_s

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        started = time.perf_counter()
        out = super().embed_many(texts)
        left = len(texts) / self.texts_per_s - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)  # the simulated model's compute time
        return out


class Gated(HashingEmbedder):
    """Holds the backfill thread's calls at a gate the test opens (``GATES[gate]``).

    Calls from any other thread (the pipeline's mirror, queries) pass at once,
    so a test can commit live changes while a backfill is stopped mid-batch.
    """

    GATES: ClassVar[dict[str, threading.Event]] = {}
    ENTERED: ClassVar[dict[str, threading.Event]] = {}

    def __init__(self, dim: int = 48, gate: str = "default") -> None:
        super().__init__(dim=dim)
        self.gate = gate
        self.GATES.setdefault(gate, threading.Event())
        self.ENTERED.setdefault(gate, threading.Event())

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if threading.current_thread().name == "streamrag-backfill":
            self.ENTERED[self.gate].set()
            if not self.GATES[self.gate].wait(60):
                raise RuntimeError("the test never opened the gate")
        return super().embed_many(texts)


class BackfillKiller(HashingEmbedder):
    """SIGKILLs its process on the backfill thread's call ``KILLTEST_BACKFILL_CALL``."""

    def __init__(self, dim: int = 48) -> None:
        super().__init__(dim=dim)
        self.calls = 0
        self.kill_at = int(os.environ.get("KILLTEST_BACKFILL_CALL", "0"))

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        if threading.current_thread().name == "streamrag-backfill":
            self.calls += 1
            if self.calls == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().embed_many(texts)
