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
from pathlib import Path
from typing import Any

import numpy as np

from streamrag.errors import CorruptStateError, IndexStoreError
from streamrag.index.ann import (
    load_hnsw,
)
from streamrag.index.base import (
    merge_cursor,
)
from streamrag.index.lsm_writer import LsmWriter
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

log = logging.getLogger("streamrag.index")


__all__ = ["LsmPersistence"]


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
                meta: dict[str, Any] = {
                    "epoch": epoch,
                    "parent": man.parent,
                    "restored_from": man.restored_from,
                    "dim": self._dim,
                    "history": self._spec.history,
                    "next_rid": self._next_rid,
                    "next_segment": self._next_seg,
                    "high": self._high,
                    "compacted_floor": self._compacted_floor,
                    "rolled_back": [list(r) for r in self._rolled_back],
                    "compactions": self._compactions,
                    "last_compaction_us": self._last_compaction_us,
                    "committed_at_us": man.stats.committed_at_us,
                }
                self._dirty = 0
                self._needs_checkpoint = False
            segments = []
            keep = {wal.current.name if wal.current else ""}
            stamp_rids, stamp_sup, stamp_vt, stamp_dead = [], [], [], []
            for view in man.views:
                seg, n = view.segment, view.rows
                if seg.sealed and n == seg.n:
                    if seg.file is None:
                        self._write_segment(seg)
                    elif seg.ann is not None and seg.ann_file is None:
                        self._write_ann(seg)
                    name = seg.file
                else:
                    name = f"grow-{seg.id:08d}-{n}.arrow"
                    if name not in self._sums or not (path / name).exists():
                        write_rows(path / name, seg.take(np.arange(n)))
                        self._sums[name] = file_checksum(path / name)
                assert name is not None
                keep.add(name)
                if seg.ann_file:
                    keep.add(seg.ann_file)
                segments.append(
                    {
                        "id": seg.id,
                        "rows": n,
                        "file": name,
                        "sealed": seg.sealed and n == seg.n,
                        "ann": seg.ann_file if seg.sealed else None,
                    }
                )
                # Stamps as of the checkpoint's epoch: later ones are in the log.
                # (A kill always follows its row's first stamp, so sup ≤ dead.)
                loc = np.flatnonzero(seg.sup[:n] <= epoch)
                stamp_rids.append(seg.rids[loc])
                stamp_sup.append(seg.sup[loc])
                stamp_vt.append(seg.valid_to[loc])
                dead = seg.dead[loc]
                stamp_dead.append(np.where(dead <= epoch, dead, NEVER))
            tables: dict[str, dict[str, Any]] = {
                "stamps": {
                    "rid": np.concatenate([np.zeros(0, np.int64), *stamp_rids]),
                    "sup": np.concatenate([np.zeros(0, np.int64), *stamp_sup]),
                    "valid_to": np.concatenate([np.zeros(0, np.int64), *stamp_vt]),
                    "dead": np.concatenate([np.zeros(0, np.int64), *stamp_dead]),
                },
                "deletes": {
                    "tenant": [d[0] for d in deletes],
                    "doc_id": [d[1] for d in deletes],
                    "event_time": np.asarray([d[2] for d in deletes], np.int64),
                    "offset": np.asarray([d[3] for d in deletes], np.int64),
                    "epoch": np.asarray([d[4] for d in deletes], np.int64),
                },
                "epochs": {"high": epoch_high},
            }
            for name, columns in tables.items():
                fname = f"{name}-{epoch:012d}.arrow"
                write_table(path / fname, columns)
                self._sums[fname] = file_checksum(path / fname)
                meta[name] = fname
                keep.add(fname)
            if cursor is not None:
                cname = f"cursor-{epoch:012d}.msgpack"
                write_cursor(path / cname, cursor)
                self._sums[cname] = file_checksum(path / cname)
                meta["cursor"] = cname
                keep.add(cname)
            # Every file the manifest names, with its size and CRC-32: checked on open.
            meta["files"] = {n: self._sums[n] for n in sorted(keep) if n in self._sums}
            self._sums = {n: self._sums[n] for n in keep if n in self._sums}
            mname = f"manifest-{epoch:012d}.json"
            write_manifest(path / mname, {**meta, "segments": segments})
            keep.add(mname)
            self._checkpoint_epoch = epoch
            for p in path.iterdir():
                if p.name not in keep and not p.name.startswith("wal-"):
                    with contextlib.suppress(OSError):
                        p.unlink()
            wal.drop_before(wal.current)
        return epoch

    def _open(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        body = None
        for candidate in sorted(path.glob("manifest-*.json"), reverse=True):
            body = read_manifest(candidate)
            break
        if body is not None:
            self._load_checkpoint(path, body)
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

    def _load_checkpoint(self, path: Path, body: dict[str, Any]) -> None:
        if body["dim"] != self._dim:
            msg = (
                f"the index in {path} holds {body['dim']}-dimensional vectors but the embedder "
                f"makes {self._dim}; point state_dir elsewhere or delete {path} to start over"
            )
            raise IndexStoreError(msg)
        self._next_rid = body["next_rid"]
        self._next_seg = body["next_segment"]
        self._reserve_rids(self._next_rid)
        sums: dict[str, dict[str, int]] = body.get("files") or {}

        def checked(name: str) -> Path:
            """The file, once its size and CRC-32 match the manifest's (raises if not)."""
            verify_file(path / name, sums.get(name))
            if name in sums:
                self._sums[name] = sums[name]
            return path / name

        for entry in body["segments"]:
            rows = read_rows(checked(entry["file"]), self._dim)
            seg = Segment.from_rows(
                entry["id"],
                rows,
                sealed=entry["sealed"],
                capacity=0 if entry["sealed"] else self._spec.seal_rows,
            )
            if entry["sealed"]:
                seg.file = entry["file"]
                if entry.get("ann"):
                    try:
                        ann_path = checked(entry["ann"])
                    except CorruptStateError as exc:
                        # Rebuilt from the segment's vectors; searched exactly meanwhile.
                        log.warning("%s; its graph will be built again", exc.args[0])
                    else:
                        seg.ann = load_hnsw(str(ann_path), seg.vectors[: seg.n], self._spec.ann)
                        if seg.ann is None:
                            self._failed_ann.add(seg.id)
                        else:
                            seg.ann_file = entry["ann"]
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
        stamps = read_table(checked(body["stamps"]))
        rids = stamps["rid"]
        if rids.size:
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
        deletes = read_table(checked(body["deletes"]))
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
        highs = read_table(checked(body["epochs"]))["high"]
        self._epoch_high = np.full(max(1024, highs.size * 2), MIN_TIMESTAMP, np.int64)
        self._epoch_high[: highs.size] = highs
        self._high = body["high"]
        self._compacted_floor = body["compacted_floor"]
        self._rolled_back = tuple((int(a), int(b)) for a, b in body["rolled_back"])
        self._compactions = body["compactions"]
        self._last_compaction_us = body["last_compaction_us"]
        self._checkpoint_epoch = body["epoch"]
        if body.get("cursor"):
            self._cursor = read_cursor(checked(body["cursor"]))
        self._rebuild_docs()
        self._manifest = self._make_manifest(
            body["epoch"], body["parent"], body["committed_at_us"], body["restored_from"]
        )
