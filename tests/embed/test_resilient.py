"""Retries, backoff and bisection around a failing embedder."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from streamrag.embed.resilient import RetryPolicy, embed_resilient
from streamrag.errors import EmbedderError
from streamrag.testing import FakeEmbedder


class Picky(FakeEmbedder):
    """Fails any batch holding a text with POISON; optionally fails the first calls."""

    def __init__(self, flaky_calls: int = 0) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.flaky_calls = flaky_calls

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        if len(self.calls) <= self.flaky_calls:
            raise ConnectionError("embedding service unavailable")
        if any("POISON" in t for t in texts):
            raise ValueError("tokenizer crashed")
        return super().embed_many(texts)


def test_a_transient_failure_is_retried_with_exponential_backoff() -> None:
    emb = Picky(flaky_calls=2)
    waits: list[float] = []
    out = embed_resilient(
        emb, ["a", "b"], RetryPolicy(attempts=3, backoff_s=0.1), sleep=waits.append
    )
    assert waits == [0.1, 0.2]
    assert out.failed == {}
    assert out.retries == 2
    np.testing.assert_allclose(out.vectors, FakeEmbedder().embed_many(["a", "b"]), rtol=1e-6)


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(backoff_s=0.5, max_backoff_s=1.5)
    assert [policy.delay(i) for i in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, 1.5]


def test_bisection_isolates_the_poison_texts_and_embeds_the_rest() -> None:
    texts = [f"text {i}" for i in range(16)]
    texts[5] = "POISON one"
    texts[12] = "POISON two"
    emb = Picky()
    out = embed_resilient(emb, texts, RetryPolicy(attempts=2), sleep=lambda s: None)
    assert sorted(out.failed) == [5, 12]
    assert "tokenizer crashed" in out.failed[5]
    good = [i for i in range(16) if i not in out.failed]
    expected = FakeEmbedder().embed_many([texts[i] for i in good])
    np.testing.assert_allclose(out.vectors[good], expected, rtol=1e-6)
    assert not out.vectors[[5, 12]].any()  # never a made-up vector
    assert len(emb.calls) < 2 * 16  # bisection, not one call per text


def test_an_embedder_that_fails_for_everything_raises_after_a_bounded_number_of_calls() -> None:
    class Down(FakeEmbedder):
        calls = 0

        def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            Down.calls += 1
            raise ConnectionError("connection refused")

    with pytest.raises(EmbedderError, match="connection refused"):
        embed_resilient(Down(), [f"t{i}" for i in range(256)], RetryPolicy(), sleep=lambda s: None)
    assert Down.calls <= 3 + 2 * 8 + 2  # retries, then about two calls per halving


def test_wrong_shapes_and_nans_count_as_failures() -> None:
    class Nan(FakeEmbedder):
        def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            out = super().embed_many(texts)
            for i, t in enumerate(texts):
                if "bad" in t:
                    out[i, 0] = np.nan
            return out

    out = embed_resilient(
        Nan(), ["ok", "bad", "fine"], RetryPolicy(attempts=1), sleep=lambda s: None
    )
    assert list(out.failed) == [1]
    assert "NaN" in out.failed[1]


def test_a_call_that_overruns_its_timeout_counts_as_a_failure() -> None:
    release = threading.Event()

    class Stuck(FakeEmbedder):
        def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            release.wait(10)
            return super().embed_many(texts)

    try:
        with pytest.raises(EmbedderError, match=r"did not answer within 0\.05s"):
            embed_resilient(Stuck(), ["x"], RetryPolicy(attempts=1, timeout_s=0.05))
    finally:
        release.set()
