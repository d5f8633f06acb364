"""Embedding ahead: a worker process embeds queued chunks while the job commits earlier ones.

An embedder written in Python (the hashing embedder, a tokenizer loop of your
own) holds the interpreter lock while it computes, so in one process it can
only take turns with the rest of the job: decoding, chunking, committing and
answering queries all wait while it runs, and a second core stays idle. A
worker process has its own interpreter. :class:`EmbedAhead` starts one
(``python -m streamrag.embed.ahead_worker``), hands it the chunks of every
change the moment it is queued in the micro-batcher, and keeps the vectors it
sends back, by text. When the commit of that change comes, its vectors are
usually there already: the commit takes them instead of calling the embedder,
and lets go of the change's texts once it is in (:meth:`EmbedAhead.discard`).

It is only ever a head start, never the authority:

* the commit asks for the vectors of a whole embedding call at once
  (:meth:`EmbedAhead.take`); if any text of it is missing — not sent (the
  worker was starting, or :attr:`~EmbedAhead.limit` texts were held already)
  or refused by the worker's embedder — the call is embedded in-process exactly
  as without a worker, with its retries and its isolation of a bad text
  (:mod:`streamrag.embed.resilient`);
* the worker gets a pickled copy of the embedder and must report the same
  ``version``, so a vector is the same whichever process made it (stream =
  batch);
* a worker that dies is started again at most every ``restart_s``; meanwhile,
  everything is embedded in-process.

Queries never go through the worker: they embed in the serving process, where
a lone query costs microseconds and no hop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle  # the embedder goes to our own child process, over a private pipe
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgspec
import numpy as np
import numpy.typing as npt

from streamrag.cpus import known_process_cpus
from streamrag.embed.ahead_worker import read_frame, write_frame
from streamrag.embed.base import Embedder
from streamrag.timing import US_PER_S, Clock, SystemClock

__all__ = ["LOCK_FREE", "Ahead", "EmbedAhead", "agreed_share", "holds_gil", "lock_free_share"]

log = logging.getLogger("streamrag.embed.ahead")

_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""One thread per call in the worker, as in the job (a process of its own is the parallelism)."""


def holds_gil(embedder: object) -> bool | None:
    """Whether ``embedder`` says it computes in Python, holding the interpreter lock.

    A class says so with ``holds_gil = True`` (:class:`~.hashing.HashingEmbedder`),
    or ``holds_gil = False`` when it computes in native code that releases the
    lock (ONNX Runtime, PyTorch) or waits on the network: a process of its own
    would gain nothing and hold a second copy of the model. None: it does not
    say (:func:`lock_free_share` measures it).
    """
    said = getattr(type(embedder), "holds_gil", None)
    return said if isinstance(said, bool) else None


LOCK_FREE = 0.4
"""Below this :func:`lock_free_share`, an embedder computes holding the interpreter lock."""


def lock_free_share(
    embedder: Embedder, texts: Sequence[str], *, cpus: set[int] | None = None, least_s: float = 0.03
) -> float:
    """How much of its work ``embed_many`` does with the interpreter lock released, measured.

    The calls run alone, then beside a thread that counts in Python and hands
    the lock on every few microseconds (``time.sleep(0)``); that thread also
    counts alone. Each runs at least ``least_s``, unpinned (on ``cpus``). Two
    threads that both compute in Python share one interpreter, so their rates
    beside each other, as fractions of their rates alone, add up to about one;
    an embedder that computes in native code with the lock released, or waits
    on I/O, keeps its pace beside the counter on another CPU, and the fractions
    add up to about two. The share is that sum less one: measured on a 2-core
    host, 0.0–0.2 for the hashing embedder and a numpy hashing embedder,
    0.97–1.0 for MiniLM through ONNX Runtime and for one that waits on I/O.
    """
    texts = list(texts)
    stop = threading.Event()
    counted: list[float] = []

    def count() -> None:
        _pin(cpus)
        n, started, nap = 0, time.perf_counter(), time.sleep
        while not stop.is_set():
            for _ in range(200):
                n += 1
            nap(0)  # hands the lock on: neither thread waits out a switch interval
        counted.append(n / (time.perf_counter() - started))

    def calls() -> float:
        _pin(cpus)
        n, started = 0, time.perf_counter()
        while (took := time.perf_counter() - started) < least_s or not n:
            embedder.embed_many(texts)
            n += 1
        return n / took

    def counting(during: Callable[[], float] | None) -> float:
        stop.clear()
        counter = threading.Thread(target=count, name="streamrag-lock-probe")
        counter.start()
        try:
            return during() if during is not None else float(stop.wait(least_s))
        finally:
            stop.set()
            counter.join()

    with concurrent.futures.ThreadPoolExecutor(1, "streamrag-lock-probe") as pool:
        pool.submit(embedder.embed_many, texts).result()  # warm: caches, lazy loads
        alone = pool.submit(calls).result()
        counting(None)
        beside = counting(lambda: pool.submit(calls).result())
    return max(0.0, min(1.0, beside / alone + counted[1] / counted[0] - 1.0))


def agreed_share(measure: Callable[[], float], *, most: int = 3) -> float:
    """A :func:`lock_free_share` that one noisy measurement cannot decide alone.

    Each measurement lasts tens of milliseconds, and another process taking a
    core for part of it moves the share by as much as the gap between the two
    kinds of embedder (a Python one measured 0.5 on a 2-core host busy with a
    test run). So it is measured until two measurements fall on the same side
    of :data:`LOCK_FREE` (at most ``most`` times), and the median of those is
    the share.
    """
    shares = [measure()]
    while len(shares) < most:
        shares.append(measure())
        below = [s for s in shares if s < LOCK_FREE]
        above = [s for s in shares if s >= LOCK_FREE]
        agreed = below if len(below) >= 2 else above if len(above) >= 2 else None
        if agreed is not None:
            return float(np.median(agreed))
    return float(np.median(shares))


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(0, cpus)


@dataclass(slots=True)
class Ahead:
    """Vectors taken from the worker for one embedding call."""

    vectors: npt.NDArray[np.float32]
    seconds: float
    """The worker's time for these texts (its calls' time, shared out by text)."""


@dataclass(eq=False, slots=True)
class _Request:
    id: int
    texts: list[str]
    done: bool = False
    failed: bool = False
    vectors: npt.NDArray[np.float32] | None = None
    seconds: float = 0.0


_NOT_YET = _Request(0, [])


@dataclass(eq=False, slots=True)
class _Entry:
    """Where a held text's vector is: its request and row, and how many changes wait for it."""

    req: _Request
    row: int
    refs: int = 1


def _by_request(entries: Sequence[_Entry | None]) -> dict[_Request, tuple[list[int], list[int]]]:
    """The slots of ``entries`` and their rows, by request (one or two for most calls)."""
    out: dict[_Request, tuple[list[int], list[int]]] = {}
    for slot, entry in enumerate(entries):
        assert entry is not None  # the caller checked
        slots, rows = out.setdefault(entry.req, ([], []))
        slots.append(slot)
        rows.append(entry.row)
    return out


@dataclass(slots=True)
class _Worker:
    proc: subprocess.Popen[bytes]
    requests: BinaryIO
    answers: BinaryIO
    outbox: queue.SimpleQueue[bytes | None] = field(default_factory=queue.SimpleQueue)
    threads: list[threading.Thread] = field(default_factory=list)
    ready: bool = False
    alive: bool = True


class EmbedAhead:
    """A worker process that embeds texts before their commit asks for them.

    The worker gets a pickled copy of ``embedder`` (a class may leave caches out
    of its pickle) and must report its ``version`` and ``dim``. ``limit``
    bounds the texts held (sent or answered, not yet discarded);
    ``request_size`` is the most texts per message to the worker, so a commit
    finds the first of a long backlog embedded early.
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        limit: int = 8192,
        request_size: int = 256,
        restart_s: float = 30.0,
        eager: bool = False,
        measure: bool = False,
        cpus: set[int] | None = None,
        clock: Clock | None = None,
        on_taken: Callable[[str, int], None] | None = None,
    ) -> None:
        self.embedder = embedder
        self.version, self.dim = embedder.version, embedder.dim
        self.limit, self.request_size = limit, max(1, request_size)
        self.restart_us = int(restart_s * US_PER_S)
        self.eager = eager
        """Start with the first change (else once a backlog fills the batcher)."""
        self.measure = measure
        """Measure whether the embedder holds the interpreter lock before the first start
        (:meth:`holds_lock`): for one that does not say (:func:`holds_gil`)."""
        self.lock_free: float | None = None
        """The share :func:`lock_free_share` measured, once it was."""
        self.cpus = cpus
        """The CPUs the worker may run on (None: those of the job)."""
        self.clock = clock or SystemClock()
        self.on_taken = on_taken
        """Called with ("ahead" | "missed", texts) for each call the commit asked about."""
        self.started = False
        """Whether a worker was ever started (it may be starting, ready or gone since)."""
        self.refused: str | None = None
        """Why this job embeds in-process for good (the embedder does not pickle, the
        worker's embedder is another one, or it releases the lock); None while the
        worker may help."""
        self._cond = threading.Condition()
        self._where: dict[str, _Entry] = {}
        self._ids = 0
        self._inflight: dict[int, _Request] = {}
        self._worker: _Worker | None = None
        self._started_at: int | None = None
        self._closed = False

    # -- the worker ------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Whether a worker is up and takes texts."""
        w = self._worker
        return w is not None and w.ready and w.alive

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        w = self._worker
        return w.proc.pid if w is not None and w.alive else None

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the worker is ready, or refused, or gone; returns :attr:`ready`."""
        with self._cond:
            self._cond.wait_for(
                lambda: self.ready or self.refused is not None or self.pid is None, timeout_s
            )
        return self.ready

    def holds_lock(self, texts: Sequence[str]) -> bool:
        """Whether a worker would help: the embedder computes holding the interpreter lock.

        Without :attr:`measure`, yes (it said so, or the job asked for a worker).
        Otherwise it is measured once on ``texts`` (:func:`agreed_share` of
        :func:`lock_free_share`, 0.2–0.3 s); an embedder that releases the lock is left in-process.
        """
        if not self.measure:
            return True
        if self.lock_free is None:
            cpus, sample = known_process_cpus(), list(texts[:64])
            self.lock_free = agreed_share(lambda: lock_free_share(self.embedder, sample, cpus=cpus))
            if self.lock_free >= LOCK_FREE:
                self._refuse(
                    f"{type(self.embedder).__name__} computes with the interpreter lock "
                    f"released ({self.lock_free:.0%} of its work, measured): a worker "
                    "process would not help"
                )
            else:
                log.info(
                    "%s computes holding the interpreter lock (%.0f%% of its work released, "
                    "measured): embedding ahead in a worker process",
                    type(self.embedder).__name__,
                    100 * self.lock_free,
                )
        return self.refused is None

    def start(self) -> bool:
        """Start the worker unless one runs, or was started less than ``restart_s`` ago.

        Returns whether one was started. It is ready once its embedder is built
        (:attr:`ready`); until then texts are not sent and commits embed in-process.
        """
        with self._cond:
            if self._closed or self.refused is not None:
                return False
            w = self._worker
            if w is not None and w.alive:
                return False
            now = self.clock.now_us()
            if self._started_at is not None and now - self._started_at < self.restart_us:
                return False
            try:
                hello = msgspec.msgpack.encode(
                    {"path": list(sys.path), "embedder": pickle.dumps(self.embedder)}
                )
            except Exception as exc:  # a lambda, an open handle: it stays in-process
                self._refuse(f"the embedder cannot be sent to a worker process ({exc})")
                return False
            self._started_at = now
            self.started = True
            self._where.clear()  # the new worker is sent all that waits (Embedding.send_ahead)
            self._worker = self._spawn(hello)
            return True

    def _spawn(self, hello: bytes) -> _Worker:
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        env = dict(os.environ)
        for name in _THREAD_ENV:
            env.setdefault(name, "1")
        try:
            proc = subprocess.Popen(  # noqa: S603  # our own module, our own interpreter
                [sys.executable, "-m", "streamrag.embed.ahead_worker", str(req_r), str(ans_w)],
                pass_fds=(req_r, ans_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(req_r)
            os.close(ans_w)
        if self.cpus:
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setaffinity(proc.pid, self.cpus)
        w = _Worker(proc, os.fdopen(req_w, "wb"), os.fdopen(ans_r, "rb"))
        w.outbox.put(hello)
        for name, target in (("send", self._send), ("receive", self._receive)):
            t = threading.Thread(
                target=target, args=(w,), name=f"streamrag-ahead-{name}", daemon=True
            )
            t.start()
            w.threads.append(t)
        log.info("embedding ahead in worker process %d", proc.pid)
        return w

    def _send(self, w: _Worker) -> None:
        """Write queued messages to the worker (a full pipe blocks this thread, not the job)."""
        try:
            while (body := w.outbox.get()) is not None:
                write_frame(w.requests, body)
        except OSError:  # the worker is gone: the receiver sees it end
            pass
        finally:
            with contextlib.suppress(OSError):
                w.requests.close()

    def _receive(self, w: _Worker) -> None:
        """Read the worker's answers; when it ends, fail what it still had."""
        decode = msgspec.msgpack.Decoder().decode
        try:
            while (frame := read_frame(w.answers)) is not None:
                self._answer(w, decode(frame))
        except (OSError, msgspec.DecodeError):
            log.exception("the embedding worker's answers could not be read")
        finally:
            self._gone(w)

    def _answer(self, w: _Worker, msg: dict[str, Any]) -> None:
        with self._cond:
            if "ready" in msg:
                if msg["ready"] != self.version or msg.get("dim") != self.dim:
                    self._refuse(
                        f"the worker's embedder is {msg['ready']!r} ({msg.get('dim')} dims), "
                        f"not {self.version!r} ({self.dim} dims)"
                    )
                    w.outbox.put(None)
                else:
                    w.ready = True
                self._cond.notify_all()
                return
            if "id" not in msg:  # before it was ready: it could not load the embedder
                self._refuse(f"the worker could not load the embedder: {msg.get('error')}")
                return
            req = self._inflight.pop(int(msg["id"]), None)
            if req is None:
                return
            if "error" in msg:
                req.failed = True  # the commit embeds these itself and isolates the bad text
            else:
                vectors = np.frombuffer(msg["vectors"], dtype=np.float32)
                req.vectors = vectors.reshape(len(req.texts), self.dim)
                req.seconds = float(msg.get("s", 0.0))
            req.done = True
            self._cond.notify_all()

    def _gone(self, w: _Worker) -> None:
        with self._cond:
            w.alive = False
            for req in self._inflight.values():
                req.done = req.failed = True
            self._inflight.clear()
            # Sent to it and lost: a later change with the same text sends it again.
            lost = [t for t, e in self._where.items() if e.req.failed]
            for text in lost:
                del self._where[text]
            self._cond.notify_all()
        w.outbox.put(None)
        with contextlib.suppress(OSError):
            w.answers.close()
        code = w.proc.wait()
        if not self._closed:
            log.warning("the embedding worker %d ended (exit %s)", w.proc.pid, code)

    def _refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why
            log.warning("embedding in-process: %s", why)

    # -- texts in, vectors out -----------------------------------------------------------

    def submit(self, texts: Sequence[str]) -> int:
        """Send ``texts`` to the worker to embed; returns how many it will embed for them.

        Nothing is sent while no worker is ready. A text held already (sent for
        another waiting change) is counted once more, not sent again. Texts
        beyond :attr:`limit` held are not sent: their commit embeds them in-process.
        """
        w = self._worker
        if not texts or w is None or not w.ready or not w.alive:
            return 0
        encode = msgspec.msgpack.encode
        where = self._where
        fresh: list[str] = []
        left_out = 0
        with self._cond:
            room = self.limit - len(where)
            for text in texts:
                entry = where.get(text)
                if entry is not None:
                    entry.refs += 1
                elif len(fresh) < room:
                    where[text] = _Entry(_NOT_YET, len(fresh))
                    fresh.append(text)
                else:
                    left_out += 1
            for lo in range(0, len(fresh), self.request_size):
                part = fresh[lo : lo + self.request_size]
                self._ids += 1
                req = self._inflight[self._ids] = _Request(self._ids, part)
                for row, text in enumerate(part):
                    entry = where[text]
                    entry.req, entry.row = req, row
                w.outbox.put(encode({"id": req.id, "texts": part}))
        return len(texts) - left_out

    def discard(self, texts: Sequence[str]) -> None:
        """Let go of ``texts``: their changes are committed (each text once per change)."""
        where = self._where
        with self._cond:
            for text in texts:
                entry = where.get(text)
                if entry is None:
                    continue
                entry.refs -= 1
                if entry.refs <= 0:
                    del where[text]

    def ready_for(self, texts: Sequence[str]) -> bool:
        """Whether the vectors of all ``texts`` are back from the worker."""
        where = self._where
        with self._cond:
            for text in texts:
                entry = where.get(text)
                if entry is None or not entry.req.done or entry.req.failed:
                    return False
        return True

    def take(self, texts: Sequence[str], timeout_s: float | None = None) -> Ahead | None:
        """The vectors of ``texts``, waiting for the worker if it has them under way.

        None when any of them was not sent, failed in the worker, or is not
        back within ``timeout_s``: the caller embeds them all itself. Texts stay
        held until :meth:`discard`.
        """
        where = self._where
        with self._cond:
            entries = [where.get(t) for t in texts]
            if not texts or any(e is None for e in entries):
                return self._taken(None, len(texts))
            reqs = {e.req for e in entries if e is not None}
            if not self._cond.wait_for(lambda: all(r.done for r in reqs), timeout_s):
                return self._taken(None, len(texts))
            if any(r.failed for r in reqs):
                return self._taken(None, len(texts))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        seconds = 0.0
        for req, (slots, rows) in _by_request(entries).items():
            assert req.vectors is not None  # done and not failed
            out[slots] = req.vectors[rows]
            seconds += req.seconds * len(rows) / len(req.texts)
        return self._taken(Ahead(out, seconds), len(texts))

    def _taken(self, got: Ahead | None, n: int) -> Ahead | None:
        if self.on_taken is not None and n:
            self.on_taken("ahead" if got is not None else "missed", n)
        return got

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker: it ends when its request pipe closes; killed after ``timeout_s``."""
        with self._cond:
            self._closed = True
            w, self._worker = self._worker, None
            self._where.clear()
        if w is None:
            return
        w.outbox.put(None)
        try:
            w.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        for t in w.threads:
            t.join(timeout_s)

    def __repr__(self) -> str:
        state = "ready" if self.ready else ("refused" if self.refused else "not ready")
        return f"EmbedAhead({self.version!r}, {state}, held={len(self._where)})"
