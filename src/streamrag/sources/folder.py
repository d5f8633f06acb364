"""A folder of documents, kept in step with the index: each file is one document.

The reader emits one record per *file version*: a new or changed file is an
upsert of the document whose id is its path relative to the folder (POSIX
style), a removed file is a delete, a rename is a delete of the old path and
an upsert of the new one. Reading only lists the folder on start, after the
watch was (re)installed or lost events, and every five minutes as a safety
net; otherwise it looks only at the paths the file-system watch reported
(:mod:`.watch`), so an idle job watching 10,000 files costs almost nothing.

**A record** is a one-line JSON header (:class:`FileHeader`: the path, upsert
or delete, size, modification time, and why the file could not be read, if it
could not), a newline, and the file's bytes. The header travels with the
bytes, so the decoder (:class:`streamrag.ingest.documents.DocumentDecoder`)
knows what it holds without looking at the folder again, and a file that
cannot be used (too large, unreadable, a corrupt PDF) is dead-lettered with its
path and position. The batch's ``keys`` hold the path and ``times`` the event time.

**Never half a file.** A file is read only once its modification and change
times are ``settle_ms`` old (by the injected clock), and only if its stat (size,
times, inode) is the same before, during and after the read; otherwise it is
kept in a set of unsettled paths and looked at again later, without a listing.
(A writer that pauses longer than ``settle_ms`` half-way is seen twice, each
time as the whole file it was then; writing to a temporary name — hidden and
``*.tmp`` names are excluded — and renaming it into place is atomic.)

**Partitions and offsets.** Each file is its own partition,
``folder:<name>:<relpath>``, and its offsets come from the file's change time
(``st_ctime_ns``, in steps of 10 ns): the kernel sets it on every write,
rename, ``chmod`` and ``utime``, and nobody can set it back, unlike the
modification time. A version whose change time is *c* is read at offset
``3c``; a delete after it is at ``3c+1``, so the resume position after it is
``3c+1`` (present) and ``3c+2`` (deleted). Three slots, not two, so that a
position tells the three states apart:

* ``3c`` — version *c* was waiting in the batcher at the last commit (the
  restart rewinds to it): read it again at ``3c`` if the file is unchanged, or
  its newer version, or delete the document at ``3c+1`` if the file is gone
  (the index may hold an older version of it);
* ``3c+1`` — version *c* is in the index: a newer change time is read, and a
  missing file is deleted at ``3c+1``;
* ``3c+2`` — the document is deleted: nothing to do until a file appears.

So after a crash, a record that was waiting comes back at the same offset when
the file is unchanged, and deletes made while the job was down are found by
the first listing. A file whose change time is not above the position is not
read again — it is the version the index has — except after a delete (an
``include`` pattern that matches again): that one is read at the next
multiple of three.

**Event times.** An upsert's is the file's modification time, except where
that would not put it after what the index may hold for the path (the index
keeps the newest event time per document, and a restored backup, ``cp -p``
or ``rsync -t`` bring old modification times): never above its change time
(a modification time in the future), at least 1 µs after the previous
version's change time, and the change time itself when the path was deleted
before (the delete was detected before the file came back). A delete's is the
time it was detected (the injected clock, less 20 ms for the file system's
coarse clock), at least 1 µs after the version it deletes. While the reader
runs, every record of a path is also at least 1 µs after the one before it. After
a restart the order rests on the change times alone: a file re-created after a
delete that was committed before the restart is newer than it as long as the
file system's clock is within those 20 ms of the job's (a network file system
whose server clock lags more could see such a file lose to its delete).

**Delivery and acknowledgement.** Exactly once, through the cursor: the
positions above are stored with each commit, and nothing outside streamrag is
acknowledged (a folder has no one to tell). A folder that is missing or
cannot be listed is reported in ``health()`` and retried with back-off; it
never deletes the documents (an unmounted drive is not an empty folder), and
neither does a subfolder that cannot be listed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import msgspec

from streamrag.sources.health import ConnectionHealth
from streamrag.timing import Clock, SystemClock, Timestamp, format_timestamp

if TYPE_CHECKING:
    from streamrag.config import FolderSourceSettings
    from streamrag.sources.base import RawBatch
    from streamrag.sources.watch import FolderWatch

__all__ = ["FileHeader", "FolderReader", "FolderSource", "decode_record", "encode_record"]

DEFAULT_INCLUDE = ("*.md", "*.txt", "*.html", "*.htm", "*.pdf", "*.docx", "*.json", "*.jsonl")
DEFAULT_EXCLUDE = (".*", "*~", "*.tmp", "*.swp")

NS_PER_STAMP = 10
"""Change times count in steps of 10 ns: offsets ``3 * stamp`` fit an int64 until year 2900."""

RESCAN_S = 300.0
"""The safety net: the folder is listed again this often, events or not."""

FALLBACK_SCAN_S = 2.0
"""While the folder cannot be watched, it is listed this often instead."""

CHECKS_PER_POLL = 2048
"""Files looked at in one poll (a stat each): a poll stays short; the rest comes next poll."""

WATCH_STEP_MS = 50
"""How often the watch looks at the kernel's events: files wait ``settle_ms`` anyway."""

CLOCK_SLACK_US = 20_000
"""Kernel file times lag the clock by up to one tick; a delete's time is lowered by this."""


class FileHeader(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The first line of a folder record: what the bytes after it are."""

    path: str
    """The path relative to the folder, POSIX style: the document id."""
    op: str = "upsert"
    """``upsert`` (the file's bytes follow) or ``delete`` (nothing follows)."""
    size: int = 0
    mtime_us: Timestamp = 0
    error: str | None = None
    """Why the file was not read (too large, permission denied): the decoder refuses it."""


_encode_header = msgspec.json.Encoder().encode
_decode_header = msgspec.json.Decoder(FileHeader).decode


def encode_record(header: FileHeader, body: bytes = b"") -> bytes:
    r"""One record: the header's JSON line, then the file's bytes.

    >>> encode_record(FileHeader(path="a.md", size=2), b"hi")
    b'{"path":"a.md","size":2}\nhi'
    """
    try:
        head = _encode_header(header)
    except UnicodeEncodeError:  # a name that is not UTF-8: refused by the decoder, not here
        shown = header.path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        head = _encode_header(FileHeader(path=shown, error=f"the file name {shown!r} is not UTF-8"))
    return head + b"\n" + body


def decode_record(line: bytes) -> tuple[FileHeader, bytes]:
    r"""The header and the bytes of a record; ``msgspec.DecodeError`` if it is not one.

    >>> decode_record(b'{"path":"a.md","op":"delete"}\n')
    (FileHeader(path='a.md', op='delete', size=0, mtime_us=0, error=None), b'')
    """
    head, _, body = line.partition(b"\n")
    return _decode_header(head), body


@dataclass(frozen=True, slots=True)
class FolderSource:
    """A folder of documents, read recursively (see the module docstring for the semantics).

    ``include`` and ``exclude`` are :mod:`fnmatch` patterns matched against each
    file's name and its relative path; ``exclude`` also skips folders (``.*``
    skips ``.git``). ``watch=False`` lists the folder on every poll instead of
    watching it (for small folders and tests). ``clock`` decides when a file has
    settled and stamps deletes (the system clock by default).
    """

    name: str
    path: Path
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    settle_ms: int = 500
    max_file_bytes: int = 50_000_000
    watch: bool = True
    clock: Clock | None = field(default=None, compare=False)

    @classmethod
    def from_settings(cls, spec: FolderSourceSettings) -> FolderSource:
        """The source a ``kind: folder`` entry of ``sources:`` describes."""
        return cls(
            name=spec.name,
            path=Path(spec.path),
            include=tuple(spec.include),
            exclude=tuple(spec.exclude),
            settle_ms=spec.settle_ms,
            max_file_bytes=spec.max_file_bytes,
        )

    @property
    def prefix(self) -> str:
        """What every partition of this source starts with."""
        return f"folder:{self.name}:"

    def owns(self, partition: str) -> bool:
        """Whether a partition (``folder:<name>:<relpath>``) is one of this folder's files."""
        return partition.startswith(self.prefix)

    def build(self, resume: Mapping[str, int] | None = None) -> FolderReader:
        """Open a reader at ``resume`` (partition → position), or at the start."""
        return FolderReader(self, {k: v for k, v in (resume or {}).items() if self.owns(k)})


@dataclass(slots=True)
class _Scan:
    """Where a listing stands: what it found, and the folders it could not read."""

    found: set[str] = field(default_factory=set)
    blind: list[str] = field(default_factory=list)


Key = tuple[int, int, int, int]
"""A file's identity for "has it changed": size, mtime_ns, ctime_ns, inode."""


def _key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class FolderReader:
    """Reads a folder's file versions as records (see the module docstring)."""

    def __init__(self, spec: FolderSource, resume: dict[str, int]) -> None:
        self.spec = spec
        self.root = Path(spec.path).absolute()
        self._real_root = self.root.resolve()
        self.clock = spec.clock or SystemClock()
        self._health = ConnectionHealth("folder", clock=self.clock, initial_s=0.5, max_s=30.0)
        self._prefix = spec.prefix
        self._pos: dict[str, int] = dict(resume)
        self._dirs: dict[str, int] = {}  # folder -> how many files under it the index may hold
        for part, pos in self._pos.items():
            if pos % 3 != 2:
                self._count_dirs(part[len(self._prefix) :], 1)
        self._seen: dict[str, Key] = {}  # rel -> stat of the version read (or found indexed)
        self._last: dict[str, Timestamp] = {}  # rel -> event time of its last record (this run)
        self._todo: dict[str, None] = {}  # rels to look at, in order
        self._unsettled: dict[str, tuple[Timestamp, int]] = {}  # rel -> (due, size)
        self._events: list[threading.Event] = []
        self._lock = threading.Lock()
        self._scanned_at: Timestamp | None = None
        self._scan_generation = -1
        self._last_file_error: str | None = None
        self.file_errors = 0
        self._watch: FolderWatch | None = None
        if spec.watch:
            from streamrag.sources.watch import FolderWatch

            self._watch = FolderWatch(
                self.root, step_ms=WATCH_STEP_MS, name=f"streamrag-watch-{spec.name}"
            )
            self._watch.start()

    # -- the reader protocol -----------------------------------------------------------

    def poll(self, max_bytes: int, *, final: bool = False) -> list[RawBatch]:
        """File versions that settled, and deletes, up to about ``max_bytes`` of files.

        ``final`` changes nothing: a file is a whole record once it has settled,
        and one still being written is not read, final or not.
        """
        with self._lock:  # status reads the state from another thread
            return self._poll(max_bytes)

    def _poll(self, max_bytes: int) -> list[RawBatch]:
        now = self.clock.now_us()
        self._gather(now)
        out: list[RawBatch] = []
        budget = max_bytes
        checks = 0
        while self._todo and checks < CHECKS_PER_POLL and (budget > 0 or not out):
            rel = next(iter(self._todo))
            del self._todo[rel]
            checks += 1
            got = self._check(rel, now)
            if got is not None:
                out.append(got)
                budget -= max(1, len(got.lines[0]))
        self._after_poll(now)
        return out

    def snapshot(self) -> dict[str, int]:
        """The position of every file's partition (see the module docstring)."""
        with self._lock:
            return dict(self._pos)

    def backlog_bytes(self) -> int:
        """Bytes of files known to have changed but not read yet (1 for a listing not done)."""
        with self._lock:
            pending = sum(size for _, size in self._unsettled.values()) + len(self._todo)
        listing = self._scanned_at is None and self._health.retries == 0  # not failed: due
        return pending + (1 if listing else 0)

    def watermark_input(self, partition: str) -> str:
        """All of a folder's files are one watermark input: the folder (``folder:NAME``)."""
        if partition.startswith(self._prefix):
            return self._prefix[:-1]
        return partition

    def wake_on(self, event: threading.Event) -> None:
        """Set ``event`` when the folder changes, when a file settles, and while work is left."""
        self._events.append(event)
        if self._watch is not None:
            self._watch.wake_on(event)

    def health(self) -> dict[str, Any]:
        """This folder's entry in ``/v1/status``."""
        watch = self._watch
        with self._lock:
            files = sum(1 for v in self._pos.values() if v % 3 != 2)
            unsettled, queued = len(self._unsettled), len(self._todo)
        return {
            self.spec.name: self._health.report(
                path=str(self.root),
                files=files,
                unsettled=unsettled,
                queued=queued,
                lag=self.backlog_bytes(),
                watching=watch is not None and watch.healthy,
                watch_error=None if watch is None else watch.error,
                last_scan=None if self._scanned_at is None else format_timestamp(self._scanned_at),
                file_errors=self.file_errors,
                last_error=self._health.last_error or self._last_file_error,
            )
        }

    def close(self) -> None:
        """Stop the watch thread."""
        if self._watch is not None:
            self._watch.stop()

    # -- which paths to look at --------------------------------------------------------

    def _gather(self, now: Timestamp) -> None:
        """Fill the to-do set: a listing when one is due, else the watch's paths."""
        for rel, (due, _) in list(self._unsettled.items()):
            if due <= now:
                del self._unsettled[rel]
                self._todo[rel] = None
        watch = self._watch
        changes = watch.take() if watch is not None else None
        if self._scan_due(now, rescan=bool(changes and changes.rescan)):
            self._full_scan(now)
        elif changes is not None:
            for path in changes.paths:
                self._changed(path)

    def _scan_due(self, now: Timestamp, *, rescan: bool) -> bool:
        if not self._health.due():
            return False  # the folder failed: back off
        if self._scanned_at is None or rescan or self._watch is None:
            return True
        watch = self._watch
        if not watch.healthy:
            return now - self._scanned_at >= FALLBACK_SCAN_S * 1e6
        return watch.generation != self._scan_generation or now - self._scanned_at >= RESCAN_S * 1e6

    def _full_scan(self, now: Timestamp) -> None:
        generation = self._watch.generation if self._watch is not None else 0
        try:
            if not self.root.is_dir():
                msg = f"folder {self.root} does not exist (or is not a folder)"
                raise FileNotFoundError(msg)
            scan = _Scan()
            self._walk(self.root, "", scan, top=True)
        except OSError as exc:
            self._health.failed(exc)  # no deletes: an unmounted folder is not an empty one
            return
        self._health.ok()
        self._scanned_at = now
        self._scan_generation = generation
        for rel in sorted(scan.found):
            self._todo[rel] = None
        prefix = self._prefix
        for part, pos in self._pos.items():
            rel = part[len(prefix) :]
            if pos % 3 != 2 and rel not in scan.found and not _under(rel, scan.blind):
                self._todo[rel] = None  # gone (or excluded now): the check deletes it

    def _walk(self, folder: Path, rel: str, scan: _Scan, *, top: bool = False) -> None:
        """List ``folder`` and below; files that match go to ``scan.found``."""
        stack = [(folder, rel)]
        while stack:
            here, at = stack.pop()
            try:
                entries = list(os.scandir(here))
            except OSError as exc:
                if top and here == folder:
                    raise
                scan.blind.append(at)
                self._file_error(at or ".", exc)
                continue
            for entry in entries:
                sub = f"{at}/{entry.name}" if at else entry.name
                if self._excluded(entry.name, sub) or not _utf8(sub, self):
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((Path(entry.path), sub))
                    elif entry.is_file() and self._included(entry.name, sub):
                        scan.found.add(sub)
                except OSError as exc:
                    self._file_error(sub, exc)

    def _changed(self, path: str) -> None:
        """One path the watch reported: a file to look at, or a folder to list."""
        rel = _relative(Path(path), self.root, self._real_root)
        if rel is None or not _utf8(rel, self):
            return
        if rel in ("", "."):
            if not self.root.is_dir():
                self._scanned_at = None  # the folder itself went: find out on the next poll
            return
        parts = rel.split("/")
        if any(self._excluded(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)):
            return
        full = self.root / rel
        if full.is_dir() and not full.is_symlink():
            scan = _Scan()
            self._walk(full, rel, scan)
            for sub in sorted(scan.found):
                self._todo[sub] = None
            self._under_gone(rel, keep=scan.found, blind=scan.blind)
            return
        self._todo[rel] = None
        if rel in self._dirs and not full.exists():
            self._under_gone(rel, keep=set(), blind=[])  # a folder that went

    def _under_gone(self, rel: str, *, keep: set[str], blind: list[str]) -> None:
        """Files held under folder ``rel`` that a listing of it did not find: look at them."""
        head = self._prefix + rel + "/"
        n = len(self._prefix)
        for part, pos in self._pos.items():
            if pos % 3 != 2 and part.startswith(head):
                sub = part[n:]
                if sub not in keep and not _under(sub, blind):
                    self._todo[sub] = None
        for sub in [r for r in self._unsettled if r.startswith(rel + "/")]:
            del self._unsettled[sub]
            self._todo[sub] = None

    def _excluded(self, name: str, rel: str) -> bool:
        return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in self.spec.exclude)

    def _included(self, name: str, rel: str) -> bool:
        return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in self.spec.include)

    def _wanted(self, rel: str) -> bool:
        parts = rel.split("/")
        if any(self._excluded(p, "/".join(parts[: i + 1])) for i, p in enumerate(parts)):
            return False
        return self._included(parts[-1], rel)

    # -- one file --------------------------------------------------------------------

    def _check(self, rel: str, now: Timestamp) -> RawBatch | None:
        """Look at one path: its new version, its delete, or nothing."""
        part = self._prefix + rel
        pos = self._pos.get(part)
        held = pos is not None and pos % 3 != 2
        try:
            st = os.stat(self.root / rel)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as exc:  # cannot even stat it (a folder without x): no delete, later
            self._file_error(rel, exc)
            return None
        if st is None and not self.root.is_dir():
            self._scanned_at = None  # the folder itself went: no deletes (see the docstring)
            return None
        if st is None or not stat.S_ISREG(st.st_mode) or not self._wanted(rel):
            self._seen.pop(rel, None)
            self._unsettled.pop(rel, None)
            return self._delete(part, rel, pos, now) if held else None
        key = _key(st)
        if self._seen.get(rel) == key:
            return None
        offset = 3 * (st.st_ctime_ns // NS_PER_STAMP)
        again = pos is not None and offset < pos
        if pos is not None and again:
            if pos % 3 != 2:
                self._seen[rel] = key  # the version the index has (or waits for)
                return None
            offset = pos + 1  # present again after a delete, not newer: next multiple of 3
        due = max(st.st_mtime_ns, st.st_ctime_ns) // 1000 + self.spec.settle_ms * 1000
        if now < due:
            self._unsettled[rel] = (due, st.st_size)
            return None
        header = FileHeader(path=rel, size=st.st_size, mtime_us=st.st_mtime_ns // 1000)
        body = b""
        if st.st_size > self.spec.max_file_bytes:
            header.error = (
                f"the file is {st.st_size:,} bytes, above max_file_bytes="
                f"{self.spec.max_file_bytes:,}; it was not read"
            )
        else:
            try:
                data = self._read_file(self.root / rel, key)
            except FileNotFoundError:
                self._todo[rel] = None  # it went while being read: look again
                return None
            except OSError as exc:  # permission denied and the like: a dead letter
                self._file_error(rel, exc)
                header.error = f"the file could not be read: {type(exc).__name__}: {exc}"
                data = b""
            if data is None:  # it changed while being read: not settled after all
                self._unsettled[rel] = (now + self.spec.settle_ms * 1000, st.st_size)
                return None
            body = data
        self._seen[rel] = key
        self._set_pos(part, rel, offset + 1)
        event = max(self._upsert_time(st, pos, now, again=again), self._last.get(rel, 0) + 1)
        self._last[rel] = event
        return self._batch(part, rel, offset, encode_record(header, body), event)

    def _read_file(self, path: Path, key: Key) -> bytes | None:
        """The whole file, or None if its stat moved before, during or after the read."""
        with open(path, "rb") as fh:
            if _key(os.fstat(fh.fileno())) != key:
                return None
            data = fh.read(key[0] + 1)
            if _key(os.fstat(fh.fileno())) != key:
                return None
        if len(data) != key[0] or _key(os.stat(path)) != key:
            return None  # grew, shrank, or was replaced by another file
        return data

    @staticmethod
    def _upsert_time(
        st: os.stat_result, pos: int | None, now: Timestamp, *, again: bool
    ) -> Timestamp:
        """The event time of a version (see "Event times" in the module docstring)."""
        mtime, ctime = st.st_mtime_ns // 1000, st.st_ctime_ns // 1000
        if pos is None:
            return min(mtime, ctime)
        before = _stamp_us(pos // 3)
        if again:  # present again after a delete, and not newer: after the delete, now
            return max(ctime, now, before + 2)
        if pos % 3 == 1:
            return max(min(mtime, ctime), before + 1)
        return max(ctime, before + 2)  # after a delete, or read again after a restart

    def _delete(self, part: str, rel: str, pos: int | None, now: Timestamp) -> RawBatch:
        assert pos is not None
        base = pos - pos % 3
        offset = base + 1
        self._set_pos(part, rel, base + 2)
        event = max(now - CLOCK_SLACK_US, _stamp_us(base // 3) + 1, self._last.get(rel, 0) + 1)
        self._last[rel] = event
        line = encode_record(FileHeader(path=rel, op="delete"))
        return self._batch(part, rel, offset, line, event)

    def _set_pos(self, part: str, rel: str, pos: int) -> None:
        was = self._pos.get(part)
        held, holds = was is not None and was % 3 != 2, pos % 3 != 2
        self._pos[part] = pos
        if held != holds:
            self._count_dirs(rel, 1 if holds else -1)

    def _count_dirs(self, rel: str, step: int) -> None:
        """Count a held file in each folder above it (so a removed folder is told from a file)."""
        at = rel.rfind("/")
        while at > 0:
            folder = rel[:at]
            n = self._dirs.get(folder, 0) + step
            if n > 0:
                self._dirs[folder] = n
            else:
                self._dirs.pop(folder, None)
            at = folder.rfind("/")

    def _batch(self, part: str, rel: str, offset: int, line: bytes, event: Timestamp) -> RawBatch:
        from streamrag.sources.base import RawBatch

        return RawBatch(
            part,
            [line],
            [offset],
            offset + 1,
            decoder=self.spec.name,
            keys=[rel.encode("utf-8", "surrogateescape")],
            times=[event],
        )

    def _file_error(self, rel: str, exc: Exception) -> None:
        self.file_errors += 1
        self._last_file_error = f"{rel}: {type(exc).__name__}: {exc}"[:500]

    def _after_poll(self, now: Timestamp) -> None:
        """Wake the job again while work is left, and when the next file settles."""
        if self._todo:
            for event in self._events:
                event.set()
        if self._unsettled and self._watch is not None:
            due = min(d for d, _ in self._unsettled.values())
            self._watch.wake_at(time.monotonic() + max(0, due - now) / 1e6)

    def files(self) -> list[str]:
        """The relative paths whose documents the index may hold now."""
        n = len(self._prefix)
        with self._lock:
            return sorted(part[n:] for part, pos in self._pos.items() if pos % 3 != 2)


def _utf8(rel: str, reader: FolderReader) -> bool:
    """Whether a name can be a document id (and a partition in the cursor); else it is skipped."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError as exc:
        reader._file_error(rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), exc)
        return False
    return True


def _relative(path: Path, *roots: Path) -> str | None:
    for root in roots:
        try:
            return PurePosixPath(path.relative_to(root)).as_posix()
        except ValueError:
            continue
    return None


def _stamp_us(stamp: int) -> Timestamp:
    return stamp * NS_PER_STAMP // 1000


def _under(rel: str, folders: list[str]) -> bool:
    return any(f == "" or rel == f or rel.startswith(f + "/") for f in folders)


def describe(header: FileHeader) -> str:
    """A header as JSON text, for a dead letter's ``raw``."""
    return json.dumps(msgspec.to_builtins(header), ensure_ascii=False)
