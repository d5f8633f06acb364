"""Index generations: one index per embedding model, and the book that says which one serves.

Vectors of two models cannot be compared, so changing the embedding model
means a new index: a *generation*. Generation 1 is the index a job has always
had (``<state_dir>/index``); generation ``n > 1`` lives in
``<state_dir>/generations/<n>/index``. The *book* (``<state_dir>/generations.json``,
checksummed, written atomically) lists each generation with its embedder and
its state:

``serving``
    answers queries and receives the pipeline's commits (exactly one);
``building``
    being filled in the background from the serving generation's current
    documents (:mod:`.reindex`), while also receiving every live change;
``previous``
    the generation served before the last switch: it still receives every
    change, so a rollback to it is immediate, until it is dropped.

A job without a book has one generation, from its settings. The book's
embedder wins over ``embedder.*`` in the settings for a generation it lists:
its vectors were made by that model, and queries must be embedded by it.

**Every change reaches every generation.** A :class:`Mirror` runs inside each
commit of the serving generation, *before* it: it re-embeds the batch's new
chunks with the other generation's embedder (reusing its vectors of unchanged
chunks) and commits them there, with the same stream position. Because the
other generation commits first, it never lacks a batch the serving generation
holds: after a crash between the two, the pipeline resumes from the serving
generation's cursor and reads the batch again; the other generation finds it
holds those versions already (``wants``) and skips them.

**Queries read one generation.** :class:`Generation` embeds and searches with
one model and one index; the serving side pins one for both halves of a query,
so a switch between them cannot pair a query vector with another model's index.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from streamrag.changes import Op
from streamrag.embed.base import check_vectors
from streamrag.embed.choice import EmbedderChoice
from streamrag.embed.resilient import RetryPolicy, embed_resilient
from streamrag.errors import CorruptStateError, StateError
from streamrag.index.base import (
    CommitBatch,
    DocOp,
    SearchFilter,
    VectorIndex,
    merge_cursor,
)
from streamrag.index.hits import Hits
from streamrag.index.store import write_atomic

__all__ = ["BOOK_NAME", "Book", "Entry", "Generation", "Mirror", "index_home"]

BOOK_NAME = "generations.json"
_FORMAT = 1

State = Literal["serving", "building", "previous"]


def index_home(state_dir: Path, number: int) -> Path:
    """The directory whose ``index`` subdirectory holds generation ``number``."""
    return state_dir if number == 1 else state_dir / "generations" / str(number)


@dataclass
class Entry:
    """One generation in the book."""

    number: int
    state: State
    embedder: dict[str, Any] | None
    """``{"class": ..., "args": {...}}``; None: the settings' ``embedder``."""
    created_us: int
    version: str = ""
    """The embedder's version when the generation was made (shown in status)."""
    switch_when_built: bool = True
    """Serve it as soon as its backfill is done (kept across restarts)."""

    def to_json(self) -> dict[str, Any]:
        """The entry as the book stores it."""
        return {
            "number": self.number,
            "state": self.state,
            "embedder": self.embedder,
            "created_us": self.created_us,
            "version": self.version,
            "switch_when_built": self.switch_when_built,
        }


@dataclass
class Book:
    """Which generations exist, which one serves, and every switch made."""

    entries: list[Entry] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, state_dir: Path) -> Book | None:
        """The book in ``state_dir``, or None when the job has only ever had one generation."""
        path = state_dir / BOOK_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            body = doc["body"]
            ok = doc["sha256"] == _digest(body)
        except (ValueError, KeyError, TypeError):
            ok = False
        if not ok:
            detail = (
                "its checksum does not match (it says which index generation serves; removing "
                "it serves generation 1)"
            )
            raise CorruptStateError(path, detail)
        entries = [Entry(**e) for e in body["entries"]]
        return cls(entries, list(body.get("switches", [])))

    def save(self, state_dir: Path) -> None:
        """Write the book atomically (temp file, fsync, rename), with its checksum."""
        state_dir.mkdir(parents=True, exist_ok=True)
        body = {
            "format": _FORMAT,
            "entries": [e.to_json() for e in self.entries],
            "switches": self.switches,
        }
        data = json.dumps({"body": body, "sha256": _digest(body)}, indent=1)

        def write(tmp: str) -> None:
            Path(tmp).write_text(data)

        write_atomic(state_dir / BOOK_NAME, write)

    @property
    def serving(self) -> Entry:
        """The generation that answers queries."""
        return next(e for e in self.entries if e.state == "serving")

    def get(self, number: int) -> Entry:
        """The entry of generation ``number``."""
        for e in self.entries:
            if e.number == number:
                return e
        known = ", ".join(str(e.number) for e in self.entries)
        msg = f"there is no index generation {number}; the generations are {known}"
        raise StateError(msg)

    def others(self) -> list[Entry]:
        """The generations that are not serving (building or previous)."""
        return [e for e in self.entries if e.state != "serving"]

    def next_number(self) -> int:
        """The number a new generation gets."""
        return max((e.number for e in self.entries), default=1) + 1

    def drop(self, number: int, state_dir: Path) -> None:
        """Forget generation ``number`` and delete its files (never the serving one)."""
        entry = self.get(number)
        if entry.state == "serving":
            msg = f"generation {number} is serving queries; switch to another before dropping it"
            raise StateError(msg)
        self.entries.remove(entry)
        self.save(state_dir)
        home = index_home(state_dir, number)
        shutil.rmtree(home / "index" if number == 1 else home, ignore_errors=True)


def _digest(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(eq=False)
class Generation:
    """One index and the embedders whose vectors it holds: embed and search together."""

    number: int
    index: VectorIndex
    choice: EmbedderChoice
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by whoever commits to this index from outside the pipeline (mirror, backfill)."""

    @property
    def embedder(self) -> Any:
        """The generation's configured embedder."""
        return self.choice.primary

    @property
    def in_process(self) -> bool:
        """Its queries are embedded on this CPU with no I/O to wait on (no remote model)."""
        return self.choice.in_process

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Query vectors from this generation's model (its fallback while it fails), checked."""
        vectors, used = self.choice.embed_queries(texts)
        return check_vectors(vectors, len(texts), used.dim, "embedder")

    def search_many(
        self, vectors: npt.NDArray[np.float32], k: int, flt: SearchFilter
    ) -> tuple[int, list[Hits]]:
        """The top ``k`` of each query vector in one pinned epoch of this generation."""
        return self.index.search_many(vectors, k, flt)


class Mirror:
    """Copies each commit of the serving generation into another generation, first.

    Called by the committer with the batch it is about to commit and the
    cursor the serving index will hold after it (see the module docstring).
    """

    def __init__(
        self,
        target: Generation,
        *,
        source_cursor: Callable[[], dict[str, Any] | None],
        retry: RetryPolicy | None = None,
    ) -> None:
        self.target = target
        self.source_cursor = source_cursor
        self.retry = retry or RetryPolicy()
        self.commits = 0
        self.refused: dict[str, str] = {}
        """Documents the target's embedder refused, with the reason (shown in status)."""
        self._full_cursor_sent = False

    def __call__(self, batch: CommitBatch) -> None:
        """Commit ``batch``'s documents into the target generation, re-embedded."""
        target = self.target
        with target.lock:
            docs = [
                d
                for d in batch.docs
                if target.index.wants(d.tenant, d.doc_id, d.event_time, d.offset)
            ]
            copied = copy_docs(
                target,
                docs,
                batch.texts,
                batch.positions,
                batch.chunk_ids,
                batch.hashes,
                self.retry,
                self.refused,
            )
            cursor = batch.cursor
            if not self._full_cursor_sent:  # the first commit carries the whole position
                cursor = merge_cursor(self.source_cursor(), batch.cursor)
            target.index.commit(copied.batch(target.embedder.version, cursor))
            self._full_cursor_sent = True
            self.commits += 1


@dataclass
class Copied:
    """Documents and chunks ready to commit into a generation, with its vectors."""

    docs: list[DocOp]
    chunk_ids: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int32]
    texts: list[str]
    hashes: list[bytes]
    vectors: npt.NDArray[np.float32]

    def only(self, keep: Callable[[DocOp], bool]) -> Copied:
        """The documents ``keep`` accepts, with their chunks."""
        docs: list[DocOp] = []
        rows: list[int] = []
        for d in self.docs:
            if not keep(d):
                continue
            docs.append(_moved(d, len(rows)))
            if d.op == Op.UPSERT:
                rows.extend(range(d.first_chunk, d.first_chunk + d.n_chunks))
        return Copied(
            docs,
            self.chunk_ids[rows],
            self.positions[rows],
            [self.texts[r] for r in rows],
            [self.hashes[r] for r in rows],
            self.vectors[rows],
        )

    def batch(self, version: str, cursor: Mapping[str, Any] | None = None) -> CommitBatch:
        """The commit of these documents into a generation whose embedder is ``version``."""
        return CommitBatch(
            docs=self.docs,
            chunk_ids=self.chunk_ids,
            positions=self.positions,
            texts=self.texts,
            hashes=self.hashes,
            vectors=self.vectors,
            embedder_version=version,
            cursor=cursor,
        )


def copy_docs(
    target: Generation,
    docs: Sequence[DocOp],
    texts: Sequence[str],
    positions: Sequence[int] | npt.NDArray[np.int32],
    chunk_ids: Sequence[int] | npt.NDArray[np.int64],
    hashes: Sequence[bytes],
    retry: RetryPolicy,
    refused: dict[str, str],
    *,
    reuse_held: bool = True,
) -> Copied:
    """Re-embed ``docs``' chunks (rows of the given columns) for ``target``.

    Unchanged chunks take the vector the target holds for the same text (with
    ``reuse_held``: only while the caller holds the target's lock); a
    document with a chunk the target's embedder refuses is left out and noted
    in ``refused``. Raises :class:`~streamrag.errors.EmbedderError` when the
    target's embedder fails for every text (the caller retries later).
    """
    index = target.index
    out_docs, rows, reuse = _layout(index, docs, hashes, reuse_held=reuse_held)
    vectors = np.zeros((len(rows), index.dim), dtype=np.float32)
    if reuse:
        slots = list(reuse)
        vectors[slots] = index.vectors_at([reuse[s] for s in slots])
    todo = [s for s in range(len(rows)) if s not in reuse]
    bad: set[int] = set()
    if todo:
        out = embed_resilient(target.embedder, [texts[rows[s]] for s in todo], retry)
        vectors[todo] = out.vectors
        bad = {todo[j] for j in out.failed}
        for j, reason in out.failed.items():
            owner = _owner(out_docs, todo[j])
            if owner is not None:
                refused[f"{owner.tenant}/{owner.doc_id}"] = reason
    if bad:
        out_docs, keep = _without(out_docs, bad)
        vectors, rows = vectors[keep], [rows[s] for s in keep]
    return Copied(
        docs=out_docs,
        chunk_ids=np.asarray([chunk_ids[r] for r in rows], dtype=np.int64),
        positions=np.asarray([positions[r] for r in rows], dtype=np.int32),
        texts=[texts[r] for r in rows],
        hashes=[hashes[r] for r in rows],
        vectors=vectors,
    )


def _layout(
    index: VectorIndex, docs: Sequence[DocOp], hashes: Sequence[bytes], *, reuse_held: bool
) -> tuple[list[DocOp], list[int], dict[int, int]]:
    """Documents renumbered, the rows their chunks come from, and the slots the target holds."""
    out_docs: list[DocOp] = []
    rows: list[int] = []
    reuse: dict[int, int] = {}
    for d in docs:
        if d.op == Op.DELETE:
            out_docs.append(d)
            continue
        state = index.doc_state(d.tenant, d.doc_id) if reuse_held else None
        held = {}
        if state is not None and not state.deleted:
            held = dict(zip(state.hashes, state.rows, strict=True))
        first = len(rows)
        for r in range(d.first_chunk, d.first_chunk + d.n_chunks):
            if hashes[r] in held:
                reuse[len(rows)] = held[hashes[r]]
            rows.append(r)
        out_docs.append(_moved(d, first))
    return out_docs, rows, reuse


def _without(docs: list[DocOp], bad: set[int]) -> tuple[list[DocOp], list[int]]:
    """The documents none of whose chunks is in ``bad``, and the chunk slots they keep."""
    kept: list[DocOp] = []
    keep: list[int] = []
    for d in docs:
        span = range(d.first_chunk, d.first_chunk + d.n_chunks) if d.op == Op.UPSERT else ()
        if any(s in bad for s in span):
            continue
        kept.append(_moved(d, len(keep)) if d.op == Op.UPSERT else d)
        keep.extend(span)
    return kept, keep


def _moved(d: DocOp, first: int) -> DocOp:
    return msgspec.structs.replace(d, first_chunk=first)


def _owner(docs: Sequence[DocOp], slot: int) -> DocOp | None:
    for d in docs:
        if d.op == Op.UPSERT and d.first_chunk <= slot < d.first_chunk + d.n_chunks:
            return d
    return None
