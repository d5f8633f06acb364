"""The query batcher: a second worker waits for a worthwhile batch while the first embeds."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from streamrag.index.base import SearchFilter
from streamrag.serve.batcher import QueryBatcher
from tests.e2e.conftest import wait_for
from tests.serve.test_answer_api import make_service


def test_a_small_batch_waits_while_another_worker_embeds(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
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

    gen.embed_many = spy  # type: ignore[method-assign]
    batcher = QueryBatcher(svc, max_batch=64, max_wait_ms=0, workers=2, min_parallel_batch=8)
    flt = SearchFilter(tenant="acme")

    async def scenario() -> list[int]:
        first = asyncio.ensure_future(batcher.retrieve("database password", 1, flt))
        await asyncio.to_thread(wait_for, lambda: calls, 10, "the first embedding call")
        rest = [
            asyncio.ensure_future(batcher.retrieve(q, 1, flt))
            for q in ("backups", "vault", "restart")
        ]
        # The idle worker takes the three queries and holds them: three are not worth
        # a second concurrent embedding call.
        await asyncio.to_thread(wait_for, batcher._queue.empty, 10, "the queries taken")
        released.set()
        gate.set()
        answers = await asyncio.gather(first, *rest)
        return [len(hits) for _, hits in answers]

    try:
        assert asyncio.run(scenario()) == [1, 1, 1, 1]
    finally:
        batcher.close()
    assert calls == [(1, False), (3, True)]
