"""Whether an embedder that does not say computes here: measured from its query calls."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from streamrag.embed.base import in_process
from streamrag.embed.choice import EmbedderChoice
from streamrag.embed.computes_here import MIN_CALLS, ComputesHere
from streamrag.embed.hashing import HashingEmbedder
from streamrag.embed.remote import OpenAIEmbedder, TEIEmbedder
from streamrag.testing import ManualClock


class Clocks:
    """A wall clock and a CPU clock that each call of :class:`Silent` advances."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0
        self.wall_per_call = 0.001
        self.cpu_per_call = 0.001

    def meter(self) -> ComputesHere:
        return ComputesHere(wall=lambda: self.wall, cpu=lambda: self.cpu)


class Silent(HashingEmbedder):
    """The hashing embedder under a class of the user's that does not say how it runs."""

    in_process = None  # type: ignore[assignment]  # says nothing

    def __init__(self, clocks: Clocks) -> None:
        super().__init__(dim=32)
        self.clocks = clocks

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.clocks.wall += self.clocks.wall_per_call
        self.clocks.cpu += self.clocks.cpu_per_call
        return super().embed_many(texts)


def _choice(clocks: Clocks, **kwargs: object) -> EmbedderChoice:
    return EmbedderChoice(Silent(clocks), clock=ManualClock(0), measure=clocks.meter, **kwargs)  # type: ignore[arg-type]


def test_embedders_say_how_they_run_or_say_nothing() -> None:
    assert in_process(HashingEmbedder()) is True
    assert in_process(OpenAIEmbedder("http://127.0.0.1:9/v1", "m", dim=32)) is False
    assert in_process(TEIEmbedder("http://127.0.0.1:9", dim=32)) is False
    assert in_process(Silent(Clocks())) is None


def test_an_embedder_that_computes_counts_as_in_process_once_measured() -> None:
    clocks = Clocks()
    clocks.cpu_per_call = 0.0009  # 90 % of each call on the calling thread's CPU
    choice = _choice(clocks)
    assert not choice.in_process  # nothing measured yet
    for i in range(MIN_CALLS):
        assert not choice.in_process, f"in process after {i} calls"
        vectors, used = choice.embed_queries(["where is the runbook"])
        assert vectors.shape == (1, 32)
        assert used is choice.primary
    assert choice.in_process
    measured = choice.status()["measured"]["primary"]
    assert measured == {"calls": MIN_CALLS, "cpu_share": 0.9}
    assert choice.status()["in_process"] is True


def test_an_embedder_that_waits_never_counts_as_in_process() -> None:
    clocks = Clocks()
    clocks.wall_per_call = 0.020  # a round trip to a service
    clocks.cpu_per_call = 0.0002
    choice = _choice(clocks)
    for _ in range(5 * MIN_CALLS):
        choice.embed_queries(["where is the runbook"])
    assert not choice.in_process
    assert choice.status()["measured"]["primary"]["cpu_share"] == 0.01


def test_calls_that_start_waiting_send_queries_back_to_the_workers() -> None:
    clocks = Clocks()
    choice = _choice(clocks)
    for _ in range(MIN_CALLS):
        choice.embed_queries(["q"])
    assert choice.in_process
    clocks.wall_per_call, clocks.cpu_per_call = 0.050, 0.0001  # a fetch on a cache miss
    choice.embed_queries(["q"])
    assert not choice.in_process


class Down(HashingEmbedder):
    """The configured embedder while its service is down: every call raises."""

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        raise ConnectionError("cannot reach the embedder")


def test_a_fallback_that_says_nothing_is_measured_once_it_answers() -> None:
    clocks = Clocks()
    fallback = Silent(clocks)
    choice = EmbedderChoice(
        HashingEmbedder(dim=32), clock=ManualClock(0), fallback=fallback, measure=clocks.meter
    )
    for _ in range(MIN_CALLS):
        choice.embed_queries(["q"])  # the configured one answers; the fallback is not called
    # Not known to compute here while it has not answered a query.
    assert not choice.in_process
    assert "fallback" not in choice.status().get("measured", {})

    failing = EmbedderChoice(
        Down(dim=32), clock=ManualClock(0), fallback=fallback, measure=clocks.meter
    )
    for i in range(MIN_CALLS):
        assert not failing.in_process, f"in process after {i} fallback calls"
        _, used = failing.embed_queries(["q"])  # the circuit opens; the fallback answers
        assert used is fallback
    assert failing.circuit_open
    assert failing.in_process
    assert failing.status()["measured"] == {"fallback": {"calls": MIN_CALLS, "cpu_share": 1.0}}


def test_embedders_that_say_how_they_run_are_not_measured() -> None:
    measured: list[ComputesHere] = []

    def meter() -> ComputesHere:
        measured.append(ComputesHere())
        return measured[-1]

    choice = EmbedderChoice(HashingEmbedder(dim=32), clock=ManualClock(0), measure=meter)
    for _ in range(MIN_CALLS):
        choice.embed_queries(["q"])
    assert choice.in_process
    assert measured == []
    assert "measured" not in choice.status()


def test_the_meter_counts_only_calls_that_return() -> None:
    here = ComputesHere()

    def fails(texts: list[str]) -> None:
        raise RuntimeError("down")

    with pytest.raises(RuntimeError, match="down"):
        here.call(fails, ["q"])
    assert here.status() == {"calls": 0, "cpu_share": None}
    assert here.call(lambda texts: len(texts), ["a", "b"]) == 2
    assert here.status()["calls"] == 1
