"""Persistence of the LSM index: checkpoints, and opening a directory again.

Each commit is appended to the write-ahead log (:mod:`.wal`) and fsynced before
it is published (:mod:`.lsm_writer`). A checkpoint of epoch E writes what the
log would otherwise have to replay — segment files, the stamps, the deletes,
each epoch's newest event time and the cursor (:mod:`.store`) — then its
manifest (:mod:`.checkpoint`), and drops the log it covers and the files no
manifest names any more. Checkpoints run on the maintenance thread after seals
and compactions and every ``checkpoint_every`` commits.

Opening a directory loads the newest manifest, checking every file against the
size and CRC-32 it lists, and replays the log after it; so a crash at any point
loses nothing that was committed. A damaged ANN graph is not fatal: it is built
again, and its segment is searched exactly meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import CorruptStateError, ForeignFileError, IndexStoreError
from streamrag.index.ann import load_hnsw
from streamrag.index.base import merge_cursor
from streamrag.index.checkpoint import CheckpointManifest, SegmentEntry
from streamrag.index.lsm_writer import LsmWriter
from streamrag.index.manifest import Manifest
from streamrag.index.segment import NEVER, Segment
from streamrag.index.store import (
    file_checksum,
    read_cursor,
    read_manifest,
    read_rows,
    read_table,
    verify_file,
    write_atomic,
    write_cursor,
    write_manifest,
    write_rows,
    write_table,
)
from streamrag.index.wal import WriteAheadLog
from streamrag.timing import MIN_TIMESTAMP

__all__ = ["LsmPersistence"]

log = logging.getLogger("streamrag.index")

I64 = npt.NDArray[np.int64]


class LsmPersistence(LsmWriter):
    """Checkpoints to, and opening from, the index's directory."""

    def _write_segment(self, seg: Segment) -> None:
        assert self._path is not None
        name = f"seg-{seg.id:08d}.arrow"
        write_rows(self._path / name, seg.take(np.arange(seg.n)))
        self._sums[name] = file_checksum(self._path / name)
        seg.file = name
        if seg.ann is not None:
            self._write_ann(seg)

    def _write_ann(self, seg: Segment) -> None:
        assert self._path is not None
        assert seg.ann is not None
        save = getattr(seg.ann, "save", None)
        if save is None:
            return  # IVF-PQ structures are rebuilt on open (minutes, in the background)
        name = f"seg-{seg.id:08d}.{seg.ann.kind}"
        write_atomic(self._path / name, save)
        self._sums[name] = file_checksum(self._path / name)
        seg.ann_file = name

    def checkpoint(self) -> int | None:
        """Write the latest epoch to disk and drop the log it covers; returns the epoch."""
        if self._path is None:
            return None
        path = self._path
        with self._maint:
            with self._lock:
                man = self._manifest
                epoch = man.epoch
                wal = self._wal
                assert wal is not None
                if wal.current is None or wal.current.name != f"wal-{epoch + 1:012d}.log":
                    wal.start(epoch + 1)
                deletes = list(self._deletes)
                cursor = self._cursor
                epoch_high = self._epoch_high[: epoch + 1].copy()
                head = self._manifest_head(man)
                self._dirty = 0
                self._needs_checkpoint = False
            keep = {wal.current.name if wal.current else ""}
            segments, stamps = self._write_segments(man, keep)
            tables: dict[str, dict[str, Any]] = {
                "stamps": stamps,
                "deletes": _deletes_table(deletes),
                "epochs": {"high": epoch_high},
            }
            files: dict[str, str] = {}
            for name, columns in tables.items():
                files[name] = self._write_file(
                    f"{name}-{epoch:012d}.arrow", keep, write_table, columns
                )
            if cursor is not None:
                cname = f"cursor-{epoch:012d}.msgpack"
                files["cursor"] = self._write_file(cname, keep, write_cursor, cursor)
            # Every file the manifest names, with its size and CRC-32: checked on open.
            sums = {n: self._sums[n] for n in sorted(keep) if n in self._sums}
            self._sums = {n: self._sums[n] for n in keep if n in self._sums}
            manifest = CheckpointManifest(
                **head,
                stamps=files["stamps"],
                deletes=files["deletes"],
                epochs=files["epochs"],
                cursor=files.get("cursor"),
                files=sums,
                segments=tuple(segments),
            )
            mname = f"manifest-{epoch:012d}.json"
            write_manifest(path / mname, manifest.to_body())
            keep.add(mname)
            self._checkpoint_epoch = epoch
            self._prune(keep)
            wal.drop_before(wal.current)
        return epoch

    def _manifest_head(self, man: Manifest) -> dict[str, Any]:
        """The manifest's fields that the writer's state gives (under the writer lock)."""
        return {
            "epoch": man.epoch,
            "parent": man.parent,
            "restored_from": man.restored_from,
            "dim": self._dim,
            "history": self._spec.history,
            "next_rid": self._next_rid,
            "next_segment": self._next_seg,
            "high": self._high,
            "compacted_floor": self._compacted_floor,
            "rolled_back": self._rolled_back,
            "compactions": self._compactions,
            "last_compaction_us": self._last_compaction_us,
            "committed_at_us": man.stats.committed_at_us,
        }

    def _write_segments(
        self, man: Manifest, keep: set[str]
    ) -> tuple[list[SegmentEntry], dict[str, I64]]:
        """Each segment's file (written unless it is already), and the stamps table.

        A sealed segment is written once; a growing one as its rows so far. The
        stamps are those as of the manifest's epoch: later ones are in the log.
        (A kill always follows its row's first stamp, so sup ≤ dead.)
        """
        assert self._path is not None
        epoch = man.epoch
        segments: list[SegmentEntry] = []
        stamps: dict[str, list[I64]] = {"rid": [], "sup": [], "valid_to": [], "dead": []}
        for view in man.views:
            seg, n = view.segment, view.rows
            sealed = seg.sealed and n == seg.n
            name = self._segment_file(seg, n, sealed)
            keep.add(name)
            if seg.ann_file:
                keep.add(seg.ann_file)
            segments.append(
                SegmentEntry(seg.id, n, name, sealed, seg.ann_file if seg.sealed else None)
            )
            loc = np.flatnonzero(seg.sup[:n] <= epoch)
            stamps["rid"].append(seg.rids[loc])
            stamps["sup"].append(seg.sup[loc])
            stamps["valid_to"].append(seg.valid_to[loc])
            dead = seg.dead[loc]
            stamps["dead"].append(np.where(dead <= epoch, dead, NEVER))
        table = {k: np.concatenate([np.zeros(0, np.int64), *v]) for k, v in stamps.items()}
        return segments, table

    def _segment_file(self, seg: Segment, n: int, sealed: bool) -> str:
        """The file holding the segment's first ``n`` rows, written if it is not yet."""
        assert self._path is not None
        if sealed:
            if seg.file is None:
                self._write_segment(seg)
            elif seg.ann is not None and seg.ann_file is None:
                self._write_ann(seg)
            assert seg.file is not None
            return seg.file
        name = f"grow-{seg.id:08d}-{n}.arrow"
        if name not in self._sums or not (self._path / name).exists():
            write_rows(self._path / name, seg.take(np.arange(n)))
            self._sums[name] = file_checksum(self._path / name)
        return name

    def _write_file(
        self, name: str, keep: set[str], write: Callable[[Path, Any], None], value: Any
    ) -> str:
        """Write one file of the checkpoint and note its size and CRC-32; returns its name."""
        assert self._path is not None
        write(self._path / name, value)
        self._sums[name] = file_checksum(self._path / name)
        keep.add(name)
        return name

    def _prune(self, keep: set[str]) -> None:
        """Delete the files no manifest names any more (the log drops its own)."""
        assert self._path is not None
        for p in self._path.iterdir():
            if p.name not in keep and not p.name.startswith("wal-"):
                with contextlib.suppress(OSError):
                    p.unlink()

    def _open(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        for candidate in sorted(path.glob("manifest-*.json"), reverse=True):
            self._load_checkpoint(
                path, CheckpointManifest.from_body(read_manifest(candidate), candidate)
            )
            break
        self._wal = WriteAheadLog(path, fsync=self._spec.wal_fsync)
        replayed = 0
        for rec in self._wal.replay(self._manifest.epoch):
            if rec.batch.vectors.shape[1:] not in ((self._dim,), (0,)):
                msg = (
                    f"the index in {path} holds {rec.batch.vectors.shape[1]}-dimensional "
                    f"vectors but this index is {self._dim}-dimensional; point state_dir "
                    f"elsewhere or delete {path}"
                )
                raise IndexStoreError(msg)
            self._apply(rec.batch, rec.epoch, rec.committed_at_us)
            self._cursor = merge_cursor(self._cursor, rec.batch.cursor)
            replayed += 1
        self._dirty = replayed
        self._wal.start(self._manifest.epoch + 1)
        if replayed:
            log.info("index %s: replayed %d commits from the write-ahead log", path, replayed)

    def _load_checkpoint(self, path: Path, body: CheckpointManifest) -> None:
        if body.dim != self._dim:
            msg = (
                f"the index in {path} holds {body.dim}-dimensional vectors but the embedder "
                f"makes {self._dim}; point state_dir elsewhere or delete {path} to start over"
            )
            raise IndexStoreError(msg)
        self._next_rid = body.next_rid
        self._next_seg = body.next_segment
        self._reserve_rids(self._next_rid)
        sums = body.files

        def checked(name: str) -> Path:
            """The file, once its size and CRC-32 match the manifest's (raises if not)."""
            verify_file(path / name, sums.get(name))
            if name in sums:
                self._sums[name] = sums[name]
            return path / name

        for entry in body.segments:
            self._load_segment(entry, checked)
        self._load_stamps(read_table(checked(body.stamps)))
        deletes = read_table(checked(body.deletes))
        self._deletes = list(
            zip(
                deletes["tenant"],
                deletes["doc_id"],
                deletes["event_time"].tolist(),
                deletes["offset"].tolist(),
                deletes["epoch"].tolist(),
                strict=True,
            )
        )
        highs = read_table(checked(body.epochs))["high"]
        self._epoch_high = np.full(max(1024, highs.size * 2), MIN_TIMESTAMP, np.int64)
        self._epoch_high[: highs.size] = highs
        self._high = body.high
        self._compacted_floor = body.compacted_floor
        self._rolled_back = tuple((int(a), int(b)) for a, b in body.rolled_back)
        self._compactions = body.compactions
        self._last_compaction_us = body.last_compaction_us
        self._checkpoint_epoch = body.epoch
        if body.cursor:
            self._cursor = read_cursor(checked(body.cursor))
        self._rebuild_docs()
        self._manifest = self._make_manifest(
            body.epoch, body.parent, body.committed_at_us, body.restored_from
        )

    def _load_segment(self, entry: SegmentEntry, checked: Callable[[str], Path]) -> None:
        """One segment of the manifest, with its ANN graph when one was saved and is sound."""
        rows = read_rows(checked(entry.file), self._dim)
        seg = Segment.from_rows(
            entry.id,
            rows,
            sealed=entry.sealed,
            capacity=0 if entry.sealed else self._spec.seal_rows,
        )
        if entry.sealed:
            seg.file = entry.file
            if entry.ann:
                self._load_ann(seg, entry.ann, checked)
        elif self._growing is None or self._growing.id < seg.id:
            # One growing segment (format 1 had one per day: the others are sealed).
            if self._growing is not None:
                self._growing.seal()
            self._growing = seg
        else:
            seg.seal()
        self._segments[seg.id] = seg
        self._rid_seg[rows.rids] = seg.id
        self._rid_row[rows.rids] = np.arange(seg.n)

    def _load_ann(self, seg: Segment, name: str, checked: Callable[[str], Path]) -> None:
        try:
            ann_path = checked(name)
        except CorruptStateError as exc:
            # Rebuilt from the segment's vectors; searched exactly meanwhile.
            log.warning("%s; its graph will be built again", exc.args[0])
            return
        try:
            seg.ann = load_hnsw(str(ann_path), seg.vectors[: seg.n], self._spec.ann)
        except ForeignFileError as exc:
            # Built again by the maintenance thread, and written by the next checkpoint.
            log.warning("%s; it will be built again in the background", exc.args[0])
            return
        if seg.ann is None:
            self._failed_ann.add(seg.id)
        else:
            seg.ann_file = name

    def _load_stamps(self, stamps: dict[str, I64]) -> None:
        """Put the checkpoint's stamps back on the rows they belong to."""
        rids = stamps["rid"]
        if not rids.size:
            return
        dead = stamps.get("dead")
        if dead is None:  # format 1: a row a rollback undid carries sup == created
            created = np.empty_like(rids)
            for sid, seg in self._segments.items():
                sel = self._rid_seg[rids] == sid
                created[sel] = seg.created[self._rid_row[rids[sel]]]
            dead = np.where(stamps["sup"] == created, created, NEVER)
        segs = self._rid_seg[rids]
        local = self._rid_row[rids]
        for sid in np.unique(segs).tolist():
            sel = segs == sid
            seg = self._segments[sid]
            seg.sup[local[sel]] = stamps["sup"][sel]
            seg.valid_to[local[sel]] = stamps["valid_to"][sel]
            seg.dead[local[sel]] = dead[sel]
            seg.refresh_bounds()


def _deletes_table(deletes: list[tuple[str, str, int, int, int]]) -> dict[str, Any]:
    """The delete log as the columns of its Arrow file."""
    return {
        "tenant": [d[0] for d in deletes],
        "doc_id": [d[1] for d in deletes],
        "event_time": np.asarray([d[2] for d in deletes], np.int64),
        "offset": np.asarray([d[3] for d in deletes], np.int64),
        "epoch": np.asarray([d[4] for d in deletes], np.int64),
    }
