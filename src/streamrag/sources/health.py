"""Connection health of a connector: back-off between reconnects, and what status shows.

A connector to a database or broker will lose its connection: the server
restarts, a network path drops, a password rotates. The job must neither crash
in a loop nor stall silently. Every connector keeps a :class:`ConnectionHealth`:
when a call fails it records the error (with secrets taken out) and the time
of the next attempt, growing the wait exponentially up to a cap, with jitter so
that many jobs do not reconnect in step (the "full jitter" scheme of the AWS
Architecture Blog, *Exponential Backoff And Jitter*, 2015). ``poll`` never
blocks on a reconnect: while the wait runs it returns nothing, and the next
poll after it tries again. :meth:`ConnectionHealth.report` is the connector's
entry in ``/v1/status``.

>>> from streamrag.testing import ManualClock
>>> clock = ManualClock(0)
>>> h = ConnectionHealth("nats", clock=clock, initial_s=1.0, max_s=8.0, jitter=False)
>>> h.due()
True
>>> h.failed(ConnectionError("nats://app:hunter2@127.0.0.1:4222 refused"))
>>> h.due(), h.report()["last_error"]
(False, 'ConnectionError: nats://app:***@127.0.0.1:4222 refused')
>>> clock.advance_us(1_000_000); h.due()
True
>>> h.ok(); h.report()["connected"]
True
"""

from __future__ import annotations

import random
import re
from typing import Any

from streamrag.timing import Clock, SystemClock, Timestamp, format_timestamp

__all__ = ["ConnectionHealth", "redact"]

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
_KEY_PASSWORD = re.compile(
    r"(?P<head>\b(?:password|passwd|pwd|sasl\.password|token|secret)\s*[=:]\s*)"
    r"(?:'[^']*'|\"[^\"]*\"|\S+)",
    re.IGNORECASE,
)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with passwords in URLs and ``key=value`` settings, and each of ``secrets``, masked.

    >>> redact("dbname=app password=s3cret host=db")
    'dbname=app password=*** host=db'
    >>> redact("token xyz leaked", ("xyz",))
    'token *** leaked'
    """
    text = _URL_PASSWORD.sub(r"\g<head>***@", text)
    text = _KEY_PASSWORD.sub(r"\g<head>***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


class ConnectionHealth:
    """Connected or not, the last error, and when the next reconnect may be tried."""

    def __init__(
        self,
        kind: str,
        *,
        clock: Clock | None = None,
        initial_s: float = 0.2,
        max_s: float = 30.0,
        jitter: bool = True,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.clock = clock or SystemClock()
        self.initial_us = int(initial_s * 1_000_000)
        self.max_us = int(max_s * 1_000_000)
        self.jitter = jitter
        self.secrets = secrets
        self.connected = False
        self.last_error: str | None = None
        self.last_error_at: Timestamp | None = None
        self.retries = 0
        """Failed attempts in a row since the last success."""
        self.failures = 0
        """Failed attempts since the connector started."""
        self._next_us: Timestamp = 0
        self._rng = random.Random()  # noqa: S311 - jitter, not cryptography

    def due(self) -> bool:
        """Whether a (re)connect may be tried now."""
        return self.clock.now_us() >= self._next_us

    def failed(self, exc: BaseException) -> None:
        """A call failed: record it and push the next attempt out (exponential, capped)."""
        self.connected = False
        self.retries += 1
        self.failures += 1
        self.last_error = redact(f"{type(exc).__name__}: {exc}", self.secrets)[:500]
        now = self.clock.now_us()
        self.last_error_at = now
        wait = min(self.max_us, self.initial_us * (1 << min(self.retries - 1, 30)))
        if self.jitter:
            wait = self._rng.randint(wait // 2, wait)
        self._next_us = now + wait

    def ok(self) -> None:
        """A call succeeded: connected, and the back-off starts over."""
        self.connected = True
        self.retries = 0
        self._next_us = 0

    def report(self, **extra: Any) -> dict[str, Any]:
        """The connector's entry in ``/v1/status``: ``extra`` (lag, positions) added."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "connected": self.connected,
            "last_error": self.last_error,
            "last_error_at": (
                None if self.last_error_at is None else format_timestamp(self.last_error_at)
            ),
            "retries": self.retries,
            "failures": self.failures,
        }
        out.update(extra)
        return out
