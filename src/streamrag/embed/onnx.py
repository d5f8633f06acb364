"""MiniLM through ONNX Runtime: sentence-transformers' vectors without torch, in fp32 or int8.

The same model as :class:`~streamrag.embed.sentence_transformers.SentenceTransformerEmbedder`
(all-MiniLM-L6-v2), run by ONNX Runtime instead of PyTorch: the same
tokenizer (its ``tokenizer.json``, through the ``tokenizers`` library,
truncated at ``max_tokens`` = 256 as sentence-transformers does), the same mean
pooling over the attention mask and L2 normalization. The vectors are the same
vectors — cosine 1.0 in fp32, above 0.996 in int8 on the sample corpus — so both
precisions share the model's vector space (``space``) and can stand in for each
other, or for the torch model, as a fallback or fast variant
(:mod:`streamrag.embed.choice`). ``version`` names model and precision, and is
recorded with every chunk.

**Files.** The ONNX files are made once from the packaged PyTorch weights and
cached in ``cache_dir`` (default ``$XDG_CACHE_HOME/streamrag/models``; a job
passes ``<state_dir>/models``); :mod:`streamrag.embed.onnx_build` explains how,
and how a damaged file is found and made again. Making them needs torch (the
``[minilm]`` extra); running needs only ``onnxruntime``, ``tokenizers`` and
numpy (the ``[onnx]`` extra): with the files cached, torch is never imported.

**Batches.** Texts are tokenized in one call, then ordered by length, so that
each batch of ``batch_size`` (fp32) is cut to its own longest text and pads
little; the vectors go back in the caller's order. int8 runs each text alone:
its activations are quantized with one scale per input tensor, computed as it
runs, so in a batch a text's vector would depend on the other texts (and on
their padding). Alone it is the same in every call, and on MiniLM that costs
nothing measurable, as the matrix products are long enough with one text.

**Shared between threads.** The ingest thread and the query workers embed at
once. An ``InferenceSession``'s ``run`` is safe to call from many threads. A
``tokenizers.Tokenizer`` carries its padding and truncation as state: the one
that embeds is configured once, when the model loads, and no call changes it;
``count_tokens`` (no padding, no truncation) uses a tokenizer of its own, as
:mod:`streamrag.embed.sentence_transformers` explains.

**Threads.** ``threads`` is ONNX Runtime's intra-op thread count; 1 (the
default) runs each call on its caller's thread, which on a small shared
machine is fastest overall. Threads do not spin while waiting.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from streamrag.embed.memory import FreedMemory
from streamrag.embed.onnx_build import (
    INPUTS,
    MODEL,
    OUTPUT,
    PRECISIONS,
    default_cache_dir,
    load_or_build,
)
from streamrag.errors import ArgumentError, MissingDependencyError

__all__ = ["OnnxEmbedder"]

Precision = Literal["fp32", "int8"]
_DIM = 384
_PURPOSE = "The ONNX MiniLM embedder"


@dataclass(frozen=True, slots=True)
class _Loaded:
    session: Any
    tokenizer: Any  # padding and truncation set once, at load
    counter: Any  # count_tokens' own: no padding, no truncation


class OnnxEmbedder:
    """all-MiniLM-L6-v2 through ONNX Runtime, in fp32 or int8 (the default)."""

    in_process = True
    """Computes on this CPU, no I/O (see :func:`streamrag.embed.base.in_process`)."""

    holds_gil = False
    """Computes in native code that releases the interpreter lock: no worker process
    (:mod:`streamrag.embed.ahead`) would gain from a second copy of the model."""

    def __init__(
        self,
        precision: Precision = "int8",
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int = 1,
        batch_size: int = 32,
        max_tokens: int = 256,
    ) -> None:
        if precision not in PRECISIONS:
            msg = f"precision must be one of {', '.join(PRECISIONS)}, found {precision!r}"
            raise ArgumentError(msg)
        for name, value in (("threads", threads), ("batch_size", batch_size)):
            if value < 1:
                msg = f"{name} must be at least 1, found {value}"
                raise ArgumentError(msg)
        if not 2 <= max_tokens <= 512:
            msg = f"max_tokens must be within 2..512 (MiniLM's positions), found {max_tokens}"
            raise ArgumentError(msg)
        self.precision: Precision = precision
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.threads = threads
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self._loaded: _Loaded | None = None
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._freed = FreedMemory()  # keeps RSS flat: see streamrag.embed.memory

    @property
    def dim(self) -> int:
        """Vector length (384)."""
        return _DIM

    @property
    def version(self) -> str:
        """Model and precision, e.g. ``onnx/all-MiniLM-L6-v2/int8``."""
        return f"onnx/{MODEL}/{self.precision}"

    @property
    def space(self) -> str:
        """The vector space: the model, shared by both precisions and the torch embedder."""
        return MODEL

    def load(self) -> None:
        """Make or verify the cached files and start the session now, not on the first call."""
        self._load()

    def _load(self) -> _Loaded:
        with self._lock:
            if self._loaded is None:
                self._loaded = self._open()
            return self._loaded

    def _open(self) -> _Loaded:
        try:
            import onnxruntime as ort
        except ImportError:
            package = "onnxruntime"
            raise MissingDependencyError(package, "onnx", _PURPOSE) from None
        try:
            from tokenizers import Tokenizer
        except ImportError:
            package = "tokenizers"
            raise MissingDependencyError(package, "onnx", _PURPOSE) from None
        files = load_or_build(self.cache_dir or default_cache_dir(), self.precision)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only
        session = ort.InferenceSession(files.model, options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_str(files.tokenizer)
        tokenizer.enable_truncation(max_length=self.max_tokens)
        # To the longest text of each call; [PAD] is id 0 in MiniLM's vocabulary.
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # noqa: S106
        counter = Tokenizer.from_str(files.tokenizer)
        counter.no_padding()
        counter.no_truncation()
        loaded = _Loaded(session, tokenizer, counter)
        self._run(loaded, ["a", "a b"])  # settles the session's first allocations
        return loaded

    def count_tokens(self, text: str) -> int:
        """Tokens the model sees for ``text`` (WordPiece pieces, no special tokens).

        Uses a tokenizer of its own, so it never changes the one that embeds.
        """
        loaded = self._loaded or self._load()
        with self._count_lock:  # one counter, used by one thread at a time
            return len(loaded.counter.encode(text, add_special_tokens=False).ids)

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts into unit vectors, in their order."""
        loaded = self._loaded or self._load()
        if not texts:
            return np.zeros((0, _DIM), dtype=np.float32)
        vectors = self._run(loaded, texts)
        self._freed.maybe()
        return vectors

    def _run(self, loaded: _Loaded, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        encodings = loaded.tokenizer.encode_batch(list(texts))  # padded to the longest
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        lengths = mask.sum(axis=1)
        order = np.argsort(-lengths, kind="stable")  # longest first
        step = 1 if self.precision == "int8" else self.batch_size
        out = np.empty((len(texts), _DIM), dtype=np.float32)
        for start in range(0, len(texts), step):
            rows = order[start : start + step]
            width = int(lengths[rows[0]])  # this batch's longest: no wider padding
            batch_mask = mask[rows, :width]
            feed = {INPUTS[0]: ids[rows, :width], INPUTS[1]: batch_mask}
            hidden = loaded.session.run([OUTPUT], feed)[0]
            out[rows] = _mean_pool(hidden, batch_mask)
        return out

    def __repr__(self) -> str:
        return f"OnnxEmbedder(precision={self.precision!r}, threads={self.threads})"


def _mean_pool(hidden: npt.NDArray[Any], mask: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """Mean of the token vectors the mask keeps, L2-normalized (sentence-transformers' way)."""
    weights = mask.astype(np.float32)
    summed = np.einsum("btd,bt->bd", hidden.astype(np.float32, copy=False), weights)
    mean = summed / np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)
    norms = np.linalg.norm(mean, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (mean / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit
