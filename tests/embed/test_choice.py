"""The embedder choice: a circuit that opens on failure, probes, and closes; the fast variant."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from streamrag.config import load_settings
from streamrag.embed.base import in_process
from streamrag.embed.choice import MIN_COSINE, EmbedderChoice, space_agreement
from streamrag.embed.hashing import HashingEmbedder
from streamrag.embed.remote import OpenAIEmbedder
from streamrag.errors import ConfigError, EmbedderError
from streamrag.runtime.commit import Embedding
from streamrag.runtime.metrics import Metrics
from streamrag.testing import ManualClock


class Flaky(HashingEmbedder):
    """The hashing embedder that fails while ``down``, like a dead endpoint."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__(dim=dim)
        self.down = False
        self.calls = 0

    @property
    def version(self) -> str:
        return "remote:served:d32"

    @property
    def space(self) -> str:
        return super().version  # the same model as the local fallback

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.down:
            raise EmbedderError("connection refused")
        return super().embed_many(texts)


def _embedding(clock: ManualClock, primary: Flaky, **kw: object) -> Embedding:
    choice = EmbedderChoice(
        primary, clock=clock, fallback=HashingEmbedder(dim=32), probe_every_s=5.0, **kw
    )  # type: ignore[arg-type]
    return Embedding(primary, clock=clock, metrics=Metrics(), choice=choice, sleep=lambda _: None)


def _fill(emb: Embedding, texts: list[str]) -> list[str]:
    vectors = np.zeros((len(texts), 32), dtype=np.float32)
    made_by = [""] * len(texts)
    emb.fill(texts, list(range(len(texts))), vectors, len(texts), made_by=made_by)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    return made_by


def test_the_circuit_opens_probes_on_schedule_and_closes() -> None:
    clock = ManualClock(0)
    primary = Flaky()
    emb = _embedding(clock, primary)
    assert _fill(emb, ["a", "b"]) == ["remote:served:d32"] * 2
    primary.down = True
    assert _fill(emb, ["a", "b"]) == ["hashing-blake2b-v1-d32"] * 2
    status = emb.choice.status()
    assert status["role"] == "fallback"
    assert status["fallback"]["circuit"] == "open"
    assert "connection refused" in status["why"]
    calls = primary.calls
    clock.advance_us(4_000_000)  # before the probe is due: the configured one is not called
    _fill(emb, ["c"])
    assert primary.calls == calls
    clock.advance_us(1_000_000)  # due: one probe of one text, which fails
    assert _fill(emb, ["c", "d"]) == ["hashing-blake2b-v1-d32"] * 2
    assert primary.calls == calls + 1
    primary.down = False
    clock.advance_us(5_000_000)
    assert _fill(emb, ["e", "f"]) == ["remote:served:d32"] * 2
    assert emb.choice.status()["fallback"]["circuit"] == "closed"


def test_without_a_fallback_a_failure_leaves_the_batch_pending() -> None:
    primary = Flaky()
    primary.down = True
    emb = Embedding(primary, clock=ManualClock(0), metrics=Metrics(), sleep=lambda _: None)
    with pytest.raises(EmbedderError, match="connection refused"):
        _fill(emb, ["a", "b"])


def test_the_fast_variant_takes_over_above_the_lag_and_hands_back_below_half() -> None:
    clock = ManualClock(0)
    primary = Flaky()
    fast = HashingEmbedder(dim=32)
    choice = EmbedderChoice(primary, clock=clock, fast=fast, fast_above_lag_us=2_000_000)
    assert choice.for_batch(1_000_000).role == "primary"
    assert choice.for_batch(2_500_000).role == "fast"
    assert choice.for_batch(1_500_000).role == "fast"  # hysteresis: not yet below half
    assert choice.for_batch(900_000).role == "primary"
    assert choice.switches == 2


def test_a_fallback_of_another_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be the same model"):
        EmbedderChoice(HashingEmbedder(dim=32), clock=ManualClock(0), fallback=HashingEmbedder(16))


class Rotated(HashingEmbedder):
    """Claims the hashing space but makes other vectors: the agreement check must catch it."""

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.roll(super().embed_many(texts), 1, axis=1)


def test_the_space_check_measures_agreement() -> None:
    same = space_agreement(HashingEmbedder(dim=32), HashingEmbedder(dim=32))
    assert same >= MIN_COSINE
    choice = EmbedderChoice(HashingEmbedder(dim=32), clock=ManualClock(0), fallback=Rotated(32))
    with pytest.raises(ConfigError, match="does not make the configured embedder's vectors"):
        choice.verify()


def test_settings_name_the_fallback_and_the_fast_variant() -> None:
    from streamrag.runtime.build import build_choice

    settings = load_settings(
        overrides={
            "embedder.class": "hashing",
            "embedder.fallback": {"class": "hashing", "args": {"dim": 384}},
            "embedder.fast": {"class": "hashing"},
            "embedder.fast_above_lag_ms": 500,
        },
        environ={},
    )
    choice = build_choice(settings, HashingEmbedder(), ManualClock(0))
    assert choice.fallback is not None
    assert choice.fast is not None
    assert choice.fast_above_lag_us == 500_000


class _Served(Flaky):
    """The same model behind a service: a call waits on the network (not ``in_process``)."""

    in_process = False


def test_queries_may_run_on_the_event_loop_only_when_every_embedder_computes_here() -> None:
    clock = ManualClock(0)
    local = HashingEmbedder(dim=32)
    assert in_process(local)
    assert not in_process(OpenAIEmbedder("http://127.0.0.1:9/v1", "m", dim=32))
    assert not in_process(_Served())
    assert EmbedderChoice(local, clock=clock).in_process
    assert EmbedderChoice(Flaky(), clock=clock, fallback=local).in_process
    # A served model anywhere in the choice (primary, fallback): a query may wait on I/O.
    assert not EmbedderChoice(_Served(), clock=clock, fallback=local).in_process
    assert not EmbedderChoice(local, clock=clock, fallback=_Served()).in_process
