"""Embedding that survives a flaky embedder and isolates the texts it cannot embed.

An embedder can fail in two ways, and they need opposite answers:

* **the embedder is down** (a remote service times out, a GPU is busy): every
  text fails. Nothing should be dropped; the batch waits and is retried later.
* **one text is poison** (it crashes the tokenizer, makes NaNs): only batches
  holding it fail. That text must be set aside, or it blocks the stream forever.

:func:`embed_resilient` first retries the whole batch with exponential backoff
(``attempts`` tries). If it still fails, it **bisects**: each half is tried
once, and a failing half is split again, down to single texts. A text that
fails on its own while others succeed is poison and is returned as failed, with
the reason, for the dead-letter store. If nothing succeeds within a small budget
of failed calls (about two per halving, enough to reach a single text and its
neighbour), the embedder itself is failing: :class:`~streamrag.errors.EmbedderError`
is raised, the batch stays pending, and the pipeline's loop retries it later.
Either way the result never has a missing vector: a row is either embedded and
checked (shape, finite values) or reported as failed.

``timeout_s`` bounds each call: the call runs in a worker thread and a call
that overruns counts as a failure (its thread is abandoned and finishes on its
own; a new worker takes the next call).
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from streamrag.embed.base import Embedder, check_vectors
from streamrag.errors import EmbedderError

__all__ = ["EmbedOutcome", "RetryPolicy", "embed_resilient"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try before a batch is split, and how long one call may take."""

    attempts: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    timeout_s: float | None = None

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (from 1)."""
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


@dataclass
class EmbedOutcome:
    """Vectors for the texts that embedded; the reason for each one that did not."""

    vectors: npt.NDArray[np.float32]
    failed: dict[int, str] = field(default_factory=dict)
    calls: int = 0
    retries: int = 0


class _Caller:
    """Calls the embedder, in a worker thread when calls have a timeout."""

    def __init__(self, embedder: Embedder, timeout_s: float | None) -> None:
        self.embedder = embedder
        self.timeout_s = timeout_s
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]:
        who = type(self.embedder).__name__
        if self.timeout_s is None:
            out = self.embedder.embed_many(texts)
        else:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "streamrag-embed")
            future = self._pool.submit(self.embedder.embed_many, texts)
            try:
                out = future.result(timeout=self.timeout_s)
            except concurrent.futures.TimeoutError:
                self._pool.shutdown(wait=False)  # the stuck call finishes on its own
                self._pool = None
                msg = f"{who} did not answer within {self.timeout_s}s for {len(texts)} texts"
                raise EmbedderError(msg) from None
        return check_vectors(out, len(texts), self.embedder.dim, who)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EmbedderError) and exc.args:
        return str(exc.args[0])
    return f"{type(exc).__name__}: {exc}"


def embed_resilient(
    embedder: Embedder,
    texts: Sequence[str],
    policy: RetryPolicy | None = None,
    *,
    sleep: Callable[[float], None] = time.sleep,
    caller: Callable[[list[str]], npt.NDArray[np.float32]] | None = None,
) -> EmbedOutcome:
    """Embed ``texts``: retry, then bisect to isolate poison texts (see the module doc).

    ``sleep`` waits between retries (tests pass one that records instead).
    Raises :class:`EmbedderError` when the embedder fails for every text.
    """
    policy = policy or RetryPolicy()
    own = caller is None
    call = caller or _Caller(embedder, policy.timeout_s)
    n = len(texts)
    out = EmbedOutcome(np.zeros((n, embedder.dim), dtype=np.float32))
    if n == 0:
        return out
    try:
        last: BaseException | None = None
        for attempt in range(1, max(1, policy.attempts) + 1):
            out.calls += 1
            try:
                out.vectors[:] = call(list(texts))
                return out
            except Exception as exc:  # any failure of the embedder is retried
                last = exc
            if attempt < policy.attempts:
                out.retries += 1
                sleep(policy.delay(attempt))
        if n == 1:
            msg = f"the embedder failed {policy.attempts} times: {_reason(last)}"  # type: ignore[arg-type]
            raise EmbedderError(msg) from last
        _bisect(call, texts, out, last)
        return out
    finally:
        if own and isinstance(call, _Caller):
            call.close()


def _bisect(
    call: Callable[[list[str]], npt.NDArray[np.float32]],
    texts: Sequence[str],
    out: EmbedOutcome,
    first_error: BaseException | None,
) -> None:
    """Split failing ranges until single texts; give up if nothing ever succeeds."""
    budget = 2 * math.ceil(math.log2(len(texts))) + 2
    failures = 0
    succeeded = False
    stack = [(len(texts) // 2, len(texts)), (0, len(texts) // 2)]  # left half first
    last_error = first_error
    while stack:
        lo, hi = stack.pop()
        out.calls += 1
        try:
            out.vectors[lo:hi] = call(list(texts[lo:hi]))
            succeeded = True
            continue
        except Exception as exc:
            last_error = exc
            failures += 1
        if not succeeded and failures >= budget:
            msg = (
                f"the embedder fails for every text tried ({failures} calls after "
                f"{out.calls - failures} retries): {_reason(last_error)}"
            )
            raise EmbedderError(msg) from last_error
        if hi - lo == 1:
            out.failed[lo] = _reason(last_error)
            continue
        mid = (lo + hi) // 2
        stack.append((mid, hi))
        stack.append((lo, mid))
    if not succeeded:
        msg = f"the embedder failed for all {len(texts)} texts: {_reason(last_error)}"  # type: ignore[arg-type]
        raise EmbedderError(msg) from last_error
