"""The query batcher: batches worth their call, a worker that survives its batch, deadlines."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient

from streamrag.embed.computes_here import MIN_CALLS, ComputesHere
from streamrag.errors import QueryTimeoutError
from streamrag.index.base import SearchFilter
from streamrag.serve.app import create_app
from streamrag.serve.batcher import CallCost, QueryBatcher
from tests.e2e.conftest import wait_for
from tests.serve.test_answer_api import make_service

T = TypeVar("T")


def _three_behind_a_stalled_one(
    svc: Any, batcher: QueryBatcher, taken: Callable[[list[tuple[int, bool]]], bool]
) -> list[tuple[int, bool]]:
    """One query's embedding call stalls; three more arrive. Each call: (size, after release).

    The stalled call is let go once ``taken(calls)`` holds.
    """
    gate = threading.Event()
    released = threading.Event()
    calls: list[tuple[int, bool]] = []
    gen = svc.pin()  # a batch embeds with the generation it pins
    original = gen.embed_many

    def spy(queries):  # type: ignore[no-untyped-def]
        calls.append((len(queries), released.is_set()))
        if len(calls) == 1:
            gate.wait(10)
        return original(queries)

    gen.embed_many = spy
    flt = SearchFilter(tenant="acme")

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(batcher.retrieve("database password", 1, flt))
        await asyncio.to_thread(wait_for, lambda: calls, 10, "the first embedding call")
        rest = [
            asyncio.ensure_future(batcher.retrieve(q, 1, flt))
            for q in ("backups", "vault", "restart")
        ]
        await asyncio.to_thread(wait_for, lambda: taken(calls), 10, "the three taken")
        released.set()
        gate.set()
        answers = await asyncio.gather(first, *rest)
        return [len(hits) for _, hits in answers]

    try:
        assert asyncio.run(scenario()) == [1, 1, 1, 1]
    finally:
        batcher.close()
    return calls


def _flat_costs(batcher: QueryBatcher) -> None:
    """The workers' batches so far cost 3 ms a query and nothing a call (MiniLM in int8)."""
    for cost in batcher._costs:
        for n in (1, 4, 2, 8, 3):
            cost.add(n, 0.003 * n)


def test_a_small_batch_waits_while_another_worker_embeds(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    batcher = QueryBatcher(svc, max_batch=64, max_wait_ms=0, workers=2, min_parallel_batch=8)
    # The idle worker takes the three queries and holds them: three are not worth
    # a second concurrent embedding call.
    calls = _three_behind_a_stalled_one(svc, batcher, lambda _: batcher._queue.empty())
    assert calls == [(1, False), (3, True)]


def test_a_worker_whose_calls_cost_nothing_in_themselves_does_not_hold(tmp_path: Path) -> None:
    """MiniLM in int8: a call costs its queries and little else, so company saves nothing."""
    svc = make_service(tmp_path)
    batcher = QueryBatcher(svc, max_batch=64, max_wait_ms=0, workers=2, min_parallel_batch=8)
    _flat_costs(batcher)
    # The idle worker embeds them while the first call is still stalled.
    calls = _three_behind_a_stalled_one(svc, batcher, lambda c: sum(n for n, _ in c) == 4)
    assert calls[0] == (1, False)
    assert all(not after for _, after in calls)


def test_a_worker_over_a_remote_embedder_holds_whatever_its_cpu_time_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote call costs a round trip that the worker's CPU time does not show."""
    svc = make_service(tmp_path)
    monkeypatch.setattr(type(svc.pin().embedder), "in_process", False, raising=False)
    batcher = QueryBatcher(svc, max_batch=64, max_wait_ms=0, workers=2, min_parallel_batch=8)
    _flat_costs(batcher)
    calls = _three_behind_a_stalled_one(svc, batcher, lambda _: batcher._queue.empty())
    assert calls == [(1, False), (3, True)]


def test_a_worker_learns_from_its_batches_cpu_time_that_company_does_not_pay(
    tmp_path: Path,
) -> None:
    """The fit is fed by the worker: each batch's CPU time (the injected clock), by size."""
    svc = make_service(tmp_path)
    cpu = [0.0]
    gate = threading.Event()
    sizes: list[int] = []
    gen = svc.pin()
    original = gen.embed_many

    def flat(queries):  # type: ignore[no-untyped-def]
        sizes.append(len(queries))
        if len(queries) == 1:
            gate.wait(10)  # a lone call stalls until the round's queries are queued
        # 3 ms of CPU a query and nothing a call; the wall time (the gate) is no CPU.
        cpu[0] += 0.003 * len(queries)
        return original(queries)

    gen.embed_many = flat
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0, cpu_clock=lambda: cpu[0])
    flt = SearchFilter(tenant="acme")

    async def rounds() -> None:
        for size in (2, 5, 3, 6):
            gate.clear()
            lone = asyncio.ensure_future(batcher.retrieve("stalls", 1, flt))
            calls = len(sizes)
            await asyncio.to_thread(wait_for, lambda n=calls: len(sizes) > n, 10, "the lone call")
            behind = [asyncio.ensure_future(batcher.retrieve(f"q{i}", 1, flt)) for i in range(size)]
            await asyncio.to_thread(
                wait_for, lambda s=size: batcher._queue.qsize() == s, 10, "the round queued"
            )
            gate.set()  # the worker then takes the whole round as one batch
            await asyncio.wait_for(asyncio.gather(lone, *behind), 10)

    try:
        asyncio.run(rounds())
    finally:
        batcher.close()
    assert sizes == [1, 2, 1, 5, 1, 3, 1, 6]
    fitted = batcher._costs[0].fit()
    assert fitted is not None
    fixed, per_query = fitted
    assert fixed == pytest.approx(0.0, abs=1e-6)
    assert per_query == pytest.approx(0.003)
    assert not batcher._costs[0].company_pays()


def test_the_call_cost_fit_finds_what_a_call_costs_in_itself() -> None:
    cost = CallCost()
    assert cost.fit() is None  # nothing measured: gather
    assert cost.company_pays()
    for _ in range(10):
        cost.add(8, 0.009 + 0.0046 * 8)
    assert cost.fit() is None  # one size only: no line yet
    assert cost.company_pays()
    for n in (1, 2, 4, 8, 16, 3):
        cost.add(n, 0.009 + 0.0046 * n)  # MiniLM through PyTorch here
    fixed, per_query = cost.fit() or (0.0, 0.0)
    assert fixed == pytest.approx(0.009, rel=0.05)
    assert per_query == pytest.approx(0.0046, rel=0.05)
    assert cost.company_pays()
    # The model changes to one that embeds each text alone: recent batches decide.
    for _ in range(6):
        for n in (1, 3, 8, 5, 2):
            cost.add(n, 0.0011 + 0.0027 * n)
    fixed, per_query = cost.fit() or (1.0, 0.0)
    assert fixed < per_query
    assert not cost.company_pays()


def _fail_first_pin(svc: Any) -> None:
    """Make the first batch's pin raise an unexpected error (a bug in the read path)."""
    real_pin = svc.pin
    failed: list[bool] = []

    def pin_fails_once() -> Any:
        if not failed:
            failed.append(True)
            raise RuntimeError("a bug in the read path")
        return real_pin()

    svc.pin = pin_fails_once


def _stall_embedding(svc: Any, *, first_only: bool) -> tuple[threading.Event, list[list[str]]]:
    """Embedding calls (the first, or all) wait for the gate returned; each call's queries kept."""
    gate = threading.Event()
    calls: list[list[str]] = []
    gen = svc.pin()  # a batch embeds with the generation it pins
    original = gen.embed_many

    def stalled(queries):  # type: ignore[no-untyped-def]
        calls.append(list(queries))
        if len(calls) == 1 or not first_only:
            gate.wait(10)  # a stalled embedding call, until the test lets it go
        return original(queries)

    gen.embed_many = stalled
    return gate, calls


def test_a_batch_that_raises_fails_its_queries_and_the_worker_goes_on(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    _fail_first_pin(svc)
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0)
    flt = SearchFilter(tenant="acme")

    async def scenario() -> tuple[BaseException | None, int]:
        failed: BaseException | None = None
        try:
            await batcher.retrieve("database password", 1, flt)
        except RuntimeError as exc:
            failed = exc
        # The one worker is still there: the next query is answered.
        _, hits = await asyncio.wait_for(batcher.retrieve("backups", 1, flt), 10)
        return failed, len(hits)

    try:
        failed, found = asyncio.run(scenario())
    finally:
        batcher.close()
    assert isinstance(failed, RuntimeError)
    assert "read path" in str(failed)
    assert found == 1


def test_a_query_past_its_deadline_times_out_and_is_not_embedded_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    svc = make_service(tmp_path)
    gate, calls = _stall_embedding(svc, first_only=True)
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0, timeout_s=0.05)
    flt = SearchFilter(tenant="acme")

    async def scenario() -> tuple[list[BaseException | None], int]:
        first = asyncio.ensure_future(batcher.retrieve("database password", 1, flt))
        await asyncio.to_thread(wait_for, lambda: calls, 10, "the first embedding call")
        queued = asyncio.ensure_future(batcher.retrieve("backups", 1, flt))
        outcomes = await asyncio.gather(first, queued, return_exceptions=True)
        gate.set()  # the stalled call ends; the queued query is past its deadline
        batcher.timeout_s = 10
        _, hits = await batcher.retrieve("vault", 1, flt)
        return [o if isinstance(o, BaseException) else None for o in outcomes], len(hits)

    try:
        outcomes, found = asyncio.run(scenario())
    finally:
        gate.set()
        batcher.close()
    assert all(isinstance(o, QueryTimeoutError) for o in outcomes), outcomes
    assert "serve.query_timeout_s=0.05" in str(outcomes[0])
    assert found == 1
    # The query that timed out in the queue was skipped: never embedded.
    assert calls == [["database password"], ["vault"]]
    # The log says what the workers were doing when each query timed out.
    warned = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
    assert len(warned) == 2
    assert "1 of 1 query workers busy" in warned[0]


def test_a_query_whose_client_went_away_is_not_embedded(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    gate, calls = _stall_embedding(svc, first_only=True)
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0)
    flt = SearchFilter(tenant="acme")

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(batcher.retrieve("database password", 1, flt))
        await asyncio.to_thread(wait_for, lambda: calls, 10, "the first embedding call")
        left = asyncio.ensure_future(batcher.retrieve("backups", 1, flt))
        stays = asyncio.ensure_future(batcher.retrieve("vault", 1, flt))
        await asyncio.sleep(0)  # one turn of the loop: both are queued behind the stalled call
        left.cancel()  # its client disconnected
        gate.set()
        answers = await asyncio.gather(first, stays)
        return [len(hits) for _, hits in answers]

    try:
        found = asyncio.run(scenario())
    finally:
        gate.set()
        batcher.close()
    assert found == [1, 1]
    # The queued pair went to the worker as one batch, and only the live query was embedded.
    assert calls == [["database password"], ["vault"]]


def test_a_timed_out_retrieve_answers_429_with_retry_after(tmp_path: Path) -> None:
    svc = make_service(tmp_path, **{"serve.query_timeout_s": 0.05})
    gate, _ = _stall_embedding(svc, first_only=False)
    try:
        with TestClient(create_app(svc, manage_service=False)) as client:
            r = client.post("/v1/retrieve", json={"query": "backups", "k": 1})
            gate.set()
    finally:
        gate.set()
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "1"
    error = r.json()["error"]
    assert error["code"] == "query_timeout"
    assert "serve.query_timeout_s" in error["message"]


def test_a_failed_batch_answers_500_in_the_one_error_shape_and_the_next_query_200(
    tmp_path: Path,
) -> None:
    svc = make_service(tmp_path)
    _fail_first_pin(svc)
    app = create_app(svc, manage_service=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        first = client.post("/v1/retrieve", json={"query": "backups", "k": 1})
        body = {"query": "backups", "k": 1, "filters": {"tenant": "acme"}}
        second = client.post("/v1/retrieve", json=body)
    assert first.status_code == 500, first.text
    assert first.json()["error"]["code"] == "internal_error"
    assert "read path" not in first.text  # the server's log has the details, not the client
    assert second.status_code == 200, second.text
    assert len(second.json()["results"]) == 1


class _StepClock:
    """A clock that moves ``step_s`` each time it is read: every query takes ``step_s``."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def _embedding_threads(svc: Any) -> list[str]:
    """The name of the thread each embedding call ran on, in order."""
    threads: list[str] = []
    gen = svc.pin()  # a batch embeds with the generation it pins
    original = gen.embed_many

    def spy(queries):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return original(queries)

    gen.embed_many = spy
    return threads


def _three_queries_one_by_one(batcher: QueryBatcher) -> tuple[str, list[int]]:
    """The event loop's thread name, and the hit counts of three queries sent one after another."""
    flt = SearchFilter(tenant="acme")

    async def scenario() -> tuple[str, list[int]]:
        found = []
        for query in ("database password", "backups", "vault"):
            _, hits = await asyncio.wait_for(batcher.retrieve(query, 1, flt), 10)
            found.append(len(hits))
        return threading.current_thread().name, found

    try:
        return asyncio.run(scenario())
    finally:
        batcher.close()


def _run_then_close(batcher: QueryBatcher, scenario: Coroutine[Any, Any, T], gate: Any) -> T:
    """Run ``scenario`` on a fresh event loop; then open ``gate`` and stop the workers."""
    try:
        return asyncio.run(scenario)
    finally:
        gate.set()
        batcher.close()


def _inline(svc: Any) -> float:
    """``streamrag_queries_inline_total``: queries answered on the event loop so far."""
    return svc.metrics.registry.get_sample_value("streamrag_queries_inline_total") or 0.0


def test_a_lone_fast_query_is_answered_on_the_event_loop_after_the_first(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    threads = _embedding_threads(svc)
    clock = _StepClock(0.0001)  # a query takes 0.1 ms: well under the bound
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=clock)
    loop_thread, found = _three_queries_one_by_one(batcher)
    assert found == [1, 1, 1]
    # The first goes to a worker (nothing measured yet); the next two are answered here.
    assert threads[0] != loop_thread
    assert threads[1:] == [loop_thread, loop_thread]
    assert _inline(svc) == 2


def test_a_model_that_does_not_say_how_it_runs_goes_inline_once_measured_computing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedder class of the user's: its query calls show it computes on the calling thread."""
    svc = make_service(tmp_path)
    choice = svc.pin().choice
    monkeypatch.setattr(type(choice.primary), "in_process", None)  # says nothing
    wall, cpu = _StepClock(0.0001), _StepClock(0.0001)  # every call all on the CPU
    choice.measure = lambda: ComputesHere(wall=wall, cpu=cpu)
    threads = _embedding_threads(svc)
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    flt = SearchFilter(tenant="acme")

    async def scenario() -> str:
        for _ in range(MIN_CALLS + 2):
            _, hits = await asyncio.wait_for(batcher.retrieve("database password", 1, flt), 10)
            assert len(hits) == 1
        return threading.current_thread().name

    try:
        loop_thread = asyncio.run(scenario())
    finally:
        batcher.close()
    # Handed to the worker until MIN_CALLS calls were measured, then answered on the loop.
    assert loop_thread not in threads[:MIN_CALLS]
    assert threads[MIN_CALLS:] == [loop_thread, loop_thread]
    assert _inline(svc) == 2
    assert choice.status()["measured"]["primary"] == {"calls": MIN_CALLS + 2, "cpu_share": 1.0}


def test_queries_that_arrive_together_go_to_the_workers(tmp_path: Path) -> None:
    """Several clients' queries read in one turn of the loop: none is held on it."""
    svc = make_service(tmp_path)
    threads = _embedding_threads(svc)
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    flt = SearchFilter(tenant="acme")

    async def scenario() -> str:
        for query in ("database password", "backups"):  # measured, then alone: on the loop
            await asyncio.wait_for(batcher.retrieve(query, 1, flt), 10)
        together = [batcher.retrieve(q, 1, flt) for q in ("vault", "rotation", "keys")]
        answers = await asyncio.wait_for(asyncio.gather(*together), 10)
        assert [len(hits) for _, hits in answers] == [1, 1, 1]
        return threading.current_thread().name

    try:
        loop_thread = asyncio.run(scenario())
    finally:
        batcher.close()
    assert threads[1] == loop_thread
    # Old behaviour: each of the three ran on the loop in turn, the others unread meanwhile.
    assert 3 <= len(threads) <= 5  # the three in one to three batches
    assert loop_thread not in threads[2:]
    assert _inline(svc) == 1


def test_a_query_alone_after_batches_with_company_goes_to_the_workers(tmp_path: Path) -> None:
    """Many clients between two answers: the next query alone still joins the workers."""
    svc = make_service(tmp_path)
    threads = _embedding_threads(svc)
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    batcher.batch_size = 8.0  # recent batches had eight queries on average
    loop_thread, found = _three_queries_one_by_one(batcher)
    assert found == [1, 1, 1]
    assert loop_thread not in threads
    assert _inline(svc) == 0


@pytest.mark.parametrize(
    ("step_s", "bound_ms", "remote"),
    [
        (0.005, 2.0, False),  # a query takes 5 ms: over the 2 ms bound
        (0.0, 0.0, False),  # off: even a query that takes no time hands off
        (0.0001, 2.0, True),  # fast, but the model calls a service, like OpenAIEmbedder
    ],
    ids=["slower-than-the-bound", "off", "remote-embedder"],
)
def test_queries_go_to_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_s: float, bound_ms: float, remote: bool
) -> None:
    svc = make_service(tmp_path)
    threads = _embedding_threads(svc)
    if remote:  # the generation's model does not compute here (no ``in_process``)
        monkeypatch.setattr(type(svc.pin().choice.primary), "in_process", False)
    clock = _StepClock(step_s)
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=0, inline_max_ms=bound_ms, clock=clock)
    loop_thread, found = _three_queries_one_by_one(batcher)
    assert found == [1, 1, 1]
    assert len(threads) == 3
    assert loop_thread not in threads
    assert _inline(svc) == 0


def test_a_query_while_another_is_at_a_worker_queues_behind_it(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    gate = threading.Event()
    calls: list[tuple[str, str]] = []
    gen = svc.pin()
    original = gen.embed_many

    def spy(queries):  # type: ignore[no-untyped-def]
        calls.append((queries[0], threading.current_thread().name))
        if queries[0] == "stalls":
            gate.wait(10)  # a slow call at the worker, until the test lets it go
        return original(queries)

    gen.embed_many = spy  # type: ignore[method-assign]
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    flt = SearchFilter(tenant="acme")

    async def scenario() -> str:
        await batcher.retrieve("warm", 1, flt)  # lone queries are fast: inline from now on
        batcher.inline_max_s = 0  # this one goes to the worker, where it stalls
        stalled = asyncio.ensure_future(batcher.retrieve("stalls", 1, flt))
        await asyncio.to_thread(wait_for, lambda: len(calls) == 2, 10, "the stalled call")
        batcher.inline_max_s = 0.002
        queued = asyncio.ensure_future(batcher.retrieve("backups", 1, flt))
        await asyncio.sleep(0)  # one turn of the loop: it is queued, the loop runs on
        gate.set()
        await asyncio.gather(stalled, queued)
        return threading.current_thread().name

    loop_thread = _run_then_close(batcher, scenario(), gate)
    assert [q for q, _ in calls] == ["warm", "stalls", "backups"]
    assert all(t != loop_thread for _, t in calls)
    assert _inline(svc) == 0


async def _a_batch_of_two(
    batcher: QueryBatcher, gate: threading.Event, calls: list[list[str]]
) -> None:
    """Leave the one worker with a last batch of two: a pair queued behind a stalled call.

    ``gate`` and ``calls`` are :func:`_stall_embedding`'s (``first_only``).
    """
    flt = SearchFilter(tenant="acme")
    stalled = asyncio.ensure_future(batcher.retrieve("stalls", 1, flt))
    await asyncio.to_thread(wait_for, lambda: calls, 10, "the stalled call")
    pair = [asyncio.ensure_future(batcher.retrieve(q, 1, flt)) for q in ("b1", "b2")]
    await asyncio.sleep(0)  # one turn of the loop: both queued behind the stalled call
    gate.set()
    await asyncio.wait_for(asyncio.gather(stalled, *pair), 5)  # the pair: one batch of 2
    assert calls[-1] == ["b1", "b2"]


def test_a_cheap_batch_does_not_wait_past_the_company_it_had(tmp_path: Path) -> None:
    """Two clients over a fast embedder: a pair is answered at once, not after max_wait."""
    svc = make_service(tmp_path)
    gate, calls = _stall_embedding(svc, first_only=True)
    # Batches take 0.1 ms (the clock) and may wait 10 s for company: a batch that
    # waited for a third query would miss the 5 s below.
    batcher = QueryBatcher(svc, workers=1, max_wait_ms=10_000, clock=_StepClock(0.0001))
    flt = SearchFilter(tenant="acme")

    async def scenario() -> None:
        await _a_batch_of_two(batcher, gate, calls)
        # The last batch had 2: the next pair is answered as soon as both are in.
        again = [asyncio.ensure_future(batcher.retrieve(q, 1, flt)) for q in ("c1", "c2")]
        await asyncio.wait_for(asyncio.gather(*again), 5)

    _run_then_close(batcher, scenario(), gate)
    assert calls == [["stalls"], ["b1", "b2"], ["c1", "c2"]]


def test_metrics_count_the_queries_answered_on_the_event_loop(tmp_path: Path) -> None:
    svc = make_service(tmp_path)  # the test embedder computes here: lone queries may stay
    with TestClient(create_app(svc, manage_service=False)) as client:
        for query in ("database password", "backups", "vault"):
            r = client.post("/v1/retrieve", json={"query": query, "k": 1})
            assert r.status_code == 200, r.text
        metrics = client.get("/metrics").text
    # The first went to a worker (nothing measured yet); the two after it stayed.
    assert "streamrag_queries_inline_total 2.0" in metrics


def test_a_query_arriving_while_a_worker_gathers_joins_its_batch(tmp_path: Path) -> None:
    """A worker waiting for company holds a query nobody has answered yet: no one is alone."""
    svc = make_service(tmp_path)
    gate, calls = _stall_embedding(svc, first_only=True)
    threads = _embedding_threads(svc)
    # Lone queries are fast (inline allowed), and a worker whose last batch had two
    # waits up to 10 s for a second query.
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=10_000, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    flt = SearchFilter(tenant="acme")

    async def scenario() -> str:
        await _a_batch_of_two(batcher, gate, calls)
        # The worker may still be finishing the pair's batch, or be idle: c1 goes to
        # it either way (inline off for this one query).
        batcher.inline_max_s = 0
        first = asyncio.ensure_future(batcher.retrieve("c1", 1, flt))
        await asyncio.sleep(0)  # one turn of the loop: c1 is queued
        batcher.inline_max_s = 0.002
        # The worker took it and gathers (nothing queued, nothing embedding).
        await asyncio.to_thread(wait_for, batcher._queue.empty, 10, "c1 taken")
        await asyncio.wait_for(asyncio.gather(first, batcher.retrieve("c2", 1, flt)), 5)
        return threading.current_thread().name

    loop_thread = _run_then_close(batcher, scenario(), gate)
    assert calls == [["stalls"], ["b1", "b2"], ["c1", "c2"]]
    assert loop_thread not in threads
    assert _inline(svc) == 0


def test_a_client_hears_back_only_once_its_worker_is_idle(tmp_path: Path) -> None:
    """The answer waits for the worker's bookkeeping: the next query then finds it idle."""
    svc = make_service(tmp_path)
    entered, gate = threading.Event(), threading.Event()
    observe = svc.observe_query

    def held(seconds: float, queries: int, *, inline: bool = False) -> None:
        if not inline:  # the worker's bookkeeping after a batch, held until the test looks
            entered.set()
            gate.wait(10)
        observe(seconds, queries, inline=inline)

    svc.observe_query = held
    batcher = QueryBatcher(
        svc, workers=1, max_wait_ms=0, inline_max_ms=2.0, clock=_StepClock(0.0001)
    )
    flt = SearchFilter(tenant="acme")

    async def scenario() -> tuple[bool, int]:
        first = asyncio.ensure_future(batcher.retrieve("backups", 1, flt))  # to the worker
        # While the loop waits here it runs whatever the worker has handed it.
        await asyncio.to_thread(entered.wait, 10)
        heard_while_busy = first.done()
        gate.set()
        await asyncio.wait_for(first, 5)
        busy_on_answer = batcher._busy
        await batcher.retrieve("vault", 1, flt)  # sent on the answer: nobody else in flight
        return heard_while_busy, busy_on_answer

    heard_while_busy, busy_on_answer = _run_then_close(batcher, scenario(), gate)
    assert not heard_while_busy
    assert busy_on_answer == 0
    assert _inline(svc) == 1


def test_one_worker_at_a_time_while_the_embedder_holds_the_lock_and_scans_use_every_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three queries arrive while a batch is stalled: the other worker leaves them be.

    Its calls cost nothing in themselves (so the gathering rule would not hold
    them, as the test above shows); what keeps them is that one worker at a
    time answers (here from the start: when is the next test's). After the
    stalled batch, they go in one call.
    """
    svc = make_service(tmp_path)
    assert svc.embedder_holds_lock() is True  # the tests' hashing embedder says so
    monkeypatch.setattr(QueryBatcher, "one_at_a_time", lambda self: True)
    batcher = QueryBatcher(svc, max_batch=64, max_wait_ms=0, workers=2, min_parallel_batch=8)
    _flat_costs(batcher)
    calls = _three_behind_a_stalled_one(svc, batcher, lambda _: batcher._queue.qsize() == 3)
    assert calls == [(1, False), (3, True)]


@pytest.mark.parametrize(
    ("workers", "all_cores", "holds", "expected"),
    [
        (2, True, True, True),
        (2, True, False, False),  # it lets go of the lock: workers embed side by side
        (2, True, None, False),  # not known: as before
        (2, False, True, False),  # scans on one core: two batches use two
        (1, True, True, False),
    ],
)
def test_when_workers_answer_one_at_a_time(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workers: int,
    all_cores: bool,
    holds: bool | None,
    expected: bool,
) -> None:
    svc = make_service(tmp_path)
    monkeypatch.setattr(svc, "embedder_holds_lock", lambda: holds)
    batcher = QueryBatcher(svc, workers=workers, scans_use_all_cores=all_cores)
    batcher.batch_size = batcher.min_parallel_batch
    try:
        assert batcher.one_at_a_time() is expected
        batcher.batch_size = batcher.min_parallel_batch - 1
        assert batcher.one_at_a_time() is False  # small batches: side by side
    finally:
        batcher.close()


def test_a_failing_question_about_the_lock_leaves_the_workers_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = make_service(tmp_path)

    def broken() -> bool:
        raise RuntimeError("no answer")

    monkeypatch.setattr(svc, "embedder_holds_lock", broken)
    batcher = QueryBatcher(svc, workers=2, scans_use_all_cores=True, max_wait_ms=0)
    batcher.batch_size = batcher.min_parallel_batch
    try:
        assert batcher.one_at_a_time() is False
        _, hits = asyncio.run(batcher.retrieve("backups", 1, SearchFilter(tenant="acme")))
        assert len(hits) == 1
    finally:
        batcher.close()


def test_the_service_tells_whether_its_embedder_holds_the_lock(tmp_path: Path) -> None:
    """Said by the embedder's class, else as the job measured it before embedding ahead."""
    from streamrag.embed.ahead import LOCK_FREE, EmbedAhead

    svc = make_service(tmp_path)
    assert svc.embedder_holds_lock() is True  # HashingEmbedder says so
    embedder = svc.serving.embedder
    # The same instance, under a class that says nothing.
    silent = type("Silent", (type(embedder),), {"holds_gil": None})
    embedder.__class__ = silent
    assert svc.embedder_holds_lock() is None  # nothing said, nothing measured
    ahead = EmbedAhead(embedder)
    svc.pipeline.embedding.ahead = ahead
    assert svc.embedder_holds_lock() is None  # not measured yet
    ahead.lock_free = LOCK_FREE / 4
    assert svc.embedder_holds_lock() is True
    ahead.lock_free = LOCK_FREE * 2
    assert svc.embedder_holds_lock() is False
    other = EmbedAhead(type(embedder)())  # measured for another model than the one serving
    other.lock_free = 0.0
    svc.pipeline.embedding.ahead = other
    assert svc.embedder_holds_lock() is None
