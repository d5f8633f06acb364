"""Changes pushed over HTTP or from Python: journaled first, then read like any source.

``POST /v1/documents``, :meth:`Service.upsert <streamrag.runtime.service.Service.upsert>`,
``delete`` and ``ingest`` do not hand changes to the pipeline directly. They
append them, as streamrag change lines, to a journal in ``<state_dir>/push/``
and fsync it before answering; the pipeline reads the journal like a JSONL
source, so its position is committed in the same write-ahead-log record as
the epoch it fed. An accepted change is therefore never lost by a crash and
never applied twice — the same guarantee as a file or a queue, with no file of
the user's to manage.

**Idempotency.** A change may carry an ``idempotency_key``. A key seen before
(within the journal files kept: the current one and the last few that are fully
committed) is not appended again: the answer counts it as a duplicate and
points at the first copy, so a client that retries after a timeout cannot
apply a change twice.

**Backpressure.** The journal holds at most ``max_backlog_bytes`` that the
pipeline has not read yet; beyond that a push is refused with
:class:`~streamrag.errors.OverloadedError` (HTTP 429 with ``Retry-After``),
so a fast writer cannot grow it without bound while the embedder is behind.

**Redaction.** The journal is a file of the job's state like any other, so
personal data is taken out before a change is written to it: each upsert goes
through the job's redactor under the ``push`` policy (:mod:`streamrag.ingest.pii`),
and the line keeps what was found as ``redactions`` (counts by entity type,
never values) for the epoch's audit record. A change the policy drops is
refused with the push, naming the types found — the client learns at once.
Counts a client sends are discarded.

**Visibility.** After each commit the reader tells the journal what is durable
(:class:`~streamrag.sources.base.AcknowledgesCommits`); a push that asked to
wait (``wait_for_commit``) returns the epoch that made its changes visible:
a query at that epoch or later sees them.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from streamrag.errors import OverloadedError, RequestError
from streamrag.ingest import Decoder
from streamrag.ingest.pii import Redactor
from streamrag.sources.base import RawBatch
from streamrag.sources.files import JsonlSource, JsonlSourceReader
from streamrag.timing import Clock, format_timestamp

__all__ = ["PushJournal", "PushReceipt", "PushSource"]

_PREFIX = "journal-"
_MAX_SHOWN = 5


class _Key(msgspec.Struct):
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class _Span:
    """Where one push landed: lines from ``start`` to ``end`` of ``file``."""

    file: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class PushReceipt:
    """What a push did: changes appended, duplicates skipped, and the epoch if it waited."""

    accepted: int
    duplicates: int
    committed: bool
    epoch: int | None = None
    span: _Span | None = None
    """Where the changes landed in the journal (to wait for them later)."""

    def to_json(self) -> dict[str, Any]:
        """The body of the HTTP answer."""
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "committed": self.committed,
            "epoch": self.epoch,
        }


class PushJournal:
    """The append-only journal of pushed changes (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        *,
        decoder: Decoder,
        clock: Clock,
        max_backlog_bytes: int = 64 << 20,
        rotate_bytes: int = 64 << 20,
        keep_files: int = 4,
        max_changes: int = 1000,
        epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        self.directory = Path(directory)
        self.epoch = epoch
        """The index's epoch, read right after a commit: the epoch that commit made."""
        self.decoder = decoder
        self.clock = clock
        self.max_backlog_bytes = max_backlog_bytes
        self.rotate_bytes = rotate_bytes
        self.keep_files = keep_files
        self.max_changes = max_changes
        self._lock = threading.Lock()
        self._committed = threading.Condition(self._lock)
        self._keys: dict[str, _Span] = {}
        self._sizes: dict[str, int] = {}
        self._read: dict[str, int] = {}
        self._durable: dict[str, int] = {}
        self._waiting: dict[str, list[int]] = {}
        self._epoch: int | None = None
        self._wake: threading.Event | None = None
        self._read_rate = 0.0
        self.redactor: Redactor | None = None
        """The job's redactor: upserts are redacted before they are journaled (None: off)."""
        self._open()

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        decode = msgspec.json.Decoder(_Key).decode
        for path in self._files():
            name, offset = str(path), 0
            with open(path, "rb") as fh:
                for line in fh:
                    end = offset + len(line)
                    if line.endswith(b"\n"):
                        try:
                            key = decode(line).idempotency_key
                        except msgspec.DecodeError:
                            key = None
                        if key is not None:
                            self._keys[key] = _Span(name, offset, end)
                    offset = end
            self._sizes[name] = offset
        if not self._sizes:
            self._sizes[str(self._name(1))] = 0

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob(f"{_PREFIX}*.jsonl"))

    def _name(self, n: int) -> Path:
        return self.directory / f"{_PREFIX}{n:08d}.jsonl"

    @property
    def source(self) -> PushSource:
        """The source the pipeline reads the journal through."""
        return PushSource(self)

    # -- writing -------------------------------------------------------------------

    def push(
        self,
        changes: Sequence[Mapping[str, Any]],
        *,
        wait_for_commit: bool = False,
        timeout_s: float = 30.0,
    ) -> PushReceipt:
        """Check, journal and fsync ``changes``; with ``wait_for_commit``, wait for the epoch.

        Raises :class:`RequestError` naming the bad changes (nothing is taken
        then), or :class:`OverloadedError` when the pipeline is too far behind.
        """
        if not changes:
            msg = "a push needs at least one change; send {'changes': [{...}, ...]}"
            raise RequestError(msg)
        if len(changes) > self.max_changes:
            msg = f"a push takes at most {self.max_changes} changes, got {len(changes)}"
            raise RequestError(msg)
        lines = self._check(changes)
        span, accepted, duplicates = self._append(lines)
        if not wait_for_commit:
            return PushReceipt(accepted, duplicates, self._is_durable(span), span=span)
        epoch = self.wait(span, timeout_s)
        return PushReceipt(accepted, duplicates, epoch is not None, epoch, span)

    def wait_for(self, receipt: PushReceipt, timeout_s: float) -> int | None:
        """The epoch once the changes of ``receipt`` are committed, or None after ``timeout_s``."""
        if receipt.span is None:
            return receipt.epoch
        return self.wait(receipt.span, timeout_s)

    def _check(self, changes: Sequence[Mapping[str, Any]]) -> list[tuple[str | None, bytes]]:
        """Each change as a journal line, validated as the pipeline will decode it."""
        now = format_timestamp(self.clock.now_us())
        out: list[tuple[str | None, bytes]] = []
        bad: list[str] = []
        encode = msgspec.json.encode
        for i, change in enumerate(changes):
            if not isinstance(change, Mapping):
                bad.append(f"change {i}: expected a JSON object, found {type(change).__name__}")
                continue
            record = dict(change)
            record.pop("redactions", None)  # only the journal says what it redacted
            record.setdefault("event_time", now)
            key = record.get("idempotency_key")
            if key is not None and (not isinstance(key, str) or not key.strip()):
                bad.append(f"change {i}: 'idempotency_key' must be a non-empty string")
                continue
            try:
                line = encode(record)
            except (TypeError, msgspec.EncodeError) as exc:
                bad.append(f"change {i}: not JSON-encodable ({exc})")
                continue
            _, letters = self.decoder.decode([RawBatch("push", [line], [0], len(line))])
            if letters:
                bad.append(f"change {i}: {letters[0].reason}")
                continue
            if self.redactor is not None and record.get("op", "upsert") != "delete":
                redacted = _redact(self.redactor, record)
                if isinstance(redacted, str):
                    bad.append(f"change {i}: {redacted}")
                    continue
                if redacted is not record:
                    line = encode(redacted)
            out.append((key, line))
        if bad:
            shown = "; ".join(bad[:_MAX_SHOWN])
            more = f" (and {len(bad) - _MAX_SHOWN} more)" if len(bad) > _MAX_SHOWN else ""
            msg = f"{len(bad)} of {len(changes)} changes cannot be taken, none was: {shown}{more}"
            raise RequestError(msg)
        return out

    def _append(self, lines: list[tuple[str | None, bytes]]) -> tuple[_Span, int, int]:
        with self._lock:
            fresh = [(k, line) for k, line in lines if k is None or k not in self._keys]
            duplicates = len(lines) - len(fresh)
            seen = [self._keys[k] for k, _ in lines if k is not None and k in self._keys]
            size = sum(len(line) + 1 for _, line in fresh)
            self._refuse_if_full(size)
            name = self._current(size)
            start = self._sizes[name]
            if fresh:
                data = b"".join(line + b"\n" for _, line in fresh)
                with open(name, "ab") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                offset = start
                for key, line in fresh:
                    end = offset + len(line) + 1
                    if key is not None:
                        self._keys[key] = _Span(name, offset, end)
                    offset = end
                self._sizes[name] = start + len(data)
            span = _Span(name, start, self._sizes[name])
            if not fresh and seen:  # all duplicates: visible when their first copies are
                span = max(seen, key=lambda s: (s.file, s.end))
        if fresh and self._wake is not None:
            self._wake.set()
        return span, len(fresh), duplicates

    def _refuse_if_full(self, size: int) -> None:
        unread = self.backlog_bytes_locked()
        if size and unread + size > self.max_backlog_bytes and unread > 0:
            rate = self._read_rate or 1.0
            retry = max(1, min(60, math.ceil(unread / max(rate, 1.0))))
            msg = (
                f"the pipeline has {unread:,} pushed bytes it has not read yet (bound "
                f"{self.max_backlog_bytes:,}); retry after {retry} s"
            )
            raise OverloadedError(msg, retry)

    def _current(self, size: int) -> str:
        name = max(self._sizes)
        if self._sizes[name] and self._sizes[name] + size > self.rotate_bytes:
            number = int(Path(name).stem[len(_PREFIX) :]) + 1
            name = str(self._name(number))
            self._sizes[name] = 0
        return name

    # -- reading and committing ----------------------------------------------------

    def backlog_bytes_locked(self) -> int:
        """Journaled bytes the pipeline has not read yet (call holding the lock)."""
        return sum(max(0, size - self._read.get(f, 0)) for f, size in self._sizes.items())

    def read_to(self, positions: Mapping[str, int], seconds: float, read: int) -> None:
        """The reader's positions after a poll that read ``read`` bytes in ``seconds``."""
        with self._lock:
            self._read.update(positions)
            if read and seconds > 0:
                rate = read / seconds
                self._read_rate = (
                    rate if not self._read_rate else 0.8 * self._read_rate + 0.2 * rate
                )

    def acknowledge(
        self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]
    ) -> None:
        """A commit made the journal durable up to ``positions`` (but ``waiting``)."""
        epoch = self.epoch()
        with self._lock:
            for name in self._sizes:
                if name in positions:
                    self._durable[name] = positions[name]
                    self._waiting[name] = sorted(waiting.get(name, ()))
            self._epoch = epoch
            self._committed.notify_all()
            self._forget_locked()

    def _is_durable(self, span: _Span) -> bool:
        with self._lock:
            return self._durable_locked(span)

    def _durable_locked(self, span: _Span) -> bool:
        if self._durable.get(span.file, 0) < span.end:
            return False
        return not any(span.start <= off < span.end for off in self._waiting.get(span.file, ()))

    def wait(self, span: _Span, timeout_s: float) -> int | None:
        """The epoch once ``span`` is committed, or None after ``timeout_s``."""
        with self._lock:
            ok = self._committed.wait_for(lambda: self._durable_locked(span), timeout=timeout_s)
            return self._epoch if ok else None

    def _forget_locked(self) -> None:
        """Delete fully committed journal files beyond the newest ``keep_files``."""
        names = sorted(self._sizes)
        for name in names[: max(0, len(names) - self.keep_files)]:
            done = self._durable.get(name, 0) >= self._sizes[name] and not self._waiting.get(name)
            if not done:
                break
            Path(name).unlink(missing_ok=True)
            del self._sizes[name]
            self._keys = {k: s for k, s in self._keys.items() if s.file != name}

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` whenever a push appends something."""
        self._wake = event

    def stats(self) -> dict[str, Any]:
        """The journal's entry in ``/v1/status``."""
        with self._lock:
            return {
                "kind": "push",
                "files": len(self._sizes),
                "unread_bytes": self.backlog_bytes_locked(),
                "max_backlog_bytes": self.max_backlog_bytes,
                "idempotency_keys": len(self._keys),
                "last_epoch": self._epoch,
            }


@dataclass(frozen=True, slots=True)
class PushSource:
    """The journal as a source: a JSONL directory that hears of each commit.

    Delivery: exactly once, like the JSONL tailer (the resume position is the
    byte offset in each journal file, committed with the epoch). After each
    commit the journal learns what is durable, which answers ``wait_for_commit``
    and lets it delete old files.
    """

    journal: PushJournal

    def owns(self, partition: str) -> bool:
        """The journal's files."""
        return Path(partition).parent == self.journal.directory

    def build(self, resume: Mapping[str, int] | None = None) -> PushReader:
        """A reader of the journal at ``resume``."""
        files = JsonlSource(self.journal.directory, glob=f"{_PREFIX}*.jsonl")
        return PushReader(self.journal, files.build(resume))


class PushReader:
    """Reads the journal; tells it what each commit made durable."""

    def __init__(self, journal: PushJournal, files: JsonlSourceReader) -> None:
        self.journal = journal
        self.files = files
        journal.read_to(files.snapshot(), 0.0, 0)

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """What has been pushed since the last poll."""
        started = self.journal.clock.now_us()
        out = self.files.poll(max_bytes, final=final)
        if out:
            read = sum(b.end_offset - b.offsets[0] for b in out if b.offsets)
            took = (self.journal.clock.now_us() - started) / 1e6
            self.journal.read_to(self.files.snapshot(), took, read)
        return out

    def committed(self, positions: Mapping[str, int], waiting: Mapping[str, Sequence[int]]) -> None:
        """Pass the commit on to the journal."""
        self.journal.acknowledge(positions, waiting)

    def wake_on(self, event: threading.Event) -> None:
        """A push wakes the job at once."""
        self.journal.wake_on(event)

    def health(self) -> dict[str, Any]:
        """The journal's state."""
        return {"push": self.journal.stats()}

    def snapshot(self) -> dict[str, int]:
        """Byte offset per journal file."""
        return self.files.snapshot()

    def backlog_bytes(self) -> int:
        """Pushed bytes not read yet."""
        return self.files.backlog_bytes()

    def close(self) -> None:
        """Nothing stays open."""
        self.files.close()


def changes_of(items: Iterable[Mapping[str, Any]], size: int) -> Iterable[list[Mapping[str, Any]]]:
    """``items`` in lists of at most ``size`` (the chunks :meth:`Service.ingest` pushes)."""
    chunk: list[Mapping[str, Any]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _redact(redactor: Redactor, record: dict[str, Any]) -> dict[str, Any] | str:
    """``record`` redacted under the ``push`` policy, or why the policy refuses it."""
    try:
        done = redactor.redact(record, "push")
    except Exception as exc:  # nothing unchecked reaches the journal
        return (
            f"the redaction failed ({type(exc).__name__}); the change was not taken, "
            "so nothing of it was stored unredacted"
        )
    if done.payload is None:
        return f"{done.reason or 'dropped by the redaction policy'}; it was not taken"
    return dict(done.payload) if done.counts else record
