"""Stopping on a signal: gracefully on the first, at once on the second.

SIGTERM (what ``kill``, systemd and Kubernetes send) and Ctrl-C (SIGINT) ask a
job to stop. The first one stops the sources, lets the committer flush and
commit what the batcher holds, and closes the index (a final checkpoint).
That can take a moment — an embedder batch in flight, a checkpoint write — so
a second signal exits at once, without waiting. That is safe: every commit is
one fsynced log record carrying the stream cursor, so exiting in the middle of
anything is a crash the next start recovers from, with nothing lost or
applied twice.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["graceful_stop", "terminate_as_interrupt"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _exit_now(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write(
        f"streamrag: {signal.Signals(signum).name} again, exiting now; the last commit is "
        "durable and what was pending is read again on the next start\n"
    )
    sys.stderr.flush()
    os._exit(128 + signum)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def graceful_stop() -> Iterator[None]:
    """Within the block (a shutdown under way), SIGINT or SIGTERM exits at once."""
    previous = {s: signal.signal(s, _exit_now) for s in _STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
