"""The ingest threads step aside for queries in flight, and never for long.

:class:`~streamrag.runtime.priority.QueryPriority` counts the queries in
flight; the runner's loops wait for none before each unit of work, up to a
bound. These tests check the count, the wait, the bound (a query that never
finishes does not stop ingest) and the wiring from a served query to the count.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest

from streamrag.config import load_settings
from streamrag.runtime.priority import QueryPriority
from streamrag.runtime.service import Service
from streamrag.serve.app import create_app


def _until(cond: object, what: str) -> None:
    """Spin (bounded) until ``cond()`` holds: waits for an event, not for time."""
    for _ in range(2_000_000):
        if cond():  # type: ignore[operator]
            return
    pytest.fail(f"never happened: {what}")


def test_no_query_in_flight_means_no_wait() -> None:
    p = QueryPriority(max_yield_s=60.0)
    assert p.step_aside() is False
    assert p.steps_aside == 0


def test_waits_for_the_last_query_to_leave() -> None:
    p = QueryPriority(max_yield_s=60.0)  # far longer than the test: only leave() can end it
    p.enter()
    p.enter()
    done = threading.Event()

    def ingest() -> None:
        p.step_aside()
        done.set()

    t = threading.Thread(target=ingest)
    t.start()
    _until(lambda: p.steps_aside == 1, "the ingest thread waits")
    p.leave()
    assert not done.wait(0.05), "one query is still in flight"
    p.leave()
    t.join(10)
    assert done.is_set()
    assert p.in_flight == 0


def test_the_wait_is_bounded() -> None:
    p = QueryPriority(max_yield_s=0.001)
    p.enter()  # a query that never leaves
    for _ in range(5):
        assert p.step_aside() is True
    assert p.steps_aside == 5


def test_zero_turns_it_off() -> None:
    p = QueryPriority(max_yield_s=0.0)
    p.enter()
    assert p.step_aside() is False


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="max_yield_s"):
        QueryPriority(-1)


def _service(tmp_path: Path, **overrides: object) -> Service:
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            **overrides,
        },
        environ={},
    )
    return Service(settings)


def test_ingest_goes_on_while_a_query_never_finishes(tmp_path: Path) -> None:
    svc = _service(tmp_path, **{"serve.ingest_yield_ms": 1})
    assert svc.priority.max_yield_s == pytest.approx(0.001)
    svc.priority.enter()  # stands for a query stuck in flight
    svc.start()
    try:
        r = svc.ingest({"doc_id": f"d{i}", "text": f"text number {i}"} for i in range(200))
        assert r.accepted == 200
        assert r.committed
        assert svc.status()["counts"]["applied"] == 200
        assert svc.priority.steps_aside > 0, "the loops never stepped aside"
    finally:
        svc.priority.leave()
        svc.stop()


def test_a_served_query_is_counted_in_flight_and_leaves(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    svc.upsert("kb-1", "reset the router by holding the button")
    svc.pipeline.run_until_caught_up()
    counted: list[int] = []
    real = svc.priority.enter

    def enter() -> None:
        real()
        counted.append(svc.priority.in_flight)

    svc.priority.enter = enter  # type: ignore[method-assign]
    app = create_app(svc, manage_service=False)

    async def main() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.post("/v1/retrieve", json={"query": "router", "k": 1})

    try:
        r = asyncio.run(main())
    finally:
        svc.stop()
    assert r.status_code == 200
    assert r.json()["results"][0]["doc_id"] == "kb-1"
    assert counted == [1]
    assert svc.priority.in_flight == 0
