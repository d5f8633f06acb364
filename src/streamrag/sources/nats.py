"""Read a NATS JetStream stream through a durable pull consumer.

The stream is one partition, ``nats:<name>:<stream>``, and a message's offset
is its *stream sequence*: assigned once by the server when the message is
stored, the same on every redelivery, strictly increasing. A batch's
``end_offset`` is the last sequence + 1, so the resume position of the
partition is "the next sequence to read".

nats-py is asyncio; the reader runs its event loop in a background thread
that keeps one pull request open at the server and moves each message into a
bounded queue as it arrives (bounded in messages and in bytes: nothing is
pulled while the queue is full, so backpressure reaches the server). ``poll``
only drains that queue, and never waits.

The pull loop issues the JetStream pull request (``$JS.API.CONSUMER.MSG.NEXT``)
itself instead of calling ``PullSubscription.fetch``: in nats-py 2.16 a
``fetch(batch, timeout)`` that has received its first message keeps waiting
for the rest of the batch until the timeout, so a trickle of live messages
would each wait up to the fetch timeout. With the request left open, the
server pushes each message the moment it is stored, and a new request is
sent as soon as the last one is used up or expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy

from streamrag.errors import ConfigError, SourceError
from streamrag.sources.base import RawBatch
from streamrag.sources.health import ConnectionHealth, redact

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.manager import JetStreamManager

    from streamrag.config import NatsSourceSettings

__all__ = ["NatsReader", "NatsSource"]

log = logging.getLogger("streamrag.sources.nats")

_EXPIRES_S = 5.0
"""How long one pull request waits at the server for messages before it expires."""
_INFO_EVERY_S = 1.0
"""How often the consumer's state (lag, acks pending) is asked for."""


@dataclass(frozen=True, slots=True)
class NatsSource:
    """A JetStream stream read by the durable pull consumer ``durable``; one partition.

    **Resume position.** The partition ``nats:<name>:<stream>`` is at the
    stream sequence of the next message to read (``end_offset`` = sequence + 1).
    streamrag's cursor in its write-ahead log is the resume position; the
    consumer's own state at the server is only a courtesy.

    **Delivery.** Messages are acknowledged only after the epoch that applied
    (or dead-lettered) them is committed: :meth:`NatsReader.committed` acks every
    message below the committed position that is not still waiting in the
    batcher. Until then the reader keeps the message (to ack it later), and a
    redelivery of a sequence it has already handed on — the consumer's
    ``ack_wait`` ran out while the record waited in the batcher — is never
    returned twice: it only replaces the kept message, or is acked at once if
    its sequence is committed already.

    **Restart.** A job that crashed leaves messages delivered but unacked at
    the consumer; JetStream would redeliver them only after ``ack_wait``, and
    messages the consumer delivered *after* them would not come back at all,
    while the restart must read from its oldest waiting sequence. So
    ``build(resume)`` checks the durable's state against the resume position
    ``R``: a durable with no acks pending that has delivered nothing at or past
    ``R`` is kept as it is (a clean stop, the common case: it continues at
    once); any other — unacked messages, delivered past ``R``, another subject
    filter, or missing — is deleted and created again with
    ``deliver_policy=by_start_sequence, opt_start_seq=R`` (a consumer's start
    cannot be updated in place, and the messages a dead client held cannot be
    nak'ed by anyone else). The restart is then prompt and exact: every message
    from ``R`` on comes again at once, at the same sequences. Without a resume
    position the durable is made to start at the beginning of the stream. The
    durable therefore belongs to one job: two jobs (or two readers of one spec
    at once) must not share it. The messages a restart reads again below the
    committed position, which the job skips, are acked with its next commit; an
    ack the server lost (it was killed before writing its consumer state) comes
    back as a redelivery after ``ack_wait`` and is acked at once.

    ``backlog_bytes`` is an estimate: the queued bytes plus the consumer's
    undelivered messages (refreshed every second) at their mean size. A stream
    has no end, so ``streamrag run --once`` over it stops at its first empty poll.

    A resume position past the end of the stream (the stream was deleted and
    made again) is a :class:`~streamrag.errors.SourceError`; one below the
    stream's first sequence (its limits dropped, or a purge removed, messages
    streamrag never read) is logged as an error, counted in health as
    ``expired`` (sequences, not all of them this source's when it filters a
    subject), and reading goes on from the first message there is.

    **Keys and times.** ``keys[i]`` is the message's ``key_header`` header when
    it has one (a producer of Debezium events puts the record key there, so a
    tombstone — an empty message — names the row it deletes), else its subject.
    ``times[i]`` is the time the server stored the message, in microseconds.

    Connection loss: nats-py reconnects by itself (``connected`` false meanwhile
    in health); if it gives up, the reader connects again after a back-off.
    Credentials come from the environment variables the settings name.
    """

    name: str
    stream: str
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    subject: str | None = None
    durable: str = "streamrag"
    decoder: str | None = None
    """The decoder its batches name (the source's name, when built from settings)."""
    user_env: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    key_header: str = "key"
    pull_batch: int = 256
    """Messages asked for in one pull request (at most; less when the queue is fuller)."""
    max_queue_messages: int = 4096
    max_queue_bytes: int = 16 << 20
    ack_wait_s: float = 60.0
    max_ack_pending: int = 50_000
    """Unacked messages the server lets out: above the batcher's and queue's bounds."""
    reconnect_attempts: int = 20
    """Reconnects nats-py tries (0.5 s apart) before the reader takes over with back-off."""

    @classmethod
    def from_settings(cls, spec: NatsSourceSettings) -> NatsSource:
        """The connector of a ``kind: nats`` entry of ``sources:``."""
        return cls(
            name=spec.name,
            stream=spec.stream,
            servers=tuple(spec.servers),
            subject=spec.subject,
            durable=spec.durable,
            decoder=spec.name,
            user_env=spec.user_env,
            password_env=spec.password_env,
            token_env=spec.token_env,
        )

    @property
    def partition(self) -> str:
        """The one partition of this source."""
        return f"nats:{self.name}:{self.stream}"

    def owns(self, partition: str) -> bool:
        """Whether ``partition`` is this source's."""
        return partition == self.partition

    def build(self, resume: Mapping[str, int] | None = None) -> NatsReader:
        """Connect (in the background) and read from ``resume[partition]``, or the start."""
        return NatsReader(self, (resume or {}).get(self.partition))


@dataclass(slots=True)
class _Entry:
    seq: int
    data: bytes
    key: bytes | None
    time_us: int


def _env(name: str | None, what: str, source: str) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name)
    if value is None:
        msg = (
            f"source {source!r}: the environment variable {name} (its {what}_env) is not set; "
            f"export the {what} there, or remove {what}_env from the settings"
        )
        raise ConfigError(msg)
    return value


def _ack_fields(reply: str) -> tuple[int, int, int]:
    """(stream sequence, stored at in µs, messages pending) from a JetStream reply subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>``, or
    the form with a domain and an account hash in front (and a token after).
    """
    t = reply.split(".")
    if len(t) == 9:
        return int(t[5]), int(t[7]) // 1000, int(t[8])
    if len(t) >= 11:
        return int(t[7]), int(t[9]) // 1000, int(t[10])
    msg = f"not a JetStream message: reply subject {reply!r}"
    raise SourceError(msg)


class NatsReader:
    """Drains what the background pull loop queued; acks what commits made durable."""

    def __init__(self, spec: NatsSource, resume: int | None) -> None:
        self._spec = spec
        self._part = spec.partition
        self._user = _env(spec.user_env, "user", spec.name)
        self._password = _env(spec.password_env, "password", spec.name)
        self._token = _env(spec.token_env, "token", spec.name)
        secrets = tuple(s for s in (self._password, self._token) if s)
        self.health_state = ConnectionHealth("nats", secrets=secrets)
        start = max(1, resume or 1)
        self._position: int | None = resume
        self._lock = threading.Lock()
        self._queue: deque[_Entry] = deque()
        self._queued_bytes = 0
        self._held: dict[int, Msg] = {}
        """Messages read and not acked yet, by stream sequence."""
        self._start = start
        self._fetched_to = start
        """Sequences below it were queued already: another delivery is a redelivery."""
        self._committed_to = start
        self._committed_waiting: frozenset[int] = frozenset()
        self._fatal: SourceError | None = None
        self._wake: threading.Event | None = None
        self._closing = threading.Event()
        self._starved = False
        self._avg_bytes = 256.0
        self.redelivered = 0
        self.acked = 0
        self.expired = 0
        self.recreated = 0
        """How often the durable was deleted and created again at the resume position."""
        self._info: dict[str, int] = {}
        self._nc: Client | None = None
        self._outstanding = 0
        self._pause_until = 0.0
        self._consumer_gone = False
        self._misses = 0
        self._ensured = False
        self._loop = asyncio.new_event_loop()
        self._kick = asyncio.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"streamrag-nats-{spec.name}", daemon=True
        )
        self._thread.start()

    # -- the job's side (any thread) --------------------------------------------

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """The queued messages, up to about ``max_bytes`` (at least one); never waits.

        ``final`` changes nothing: a message is always whole.
        """
        if self._fatal is not None:
            raise self._fatal
        lines: list[bytes] = []
        offsets: list[int] = []
        keys: list[bytes | None] = []
        times: list[int | None] = []
        size = 0
        with self._lock:
            queue = self._queue
            while queue and (not lines or size < max_bytes):
                e = queue.popleft()
                lines.append(e.data)
                offsets.append(e.seq)
                keys.append(e.key)
                times.append(e.time_us)
                size += len(e.data)
            if not lines:
                return []
            self._queued_bytes -= size
            self._position = offsets[-1] + 1
            starved, self._starved = self._starved, False
        if starved:
            self._call(self._kick.set)
        batch = RawBatch(
            self._part,
            lines,
            offsets,
            offsets[-1] + 1,
            decoder=self._spec.decoder,
            keys=keys,
            times=times,
        )
        return [batch]

    def snapshot(self) -> dict[str, int]:
        """The sequence after the last message returned (the resume position, before any)."""
        return {} if self._position is None else {self._part: self._position}

    def backlog_bytes(self) -> int:
        """Bytes queued, plus the consumer's undelivered messages at their mean size (estimate)."""
        with self._lock:
            queued = self._queued_bytes
        return queued + int(self._info.get("num_pending", 0) * self._avg_bytes)

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Ack every kept message below the committed position that is not waiting."""
        pos = positions.get(self._part)
        if pos is None:
            return
        wait = frozenset(waiting.get(self._part, ()))
        with self._lock:
            self._committed_to = max(self._committed_to, pos)
            self._committed_waiting = wait
            done = [s for s in self._held if s < pos and s not in wait]
            msgs = [self._held.pop(s) for s in done]
        if msgs:
            self._call(lambda: self._loop.create_task(self._ack(msgs)))

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` whenever a message is queued."""
        self._wake = event
        with self._lock:
            if self._queue:
                event.set()

    def health(self) -> dict[str, Any]:
        """The connector's entry in ``/v1/status`` (``lag``: messages not returned yet)."""
        with self._lock:
            queued, held = len(self._queue), len(self._held)
        info = self._info
        return {
            self._spec.name: self.health_state.report(
                lag=info.get("num_pending", 0) + queued,
                stream=self._spec.stream,
                durable=self._spec.durable,
                num_pending=info.get("num_pending"),
                num_ack_pending=info.get("num_ack_pending"),
                ack_floor=info.get("ack_floor"),
                queued=queued,
                unacked=held,
                acked=self.acked,
                redelivered=self.redelivered,
                recreated=self.recreated,
                expired=self.expired,
            )
        }

    def close(self) -> None:
        """Stop the pull loop and close the connection (unacked messages stay unacked)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._call(self._kick.set)
        self._thread.join(10)

    def _call(self, fn: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: so is the reader
            self._loop.call_soon_threadsafe(fn)

    # -- the loop thread ----------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _main(self) -> None:
        startup = True
        health = self.health_state
        while not self._closing.is_set():
            while not health.due() and not self._closing.is_set():
                await asyncio.sleep(0.05)
            if self._closing.is_set():
                break
            try:
                await self._session(startup)
            except SourceError as exc:
                self._fatal = exc
                health.failed(exc)
                log.error("%s: %s", self._spec.name, health.last_error)
                return
            except Exception as exc:  # a lost connection, a timeout: back off, connect again
                if self._closing.is_set():
                    break
                health.failed(exc)
                log.warning(
                    "%s: NATS connection failed (%s); reconnecting after a back-off",
                    self._spec.name,
                    health.last_error,
                )
            else:
                break
            startup = startup and not self._ensured

    async def _session(self, startup: bool) -> None:
        spec = self._spec
        self._ensured = False
        nc = await nats.connect(
            list(spec.servers),
            name=f"streamrag-{spec.name}",
            user=self._user,
            password=self._password,
            token=self._token,
            connect_timeout=2,
            reconnect_time_wait=0.5,
            max_reconnect_attempts=spec.reconnect_attempts,
            ping_interval=5,
            max_outstanding_pings=2,
            error_cb=self._on_error,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self._nc = nc
        try:
            jsm = nc.jsm()
            await self._ensure(jsm, startup)
            self._ensured = True
            self.health_state.ok()
            await self._pull(nc, jsm)
        finally:
            self._nc = None
            if not nc.is_closed:
                try:
                    await asyncio.wait_for(nc.close(), 5)
                except Exception:  # closing a broken connection: nothing left to do
                    log.debug("closing the NATS connection failed", exc_info=True)

    async def _ensure(self, jsm: JetStreamManager, startup: bool) -> None:
        """Make the durable deliver from the right sequence (see :class:`NatsSource`)."""
        spec = self._spec
        try:
            stream = await jsm.stream_info(spec.stream)
        except nats.js.errors.NotFoundError:
            msg = f"the JetStream stream {spec.stream!r} does not exist (yet)"
            raise ConnectionError(msg) from None
        first, last = stream.state.first_seq, stream.state.last_seq
        with self._lock:
            start = self._start if startup else min([*self._held, self._fetched_to])
        if startup and start > last + 1:
            msg = (
                f"source {spec.name!r}: the resume position is stream sequence {start}, but "
                f"stream {spec.stream!r} ends at {last}; the stream was deleted and made "
                "again. Delete the state directory to index the new stream from its start."
            )
            raise SourceError(msg)
        if startup and first > start and start <= last:  # dropped by its limits, or purged
            self.expired = first - start
            log.error(
                "%s: stream %s no longer holds sequences %d..%d, which streamrag had not "
                "read (its limits dropped them); reading on from %d",
                spec.name,
                spec.stream,
                start,
                first - 1,
                first,
            )
        try:
            info = await jsm.consumer_info(spec.stream, spec.durable)
        except nats.js.errors.NotFoundError:
            info = None
        if info is not None:
            same_filter = (info.config.filter_subject or None) == spec.subject
            delivered = info.delivered.stream_seq if info.delivered else 0
            clean = not info.num_ack_pending and delivered < start
            if same_filter and (clean or not startup):
                return
            await jsm.delete_consumer(spec.stream, spec.durable)
            self.recreated += 1
            log.info(
                "%s: durable %s recreated at sequence %d (it had %s unacked, delivered to %d)",
                spec.name,
                spec.durable,
                start,
                info.num_ack_pending,
                delivered,
            )
        await jsm.add_consumer(
            spec.stream,
            ConsumerConfig(
                durable_name=spec.durable,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=spec.ack_wait_s,
                max_deliver=-1,
                max_ack_pending=spec.max_ack_pending,
                filter_subject=spec.subject,
                replay_policy=ReplayPolicy.INSTANT,
            ),
        )

    async def _pull(self, nc: Client, jsm: JetStreamManager) -> None:
        spec = self._spec
        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=self._on_msg)
        api = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._outstanding = 0
        deadline = 0.0
        next_info = 0.0
        self._consumer_gone = False
        while not self._closing.is_set():
            if nc.is_closed:
                msg = "the NATS client gave up reconnecting"
                raise ConnectionError(msg)
            if self._consumer_gone:
                msg = f"the durable {spec.durable!r} was deleted at the server"
                raise ConnectionError(msg)
            now = time.monotonic()
            if nc.is_connected and now >= self._pause_until:
                if self._outstanding <= 0 or now > deadline:
                    batch = self._room()
                    if batch > 0:
                        body = {"batch": batch, "expires": int(_EXPIRES_S * 1e9)}
                        await nc.publish(api, json.dumps(body).encode(), reply=inbox)
                        self._outstanding = batch
                        deadline = now + _EXPIRES_S + 1.0
                if now >= next_info:
                    next_info = now + _INFO_EVERY_S
                    await self._refresh(jsm)
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), 0.25)

    def _room(self) -> int:
        spec = self._spec
        with self._lock:
            free = spec.max_queue_messages - len(self._queue)
            free_bytes = spec.max_queue_bytes - self._queued_bytes
            if free <= 0 or free_bytes <= 0:
                self._starved = True
                return 0
        return max(1, min(spec.pull_batch, free, int(free_bytes // max(1.0, self._avg_bytes))))

    async def _refresh(self, jsm: JetStreamManager) -> None:
        spec = self._spec
        try:
            info = await jsm.consumer_info(spec.stream, spec.durable, timeout=2)
        except nats.js.errors.NotFoundError:
            # A server that just restarted may not have recovered its consumers yet.
            self._misses += 1
            self._consumer_gone = self._misses >= 3
            return
        except (TimeoutError, nats.errors.Error) as exc:
            self._note(exc)
            return
        self._misses = 0
        self._info = {
            "num_pending": info.num_pending or 0,
            "num_ack_pending": info.num_ack_pending or 0,
            "ack_floor": info.ack_floor.stream_seq if info.ack_floor else 0,
        }

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status")
        if status:
            if status == "100":  # heartbeat or flow control
                return
            desc = headers.get("Description", "")
            if status == "409" and "deleted" in desc.lower():
                self._consumer_gone = True
            elif status not in ("404", "408"):  # 409 max ack pending, leadership change ...
                self._pause_until = time.monotonic() + 0.05
            self._outstanding = 0
            self._kick.set()
            return
        self._outstanding -= 1
        if self._outstanding <= 0:
            self._kick.set()
        try:
            seq, time_us, pending = _ack_fields(msg.reply)
        except (SourceError, ValueError):
            log.warning("%s: ignored a message that is not from JetStream", self._spec.name)
            return
        self._accept(msg, seq, time_us, pending)

    def _accept(self, msg: Msg, seq: int, time_us: int, pending: int) -> None:
        data = msg.data or b""
        ack_now = False
        with self._lock:
            if seq < self._fetched_to:  # delivered again: never returned twice
                self.redelivered += 1
                if seq < self._committed_to and seq not in self._committed_waiting:
                    self._held.pop(seq, None)
                    ack_now = True
                else:
                    self._held[seq] = msg  # the newest delivery is the one to ack
            else:
                self._fetched_to = seq + 1
                self._held[seq] = msg
                key = (msg.headers or {}).get(self._spec.key_header)
                self._queue.append(
                    _Entry(seq, data, (key or msg.subject).encode(), time_us),
                )
                self._queued_bytes += len(data)
                self._avg_bytes += (len(data) - self._avg_bytes) / 64
                self._info["num_pending"] = pending
        if ack_now:
            self._loop.create_task(self._ack([msg]))
        elif self._wake is not None:
            self._wake.set()

    async def _ack(self, msgs: list[Msg]) -> None:
        failed: list[Msg] = []
        nc = self._nc
        for m in msgs:
            try:
                if nc is None or nc.is_closed:
                    failed.append(m)
                    continue
                await nc.publish(m.reply, b"")
                self.acked += 1
            except Exception as exc:  # kept: the next commit acks it again
                self._note(exc)
                failed.append(m)
        if failed:
            with self._lock:
                for m in failed:
                    seq = _ack_fields(m.reply)[0]
                    self._held.setdefault(seq, m)

    def _note(self, exc: BaseException) -> None:
        h = self.health_state
        h.last_error = redact(f"{type(exc).__name__}: {exc}", h.secrets)[:500]
        h.last_error_at = h.clock.now_us()

    async def _on_error(self, exc: Exception) -> None:
        self._note(exc)

    async def _on_disconnected(self) -> None:
        self.health_state.failed(ConnectionError("disconnected from the NATS server"))

    async def _on_reconnected(self) -> None:
        self.health_state.ok()
        self._outstanding = 0  # the open pull request may be gone with the old connection
        self._kick.set()
