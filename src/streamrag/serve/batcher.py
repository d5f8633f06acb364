"""Gather concurrent queries into one embedding call and one index search.

Each request puts its query on a queue and awaits a future. A single worker
thread takes everything that is waiting, groups it by ``(k, filter)``, embeds
each group in one ``embed_many`` call and searches it in one batched matrix
product, then resolves the futures. Batching is opportunistic: there is no
timer, so a lone query is answered at once, while under load the requests that
arrive during one batch form the next. Embedding and search run off the event
loop, which keeps accepting connections meanwhile.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from streamrag.index.base import Hit, SearchFilter
from streamrag.runtime.service import Service

__all__ = ["QueryBatcher"]


@dataclass(slots=True)
class _Request:
    query: str
    k: int
    flt: SearchFilter
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[int, list[Hit]]]


class QueryBatcher:
    """Answers ``retrieve`` calls in batches on ``workers`` threads."""

    def __init__(
        self,
        service: Service,
        *,
        max_batch: int = 64,
        max_wait_ms: float = 2.0,
        workers: int = 2,
    ) -> None:
        self.service = service
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"streamrag-query-{i}", daemon=True)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    async def retrieve(self, query: str, k: int, flt: SearchFilter) -> tuple[int, list[Hit]]:
        """Top-``k`` hits for one query, answered as part of a batch."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, list[Hit]]] = loop.create_future()
        self._queue.put(_Request(query, k, flt, loop, fut))
        return await fut

    def close(self) -> None:
        """Stop the worker threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(5)

    def _work(self) -> None:
        last_size = 1
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            # Under concurrency (the last batch had company) wait up to max_wait
            # for more: one product over 16 queries costs about as much as over 4.
            # A lone client never waits.
            deadline = time.monotonic() + (self.max_wait_s if last_size > 1 else 0.0)
            stop = False
            while len(batch) < self.max_batch:
                try:
                    remaining = deadline - time.monotonic()
                    if remaining > 0:
                        item = self._queue.get(timeout=remaining)
                    else:
                        item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            last_size = len(batch)
            self._answer(batch)
            if stop:
                return

    def _answer(self, batch: list[_Request]) -> None:
        groups: dict[tuple[int, SearchFilter], list[_Request]] = defaultdict(list)
        for req in batch:
            groups[(req.k, req.flt)].append(req)
        for (k, flt), reqs in groups.items():
            try:
                epoch, hits = self.service.retrieve_many([r.query for r in reqs], k, flt)
            except Exception as exc:  # delivered to each waiting request
                for r in reqs:
                    r.loop.call_soon_threadsafe(_fail, r.future, exc)
                continue
            for r, h in zip(reqs, hits, strict=True):
                r.loop.call_soon_threadsafe(_resolve, r.future, (epoch, h))


def _resolve(fut: asyncio.Future[tuple[int, list[Hit]]], value: tuple[int, list[Hit]]) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[tuple[int, list[Hit]]], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
