"""The worker process of :mod:`streamrag.embed.ahead`: it embeds what the job sends it.

Run as ``python -m streamrag.embed.ahead_worker READ_FD WRITE_FD`` by
:class:`~streamrag.embed.ahead.EmbedAhead`, never by hand. It talks over two
pipes in frames (a 4-byte little-endian length, then a MessagePack body):

* first it reads the *hello* — the parent's ``sys.path`` and the pickled
  embedder — loads the embedder (:class:`~.base.Loadable`), and answers
  ``{"ready": version, "dim": dim}`` (or ``{"error": ...}`` and exits);
* then, for each request ``{"id", "texts"}``, it answers ``{"id", "vectors",
  "s"}`` — the rows as float32 bytes, checked and L2-normalized, and the
  seconds the call took — or ``{"id", "error"}`` when the embedder raised.

It ends when the request pipe closes: when the job closes it, and when the job
dies (the kernel closes a dead process's pipes), so no worker outlives its job.
It ignores SIGINT and SIGTERM, which a terminal or a supervisor sends to the
job's whole process group: the job stops gracefully and then closes the pipe.
Its standard output and error are the job's; nothing is read from them.
"""

from __future__ import annotations

import os
import pickle  # the hello comes from our own parent process, over a private pipe
import signal
import struct
import sys
import time
from typing import Any, BinaryIO

import msgspec

__all__ = ["main", "read_frame", "write_frame"]

_LEN = struct.Struct("<I")


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's body, or None at the end of the stream."""
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (size,) = _LEN.unpack(head)
    body = stream.read(size)
    return body if len(body) == size else None


def write_frame(stream: BinaryIO, body: bytes) -> None:
    """Write one frame and flush it."""
    stream.write(_LEN.pack(len(body)))
    stream.write(body)
    stream.flush()


def _serve(requests: BinaryIO, answers: BinaryIO) -> int:
    from streamrag.embed.base import Loadable, check_vectors

    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder().decode
    hello = read_frame(requests)
    if hello is None:
        return 0
    try:
        start: dict[str, Any] = decode(hello)
        sys.path[:] = [p for p in start["path"] if isinstance(p, str)]
        embedder = pickle.loads(start["embedder"])  # noqa: S301  # see the import
        if isinstance(embedder, Loadable):
            embedder.load()
        dim, version, who = int(embedder.dim), str(embedder.version), type(embedder).__name__
    except Exception as exc:  # the job embeds in-process and logs why
        write_frame(answers, encode({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    write_frame(answers, encode({"ready": version, "dim": dim}))
    while (frame := read_frame(requests)) is not None:
        req: dict[str, Any] = decode(frame)
        texts = req["texts"]
        started = time.perf_counter()
        try:
            vectors = check_vectors(embedder.embed_many(texts), len(texts), dim, who)
        except Exception as exc:  # the job embeds these texts itself and isolates the bad one
            write_frame(answers, encode({"id": req["id"], "error": f"{type(exc).__name__}: {exc}"}))
            continue
        took = time.perf_counter() - started
        write_frame(answers, encode({"id": req["id"], "vectors": vectors.tobytes(), "s": took}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve requests on the two pipe descriptors named in ``argv``."""
    args = sys.argv[1:] if argv is None else argv
    read_fd, write_fd = int(args[0]), int(args[1])
    # A Ctrl-C or a SIGTERM to the job's process group is for the job: it stops
    # gracefully, and the worker ends when the job closes its pipe (or dies).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with os.fdopen(read_fd, "rb") as requests, os.fdopen(write_fd, "wb") as answers:
        try:
            return _serve(requests, answers)
        except BrokenPipeError:  # the job is gone (killed while this answered): end quietly
            # The answer left in the buffer would fail again when the file closes;
            # it goes to /dev/null instead (what Python's docs advise for SIGPIPE).
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, answers.fileno())
            os.close(devnull)
            return 0


if __name__ == "__main__":
    raise SystemExit(main())
