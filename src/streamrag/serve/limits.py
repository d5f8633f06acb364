"""Per-key limits: a token bucket for the request rate, and bounds on requests in flight.

Every API key has a **token bucket** of ``burst`` tokens that refills at
``rate_per_s`` tokens a second; each request takes one. An idle key can send
``burst`` requests at once, then ``rate_per_s`` a second. A request that finds
the bucket empty is refused with :class:`~streamrag.errors.OverloadedError`
(HTTP 429) and ``Retry-After``: the whole seconds until the bucket holds a
token again. Time comes from the service's clock, so tests move it by hand.

The bucket bounds how often a key asks; it cannot bound how long its answers
take. So each key also has at most ``max_in_flight`` requests being answered
at once, and at most ``max_answers_in_flight`` answers and chat completions
(each may hold an LLM call for seconds): one key cannot take every query
worker or every LLM slot from the others. A request over either bound is
refused the same way (``Retry-After: 1``) and takes no token.

>>> from streamrag.config.security import KeyLimitSettings
>>> from streamrag.testing import ManualClock
>>> clock = ManualClock(0)
>>> limiter = KeyLimiter(clock)
>>> slow = KeyLimitSettings(rate_per_s=0.5, burst=1)
>>> with limiter.admit("k", slow):
...     pass
>>> limiter.admit("k", slow)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
streamrag.errors.OverloadedError: API key 'k' is over its rate of 0.5 requests/s ... retry after 2 s
>>> clock.advance_us(2_000_000)
>>> with limiter.admit("k", slow):
...     pass
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from types import TracebackType

from streamrag.config.security import KeyLimitSettings
from streamrag.errors import OverloadedError
from streamrag.timing import US_PER_S, Clock

__all__ = ["Admission", "KeyLimiter", "TokenBucket"]


class TokenBucket:
    """``burst`` tokens, refilled continuously at ``rate_per_s``; full at the start."""

    __slots__ = ("_at_us", "_clock", "_tokens", "burst", "rate_per_s")

    def __init__(self, rate_per_s: float, burst: int, clock: Clock) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at_us = clock.now_us()

    def _refill(self) -> None:
        now = self._clock.now_us()
        if now > self._at_us:
            gained = (now - self._at_us) * self.rate_per_s / US_PER_S
            self._tokens = min(float(self.burst), self._tokens + gained)
        self._at_us = max(self._at_us, now)

    @property
    def tokens(self) -> float:
        """Tokens in the bucket now."""
        self._refill()
        return self._tokens

    def take(self) -> int:
        """Take a token: 0 if one was there, else the whole seconds until one is (≥ 1)."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0
        return max(1, math.ceil((1.0 - self._tokens) / self.rate_per_s))

    def resize(self, rate_per_s: float, burst: int) -> None:
        """Take new limits (a key file was edited), keeping the tokens already earned."""
        self._refill()
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = min(self._tokens, float(burst))


@dataclass(slots=True)
class _KeyState:
    bucket: TokenBucket
    in_flight: int = 0
    answers: int = 0


@dataclass(slots=True)
class Admission:
    """One admitted request; leaving the ``with`` block (or :meth:`release`) frees its slot."""

    limiter: KeyLimiter
    name: str
    answers: bool
    _open: bool = field(default=True)

    def release(self) -> None:
        """Free the request's in-flight slot (once; later calls do nothing)."""
        if self._open:
            self._open = False
            self.limiter._release(self.name, self.answers)

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class KeyLimiter:
    """Token buckets and in-flight counts by key name (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._keys: dict[str, _KeyState] = {}
        self._lock = threading.Lock()

    def admit(self, name: str, limits: KeyLimitSettings, *, answers: bool = False) -> Admission:
        """Admit one request of key ``name``, or raise :class:`OverloadedError` (a 429).

        ``answers`` marks an answer or chat completion, bounded by
        ``max_answers_in_flight`` as well.
        """
        with self._lock:
            state = self._keys.get(name)
            if state is None:
                bucket = TokenBucket(limits.rate_per_s, limits.burst, self.clock)
                state = self._keys[name] = _KeyState(bucket)
            elif (state.bucket.rate_per_s, state.bucket.burst) != (limits.rate_per_s, limits.burst):
                state.bucket.resize(limits.rate_per_s, limits.burst)
            if state.in_flight >= limits.max_in_flight:
                msg = (
                    f"API key {name!r} has {state.in_flight} requests in flight, its bound "
                    f"(max_in_flight={limits.max_in_flight}); wait for one to finish, "
                    "retry after 1 s"
                )
                raise OverloadedError(msg, 1)
            if answers and state.answers >= limits.max_answers_in_flight:
                msg = (
                    f"API key {name!r} has {state.answers} answers in flight, its bound "
                    f"(max_answers_in_flight={limits.max_answers_in_flight}); wait for one to "
                    "finish, retry after 1 s"
                )
                raise OverloadedError(msg, 1)
            wait_s = state.bucket.take()
            if wait_s:
                msg = (
                    f"API key {name!r} is over its rate of {limits.rate_per_s:g} requests/s "
                    f"(burst {limits.burst}); retry after {wait_s} s"
                )
                raise OverloadedError(msg, wait_s)
            state.in_flight += 1
            if answers:
                state.answers += 1
        return Admission(self, name, answers)

    def in_flight(self, name: str) -> int:
        """Requests of key ``name`` being answered now."""
        with self._lock:
            state = self._keys.get(name)
            return 0 if state is None else state.in_flight

    def _release(self, name: str, answers: bool) -> None:
        with self._lock:
            state = self._keys[name]
            state.in_flight -= 1
            if answers:
                state.answers -= 1
