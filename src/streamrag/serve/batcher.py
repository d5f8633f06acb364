"""Gather concurrent queries into one embedding call and one batched index search.

Each request puts its query on a queue and awaits a future. A worker thread
(``serve.query_workers`` of them) takes everything that is waiting, up to
``max_batch`` queries, embeds them all in one ``embed_many`` call, searches each
group of equal ``(k, filter)`` in one batched matrix product, and resolves the
futures. Embedding a batch of short queries costs little more than embedding
one, so under load this multiplies throughput.

Waiting is adaptive. A worker whose previous batch had company waits up to
``max_wait_ms`` for more queries to arrive before it starts; a worker whose
previous batch was a lone query does not wait at all, so at concurrency 1 no
latency is added. Once it holds as many as its previous batch, it waits on
only if a batch costs at least five times the wait (MiniLM: tens of
milliseconds a call, where company is worth 2 ms); over a cheap embedder it
goes with what is queued. At two clients over 20,000 documents with the hashing
embedder, waiting for a third query that could not come held each pair 2 ms:
265-328 queries/s, against 395-420 without that wait.

While another worker is embedding, a worker holding fewer than
``min_parallel_batch`` queries keeps gathering until it has that many or the
other worker is done: when the embedder is the bottleneck (MiniLM through
PyTorch: ~9 ms per call plus ~4.6 ms per query on a core here), one call over
eight queries is cheaper than two concurrent calls over four each fighting for
the same cores.

Company is only worth gathering when a call has a cost of its own. Each
worker fits the CPU time of its batches (its own thread's, which waiting for
the interpreter lock or for a core does not inflate) to *fixed + per-query ×
size* by least squares over recent batches (:class:`CallCost`). Where a call's
fixed cost is below what one query adds, a second query in the same call saves
less than half its cost, and the worker neither waits for company nor holds a
small batch. MiniLM in int8 through ONNX Runtime embeds each text alone (2.7 ms
a query in one thread; in the server the fit put a call's own cost at a fifth to
a third of a query's); there a worker that waited sat idle while its clients'
next queries were on their way. At 16 clients
(`serving.py`'s server, four alternated rounds each) 339-370 queries/s before,
458-478 after (mean batch 8.3 → 3.5); at 64 clients 515-609 before, 488-592
after. MiniLM through PyTorch (~9 ms a call, ~4.6 ms a query) and hashing over
20,000 documents (~3.9 ms a call, ~0.2 ms a query; both in one thread) keep
gathering.
Until a worker's batches have varied in size enough to fit, it gathers, and
over a remote embedder (whose call costs a round trip that CPU time does not
show) it always does.

**One worker at a time** (:meth:`QueryBatcher.one_at_a_time`). While the
embedder computes holding the interpreter lock (the hashing embedder, or one
the job measured to, :mod:`streamrag.embed.ahead`), the index's exact scans
take every idle core (:mod:`streamrag.index.scan_helpers`) and batches are
large (``min_parallel_batch`` queries or more on average), a worker gathers and
answers its batch holding a lock the others wait on. Two workers could not
embed at once anyway; side by side they split the clients into two smaller
batches, each scanned on one core, where one batch scanned over both cores
costs less a query (the float32 product reads the rows once for a whole
batch: 20,000 rows × 384 on one thread, 0.72 ms a query in a batch of 8, 0.39
in a batch of 16). With a few clients the batches are small and scanned a query
at a time through half-precision copies, where two workers side by side kept
both cores busier (50,000 documents, 4 clients: 262–296 queries/s one at a
time against 303–319). Figures: ``docs/performance.md`` ("One batch over every
core"). An embedder that lets go of the lock (MiniLM through ONNX Runtime or
PyTorch) keeps its workers side by side: each embeds on a core of its own.

``max_batch=1`` turns micro-batching off: every query is embedded and searched
on its own (the benchmark's baseline). Embedding and search run off the event
loop, which keeps accepting connections meanwhile.

A lone query may skip the hand-off. Waking a worker on another core and
waking the event loop back costs ~0.1 ms a query on a 2-vCPU virtual machine
(a worker that answers at once: 94-129 us there, 26-35 us with the event loop
and the workers on one core); over 20,000 documents on a 2-core host a lone
query answered by a worker took 0.6-1.4 ms longer at the client than on the
loop, most of it in the search: the worker's scan helper, woken while the
loop still ran on the other core, often started late. When no other query is
in flight, queued or read in the same turn of the loop, recent batches had
no company either, the model computes here with no I/O
(:func:`~streamrag.embed.base.in_process`, measured where the class does not
say), and lone queries lately took at most ``inline_max_ms`` (a moving
average of their measured time), the query is embedded and searched on the
event loop itself: the loop is held for about that long, no more than a
second query would have waited for a busy worker (a query dearer than the
recent ones, such as a read far back in history, holds it longer, once: the
average then moves). Queries that arrive together — several clients whose
queries came in while the loop was held — go to the workers, which batch
them: answered on the loop one after another, 16 clients got 330-530
queries/s against 560-750 in batches. A remote embedder, a slow model or a
large exact scan always goes to the workers.

No query waits forever. Each has a deadline (``timeout_s``, the setting
``serve.query_timeout_s``): past it the request fails with
:class:`~streamrag.errors.QueryTimeoutError` (HTTP 429 with ``Retry-After``), and
a worker that picks it up later skips it, as it skips a request whose client
went away. Whatever a batch raises — an embedder's error, or a bug in this
module — reaches each of its requests as their error, and the worker goes on
with the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import queue
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from streamrag.errors import QueryTimeoutError
from streamrag.index.base import SearchFilter
from streamrag.index.hits import Hits

__all__ = ["CallCost", "QueryBatcher", "Retrieval", "Retrieved"]

log = logging.getLogger("streamrag.serve")


class Reader(Protocol):
    """One index generation: embed queries with its model, search its index."""

    number: int

    @property
    def in_process(self) -> bool:
        """Its queries are embedded on this CPU with no I/O (may run on the event loop)."""
        ...

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Queries as unit vectors, one row each."""
        ...

    def search_many(
        self, vectors: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits]]:
        """The top ``k`` of each query vector in one pinned epoch: ``(epoch, hits)``."""
        ...


class Retrieval(Protocol):
    """What answering queries takes: pin a generation, embed, search, record the time.

    :class:`~streamrag.runtime.service.Service` is one. A batch pins one
    generation (:meth:`pin`) for both its embedding and its search, so a
    switch of embedding model in between cannot pair a query vector with
    another model's index.
    """

    def pin(self) -> Reader:
        """The generation this batch reads."""
        ...

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Queries as unit vectors, one row each."""
        ...

    def search_many(
        self, vectors: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits]]:
        """The top ``k`` of each query vector in one pinned epoch: ``(epoch, hits)``."""
        ...

    def observe_query(self, seconds: float, queries: int, *, inline: bool = False) -> None:
        """Record one batch of ``queries`` answered in ``seconds`` (``inline``: on the loop)."""
        ...

    def embedder_holds_lock(self) -> bool | None:
        """Whether the serving embedder computes holding the interpreter lock; None: not known."""
        ...


_HOLD_POLL_S = 0.001
_PATIENT = 5.0  # a batch that took this many max_waits is worth waiting for company
_COST_DECAY = 0.95  # weight of a batch in the call-cost fit, per batch answered after it
_COST_MIN_SPREAD = 0.25  # variance of batch sizes (queries²) the fit needs


class CallCost:
    """How a batch's time grows with its size: a fixed cost per call plus one per query.

    A least-squares line through recent ``(queries, seconds)`` pairs, each
    weighing :data:`_COST_DECAY` less for every batch after it, kept as five
    running sums. Its intercept is what a call costs however few queries it
    carries: what one more query in a batch saves against a call of its own.

    >>> cost = CallCost()
    >>> for n in (2, 6, 3, 8, 4):
    ...     cost.add(n, 0.010 + 0.002 * n)
    >>> [round(x, 4) for x in cost.fit()]  # 10 ms a call, 2 ms a query
    [0.01, 0.002]
    >>> cost.company_pays()
    True
    """

    __slots__ = ("_n", "_nn", "_nt", "_t", "_w")

    def __init__(self) -> None:
        self._w = self._n = self._nn = self._t = self._nt = 0.0

    def add(self, queries: int, seconds: float) -> None:
        """Fold in one batch of ``queries`` that took ``seconds``."""
        d = _COST_DECAY
        self._w = self._w * d + 1.0
        self._n = self._n * d + queries
        self._nn = self._nn * d + queries * queries
        self._t = self._t * d + seconds
        self._nt = self._nt * d + queries * seconds

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_query)`` seconds; None until the batches' sizes have varied."""
        w = self._w
        if w <= 0:
            return None
        mean_n = self._n / w
        spread = self._nn / w - mean_n * mean_n
        if spread < _COST_MIN_SPREAD:
            return None  # every batch about one size: the line is not determined
        per_query = max(0.0, (self._nt / w - mean_n * self._t / w) / spread)
        return max(0.0, self._t / w - per_query * mean_n), per_query

    def company_pays(self) -> bool:
        """Whether gathering queries pays: not known yet, or a call costs at least a query.

        Then a second query in a call costs at most half of what it would alone.
        """
        fitted = self.fit()
        return fitted is None or fitted[0] >= fitted[1]


_LONE_WEIGHT = 0.25  # weight of the newest lone query in the moving average of their time
_SIZE_WEIGHT = 0.25  # weight of the newest batch in the moving average of their size
_INLINE_MAX_BATCH = 1.5  # recent batches larger on average: queries come with company
Retrieved = tuple[int, Hits, npt.NDArray[np.float32], int]
"""One query's answer: the epoch read, its hits, the query's unit vector, the generation."""


@dataclass(slots=True)
class _Request:
    query: str
    k: int
    flt: SearchFilter
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Retrieved]


_Answer = tuple[_Request, Callable[[Any, Any], None], Any]
"""A request, the function that settles its future (:func:`_resolve`, :func:`_fail`), its value."""


class QueryBatcher:
    """Answers ``retrieve`` calls in batches on ``workers`` threads."""

    def __init__(
        self,
        retrieval: Retrieval,
        *,
        max_batch: int = 64,
        max_wait_ms: float = 2.0,
        workers: int = 2,
        min_parallel_batch: int = 1,
        timeout_s: float = 30.0,
        inline_max_ms: float = 0.0,
        scans_use_all_cores: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.retrieval = retrieval
        self.timeout_s = timeout_s
        self.inline_max_s = inline_max_ms / 1000
        self._clock = clock
        self._cpu_clock = cpu_clock  # the calling thread's CPU seconds
        self._waiting = 0  # queries handed to the workers and not answered yet (loop only)
        self._arriving = 0  # queries deciding whether they are alone (loop only; see _alone)
        self._lone_s: float | None = None  # moving average of a lone query's time
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000
        self.min_parallel_batch = min(max(1, min_parallel_batch), max_batch)
        self._busy = 0
        self._busy_lock = threading.Lock()
        self.scans_use_all_cores = scans_use_all_cores
        """The index's exact scans take idle cores (:mod:`streamrag.index.scan_helpers`)."""
        self._solo = threading.Lock()  # held by the one worker at work (see one_at_a_time)
        self.batch_size = 1.0
        """The size of recent batches (of any worker; a moving average)."""
        self._dumped = False  # the threads' stacks went to the log once (a timeout)
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        # Each worker's batches: does a call cost in itself? (Its own, as it is
        # the only thread that adds to it.)
        self._costs = [CallCost() for _ in range(workers)]
        self._threads = [
            threading.Thread(
                target=self._work, args=(cost,), name=f"streamrag-query-{i}", daemon=True
            )
            for i, cost in enumerate(self._costs)
        ]
        for thread in self._threads:
            thread.start()

    async def retrieve(self, query: str, k: int, flt: SearchFilter) -> tuple[int, Hits]:
        """Top-``k`` hits for one query, answered as part of a batch."""
        epoch, hits, _, _ = await self.retrieve_read(query, k, flt)
        return epoch, hits

    async def retrieve_with_vector(
        self, query: str, k: int, flt: SearchFilter
    ) -> tuple[int, Hits, npt.NDArray[np.float32]]:
        """:meth:`retrieve`, also returning the query's vector (for the semantic cache)."""
        epoch, hits, vector, _ = await self.retrieve_read(query, k, flt)
        return epoch, hits, vector

    async def retrieve_read(self, query: str, k: int, flt: SearchFilter) -> Retrieved:
        """Epoch, hits, the query's vector and the index generation that answered."""
        if self._may_answer_here() and await self._alone():
            reader = self._inline_reader()
            if reader is not None:
                return self._answer_here(reader, query, k, flt)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Retrieved] = loop.create_future()
        self._queue.put(_Request(query, k, flt, loop, fut))
        deadline = loop.call_later(self.timeout_s, self._expire, fut)
        self._waiting += 1
        try:
            return await fut
        finally:
            self._waiting -= 1
            deadline.cancel()

    def _may_answer_here(self) -> bool:
        """Whether a query could run on the event loop now: on, fast lately, nobody else about."""
        lone = self._lone_s
        if self.inline_max_s <= 0 or lone is None or lone > self.inline_max_s:
            return False  # off, nothing measured yet, or lone queries lately too slow
        if self._waiting or self._busy:
            # Not alone (every queued query is counted in ``_waiting``): the
            # workers batch it with the others.
            return False
        # Alone this instant, but recent batches had company: many clients
        # between two answers, whose next queries are on their way.
        return self.batch_size <= _INLINE_MAX_BATCH

    async def _alone(self) -> bool:
        """Whether no other query arrived in the same turn of the event loop as this one.

        Queries read from their sockets in one turn of the loop (several
        clients' queries that came in while the loop was busy, one held on it
        included) each start their handler in the next turn, and every handler
        runs up to here without yielding: each would find nothing in flight
        and hold the loop in turn. So each counts itself in and yields once;
        by the time it runs again, every query of its turn has counted itself.
        """
        self._arriving += 1
        try:
            await asyncio.sleep(0)
            return self._arriving == 1
        finally:
            self._arriving -= 1

    def _inline_reader(self) -> Reader | None:
        """The generation to answer a lone query with on the event loop, or None to hand off."""
        if not self._may_answer_here():
            return None
        reader = self.retrieval.pin()
        return reader if reader.in_process else None

    def _answer_here(self, reader: Reader, query: str, k: int, flt: SearchFilter) -> Retrieved:
        """One query embedded and searched on the calling thread (the event loop)."""
        started = self._clock()
        vectors = reader.embed_many([query])
        epoch, hits = reader.search_many(vectors, k, flt)
        took = self._clock() - started
        self._note_lone(took)
        self.batch_size += _SIZE_WEIGHT * (1 - self.batch_size)
        self.retrieval.observe_query(took, 1, inline=True)
        return epoch, hits[0], vectors[0], reader.number

    def _note_lone(self, seconds: float) -> None:
        """Fold one lone query's time into the moving average that gates :meth:`_inline_reader`."""
        lone = self._lone_s
        self._lone_s = seconds if lone is None else lone + _LONE_WEIGHT * (seconds - lone)

    def close(self) -> None:
        """Stop the worker threads."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(5)

    def _expire(self, fut: asyncio.Future[Retrieved]) -> None:
        """The query's deadline passed: fail it, and say in the log what the workers were doing.

        The first time, every thread's stack goes to the log too (``faulthandler``):
        a stalled worker shows where it stands.
        """
        if fut.done():
            return
        msg = (
            f"the query got no answer within serve.query_timeout_s={self.timeout_s:g} s "
            "(the query workers are busy or stalled); send it again"
        )
        fut.set_exception(QueryTimeoutError(msg, retry_after_s=1))
        log.warning(
            "a query timed out after %g s: %d of %d query workers busy, %d queries queued",
            self.timeout_s,
            self._busy,
            len(self._threads),
            self._queue.qsize(),
        )
        if not self._dumped:
            self._dumped = True
            with contextlib.suppress(Exception):  # no usable stderr: the warning stands alone
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def one_at_a_time(self) -> bool:
        """Whether one worker at a time gathers and answers a batch (see the module).

        So it is while the embedder holds the interpreter lock, the index's
        scans use every core, and batches are large (recent ones had
        ``min_parallel_batch`` queries or more on average): two workers could
        not embed at once,
        and one batch scanned over all cores costs less a query than two
        smaller batches scanned side by side, since the float32 product reads
        the rows once for a whole batch. Small batches (a few clients) are
        scanned a query at a time anyway (half-precision copies), and two
        workers side by side keep both cores busier.
        """
        if len(self._threads) < 2 or not self.scans_use_all_cores:
            return False
        if self.batch_size < self.min_parallel_batch:
            return False
        try:
            return self.retrieval.embedder_holds_lock() is True
        except Exception:  # not known: workers answer side by side, as without this
            log.exception("could not tell whether the embedder holds the interpreter lock")
            return False

    def _work(self, cost: CallCost) -> None:
        last_size = 1
        last_s = 0.0  # how long the last batch took
        while True:
            solo = self.one_at_a_time()
            if solo:
                self._solo.acquire()
            try:
                answers, last_size, last_s, stop = self._gather_and_answer(cost, last_size, last_s)
            finally:
                if solo:
                    self._solo.release()
            # Idle before anyone hears back: a client's next query, sent the moment
            # its answer arrives, finds no worker busy (it may run inline).
            for r, fn, value in answers:
                _deliver(r, fn, value)
            if stop:
                return

    def _gather_and_answer(
        self, cost: CallCost, last_size: int, last_s: float
    ) -> tuple[list[_Answer], int, float, bool]:
        """Take the next batch and answer it: (answers, its size, its seconds, stop after)."""
        first = self._queue.get()
        if first is None:
            return [], last_size, last_s, True
        batch = [first]
        # Under concurrency (the last batch had company) wait up to max_wait
        # for more: one product over 16 queries costs about as much as over 4.
        # A lone client never waits, nor does a worker whose calls cost
        # nothing in themselves (MiniLM in int8 embeds each query alone).
        # (A remote embedder's call costs a round trip, which CPU time does not show.)
        company = cost.company_pays() or not self.retrieval.pin().in_process
        wait = self.max_wait_s if last_size > 1 and company else 0.0
        deadline = time.monotonic() + wait
        stop = False
        while len(batch) < self.max_batch:
            # Past as many as the last batch had, waiting for more pays only
            # when a batch costs far more than the wait (MiniLM through
            # PyTorch: tens of ms a call); over a cheap embedder (hashing: a
            # batch of 2 in ~1 ms) a wait for a third query that may never
            # come doubles the latency.
            patient = len(batch) < last_size or last_s >= _PATIENT * self.max_wait_s
            remaining = deadline - time.monotonic() if patient else 0.0
            # While another worker embeds, a small batch keeps gathering
            # instead of competing with it for the cores: one call over
            # many queries beats two concurrent calls over a few each.
            hold = company and self._busy > 0 and len(batch) < self.min_parallel_batch
            try:
                if remaining > 0:
                    item = self._queue.get(timeout=remaining)
                elif hold:
                    item = self._queue.get(timeout=_HOLD_POLL_S)
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                if hold:
                    continue
                break
            if item is None:
                stop = True
                break
            batch.append(item)
        last_size = len(batch)
        self.batch_size += _SIZE_WEIGHT * (last_size - self.batch_size)  # (a race costs a sample)
        answers: list[_Answer] = []
        with self._busy_lock:
            self._busy += 1
        try:
            cpu0 = self._cpu_clock()
            last_s = self._answer(batch, answers)
            if last_s > 0:
                cost.add(len(batch), self._cpu_clock() - cpu0)
        except Exception as exc:  # the worker outlives any one batch
            log.exception("a batch of %d queries failed", len(batch))
            answers += [(r, _fail, exc) for r in batch]  # a query answered keeps its answer
        finally:
            with self._busy_lock:
                self._busy -= 1
        return answers, last_size, last_s, stop

    def _answer(self, batch: list[_Request], answers: list[_Answer]) -> float:
        """Embed and search one batch, its answers added to ``answers``; the seconds it took.

        0 when there was nothing to do. The answers are delivered by the caller.
        """
        # Past their deadline, or their client went away: nobody waits for these.
        batch = [r for r in batch if not r.future.done()]
        if not batch:
            return 0.0
        retrieval = self.retrieval
        started = self._clock()
        reader = retrieval.pin()
        try:
            vectors = reader.embed_many([r.query for r in batch])
        except Exception as exc:  # delivered to each waiting request
            answers += [(r, _fail, exc) for r in batch]
            return self._clock() - started
        groups: dict[tuple[int, SearchFilter], list[int]] = defaultdict(list)
        for i, req in enumerate(batch):
            groups[(req.k, req.flt)].append(i)
        for (k, flt), rows in groups.items():
            try:
                epoch, hits = reader.search_many(vectors[rows], k, flt)
            except Exception as exc:  # an epoch or as_of outside history, for this group
                answers += [(batch[i], _fail, exc) for i in rows]
                continue
            for i, h in zip(rows, hits, strict=True):
                r = batch[i]
                answers.append((r, _resolve, (epoch, h, vectors[i], reader.number)))
        took = self._clock() - started
        if len(batch) == 1:
            self._note_lone(took)
        retrieval.observe_query(took, len(batch))
        return took


def _deliver(r: _Request, fn: Any, value: Any) -> None:
    """Hand ``fn(r.future, value)`` to the request's event loop; nothing if it has closed."""
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
        r.loop.call_soon_threadsafe(fn, r.future, value)


def _resolve(fut: asyncio.Future[Retrieved], value: Retrieved) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Retrieved], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
