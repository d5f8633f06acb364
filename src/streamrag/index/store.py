"""Files of a persistent index: segments, tables and checkpoint manifests.

Everything is written the same way: to a temporary name, flushed and fsynced,
renamed over its final name, and the directory fsynced. A reader therefore
finds either the previous file or the complete new one, never a torn one. A
checkpoint's manifest (``manifest-<epoch>.json``) is written last and names
every file it needs, so the newest manifest present is always complete; files
no manifest names are leftovers of an interrupted checkpoint and are deleted.

Segment bodies are Arrow IPC files: vectors as a fixed-size list of float32,
ids, event times and epochs as integer columns, strings as strings and the
documents' metadata as JSON text.

**Checksums.** Every file a manifest names is listed in it with its size and
CRC-32 (:func:`file_checksum`), and the manifest carries the CRC-32 of its own
body. Opening verifies each file before reading it (:func:`verify_file`): a
flipped byte raises :class:`~streamrag.errors.CorruptStateError` naming the
file, so damaged state is never served.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import CorruptStateError, IndexStoreError, MissingDependencyError
from streamrag.index.segment import Rows
from streamrag.index.wal import fsync_dir

__all__ = [
    "file_checksum",
    "load_arrow",
    "read_manifest",
    "read_rows",
    "read_table",
    "verify_file",
    "write_atomic",
    "write_manifest",
    "write_rows",
    "write_table",
]

FORMAT = 2
"""2: every change is a version (rows carry ``dead``); segments are not per day.

Format 1 manifests are still read (see :meth:`LsmIndex._load_checkpoint`).
"""
_READS = frozenset({1, FORMAT})


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError:  # pragma: no cover - a dependency
        purpose = "The persistent index"
        raise MissingDependencyError("pyarrow", None, purpose) from None  # noqa: EM101
    return pa


def load_arrow() -> None:
    """Import pyarrow (persistent indexes call this when they open).

    The import costs tens of milliseconds; paid inside a checkpoint it would
    stall commits and queries.
    """
    _pa()


def write_atomic(path: Path, write: Callable[[str], None]) -> None:
    """Run ``write(tmp_path)``, fsync the result and rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(str(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        msg = f"cannot write index file {path}: {exc}; check free space and permissions"
        raise IndexStoreError(msg) from exc


def _write_ipc(path: Path, table: Any) -> None:
    pa = _pa()

    def write(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    write_atomic(path, write)


def _read_ipc(path: Path) -> Any:
    pa = _pa()
    try:
        with pa.memory_map(str(path), "r") as source:
            return pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid as exc:
        raise CorruptStateError(path, f"not a readable Arrow file ({exc})") from None
    except OSError as exc:
        msg = f"cannot read index file {path}: {exc}"
        raise IndexStoreError(msg) from exc


def write_rows(path: Path, rows: Rows) -> None:
    """Write a block of rows (a segment body) as one Arrow file."""
    pa = _pa()
    dim = rows.vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(rows.vectors, dtype=np.float32).reshape(-1))
    table = pa.table(
        {
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
            "rid": pa.array(rows.rids),
            "chunk_id": pa.array(rows.chunk_ids),
            "position": pa.array(rows.positions),
            "valid_from": pa.array(rows.valid_from),
            "offset": pa.array(rows.offsets),
            "created": pa.array(rows.created),
            "committed": pa.array(rows.committed),
            "tenant": _strings(pa, rows.tenants),
            "doc_id": _strings(pa, rows.doc_ids),
            "domain": _strings(pa, rows.domains),
            "source": _strings(pa, rows.sources),
            "embedder": _strings(pa, rows.embedders),
            "text": _strings(pa, rows.texts, large=True),
            "hash": pa.array(rows.hashes, pa.binary()),
            "metadata": pa.array(
                [None if md is None else json.dumps(md, sort_keys=True) for md in rows.metadata],
                pa.string(),
            ),
        }
    )
    _write_ipc(path, table)


def _strings(pa: Any, values: Sequence[str], *, large: bool = False) -> Any:
    """An Arrow string column built from one UTF-8 buffer and numpy offsets.

    pyarrow's conversion of a Python list holds the interpreter lock in one call:
    measured on 8,192 chunk texts, 30–50 ms the first time in a process, a stall
    every other thread feels. Encoding in Python, joining, and handing Arrow the
    buffers takes 2–5 ms and copies once.
    """
    encoded = [v.encode("utf-8") for v in values]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=offsets.dtype)
    kind = pa.LargeStringArray if large else pa.StringArray
    return kind.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def read_rows(path: Path, dim: int) -> Rows:
    """Read a segment body written by :func:`write_rows` (stamps start unset)."""
    t = _read_ipc(path)
    n = t.num_rows
    vec_col = t.column("vector").combine_chunks()
    if n and vec_col.type.list_size != dim:
        msg = (
            f"index file {path} holds {vec_col.type.list_size}-dimensional vectors but the "
            f"index is {dim}-dimensional; point state_dir elsewhere or delete {path.parent}"
        )
        raise IndexStoreError(msg)
    vectors = np.asarray(vec_col.values.to_numpy(zero_copy_only=False), dtype=np.float32)

    def ints(name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
        return np.asarray(t.column(name).to_numpy(), dtype=dtype)

    never = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    return Rows(
        vectors=vectors.reshape(n, dim).copy(),
        rids=ints("rid", np.int64),
        chunk_ids=ints("chunk_id", np.int64),
        positions=ints("position", np.int32),
        valid_from=ints("valid_from", np.int64),
        offsets=ints("offset", np.int64),
        created=ints("created", np.int64),
        committed=ints("committed" if "committed" in t.column_names else "created", np.int64),
        sup=never,
        valid_to=never.copy(),
        dead=never.copy(),
        tenants=t.column("tenant").to_pylist(),
        doc_ids=t.column("doc_id").to_pylist(),
        domains=t.column("domain").to_pylist(),
        sources=t.column("source").to_pylist(),
        embedders=t.column("embedder").to_pylist(),
        texts=t.column("text").to_pylist(),
        hashes=t.column("hash").to_pylist(),
        metadata=[None if s is None else json.loads(s) for s in t.column("metadata").to_pylist()],
    )


def write_table(path: Path, columns: dict[str, Any]) -> None:
    """Write named columns (numpy arrays or lists) as one Arrow file."""
    pa = _pa()
    _write_ipc(path, pa.table({k: pa.array(v) for k, v in columns.items()}))


def read_table(path: Path) -> dict[str, Any]:
    """Columns of a file written by :func:`write_table`: numbers as numpy, strings as lists."""
    t = _read_ipc(path)
    out: dict[str, Any] = {}
    for name in t.column_names:
        col = t.column(name)
        if _pa().types.is_integer(col.type):
            out[name] = np.asarray(col.to_numpy(), dtype=np.int64)
        else:
            out[name] = col.to_pylist()
    return out


def file_checksum(path: Path) -> dict[str, int]:
    """A file's size and CRC-32, as a manifest lists them."""
    crc = 0
    size = 0
    try:
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                crc = zlib.crc32(block, crc)
                size += len(block)
    except OSError as exc:
        msg = f"cannot read index file {path}: {exc}"
        raise IndexStoreError(msg) from exc
    return {"bytes": size, "crc32": crc}


def verify_file(path: Path, expected: dict[str, int] | None) -> None:
    """Check a file against the size and CRC-32 its manifest lists (None: not listed)."""
    if expected is None:
        return
    if not path.exists():
        raise CorruptStateError(path, "the manifest names it but it is missing")
    found = file_checksum(path)
    if found["bytes"] != expected["bytes"]:
        detail = f"{found['bytes']} bytes where the manifest says {expected['bytes']}"
        raise CorruptStateError(path, detail)
    if found["crc32"] != expected["crc32"]:
        detail = f"CRC-32 {found['crc32']:08x} where the manifest says {expected['crc32']:08x}"
        raise CorruptStateError(path, detail)


def _manifest_crc(body: dict[str, Any]) -> int:
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return zlib.crc32(canon)


def write_manifest(path: Path, body: dict[str, Any]) -> None:
    """Write a checkpoint manifest (JSON), atomically; the checkpoint's last step."""
    full = {"format": FORMAT, **body}
    full["checksum"] = _manifest_crc(full)
    data = json.dumps(full, indent=1, sort_keys=True).encode()

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    write_atomic(path, write)


def write_cursor(path: Path, cursor: dict[str, Any]) -> None:
    """Write the stream cursor a checkpoint covers (msgpack), atomically."""
    import msgspec

    data = msgspec.msgpack.encode(cursor)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    write_atomic(path, write)


def read_cursor(path: Path) -> dict[str, Any]:
    """Read a checkpoint's stream cursor."""
    import msgspec

    try:
        body: dict[str, Any] = msgspec.msgpack.decode(path.read_bytes())
    except OSError as exc:
        msg = f"cannot read the stream cursor {path}: {exc}"
        raise IndexStoreError(msg) from exc
    except msgspec.DecodeError as exc:
        raise CorruptStateError(path, f"not a valid cursor ({exc})") from None
    return body


def read_manifest(path: Path) -> dict[str, Any]:
    """Read a checkpoint manifest."""
    try:
        body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        msg = f"cannot read index manifest {path}: {exc}"
        raise IndexStoreError(msg) from exc
    except ValueError as exc:
        raise CorruptStateError(path, f"not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise CorruptStateError(path, "not a JSON object")
    if "checksum" in body:
        want = body.pop("checksum")
        if _manifest_crc(body) != want:
            raise CorruptStateError(path, "its content does not match its own CRC-32")
    elif body.get("format") == FORMAT:
        raise CorruptStateError(path, "its checksum is missing")
    if body.get("format") not in _READS:
        msg = (
            f"index manifest {path} has format {body.get('format')!r}; this streamrag reads "
            f"format {FORMAT}: upgrade streamrag or rebuild the index by replaying the input"
        )
        raise IndexStoreError(msg)
    return body
