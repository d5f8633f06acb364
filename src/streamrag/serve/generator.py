"""A client for any OpenAI-compatible chat endpoint: DeepSeek, vLLM, llama.cpp, OpenAI.

:class:`ChatClient` speaks ``POST {base_url}/chat/completions``, whole or
streamed (server-sent events: ``data: {chunk}`` lines ending with
``data: [DONE]``), over httpx. A remote model is the slowest and least reliable
part of answering, so the client guards every call:

* **Timeouts**: to connect (``connect_timeout_s``), between bytes of the answer
  — the wait for the first token included — (``read_timeout_s``), and for the
  whole call with its retries (``total_timeout_s``).
* **Retries with backoff**: a refused connection, a timeout, 429 or a 5xx is
  retried up to ``max_retries`` times, after ``backoff_ms × 2^attempt`` with
  jitter (or the server's ``Retry-After``). A streamed call is retried only
  until its first byte: text already sent cannot be taken back. Other 4xx
  answers (a bad key, an unknown model) are not retried.
* **Circuit breaker** (:class:`CircuitBreaker`): after ``breaker_failures``
  failed attempts in a row the endpoint is considered down and calls fail at
  once with :class:`~streamrag.errors.CircuitOpenError`; after
  ``breaker_reset_s`` one trial call is let through, which closes the breaker
  if it succeeds. A failing LLM then costs microseconds, not a timeout per request.
* **Concurrency limit**: at most ``max_concurrency`` calls in flight; the others
  wait for a slot (within their total timeout).

Failures raise :class:`~streamrag.errors.GeneratorError`; the answerer falls
back to an extractive answer. The API key is sent as a bearer token, and
appears in no repr, log line or error message.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from streamrag.config import LLMSettings
from streamrag.errors import (
    CircuitOpenError,
    ConfigError,
    GeneratorError,
    GeneratorTimeoutError,
)
from streamrag.runtime.metrics import Metrics
from streamrag.timing import US_PER_S, Clock, SystemClock

__all__ = ["ChatClient", "CircuitBreaker", "Completion", "Delta"]

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}

BreakerState = Literal["closed", "half_open", "open"]


class CircuitBreaker:
    """Closed → open after ``failures`` failures in a row → half-open after ``reset_s``.

    Half-open lets one trial call through: its success closes the breaker, its
    failure opens it again for another ``reset_s``. Time comes from ``clock``.

    >>> from streamrag.testing import ManualClock
    >>> clock = ManualClock(0)
    >>> b = CircuitBreaker(failures=2, reset_s=10, clock=clock)
    >>> b.failure(); b.failure(); b.state
    'open'
    >>> b.allow()
    False
    >>> clock.advance_ms(10_000); b.allow(), b.state
    (True, 'half_open')
    >>> b.success(); b.state
    'closed'
    """

    def __init__(
        self,
        failures: int,
        reset_s: float,
        clock: Clock,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        self.failures = failures
        self.reset_us = int(reset_s * US_PER_S)
        self.clock = clock
        self.on_change = on_change
        self._state: BreakerState = "closed"
        self._failed = 0
        self._opened_at = 0
        self._trial = False

    @property
    def state(self) -> BreakerState:
        """``closed`` (calls pass), ``open`` (calls refused) or ``half_open`` (one trial)."""
        return self._state

    @property
    def retry_in_s(self) -> float:
        """Seconds until an open breaker lets a trial call through (0 unless open)."""
        if self._state != "open":
            return 0.0
        return max(0, self._opened_at + self.reset_us - self.clock.now_us()) / US_PER_S

    def allow(self) -> bool:
        """Whether a call may go out now (an open breaker past its reset lets one through)."""
        if self._state == "closed":
            return True
        if self._state == "open":
            if self.clock.now_us() - self._opened_at < self.reset_us:
                return False
            self._set("half_open")
            self._trial = False
        if self._trial:
            return False  # the trial call is still out
        self._trial = True
        return True

    def success(self) -> None:
        """A call succeeded: close."""
        self._failed = 0
        self._trial = False
        if self._state != "closed":
            self._set("closed")

    def failure(self) -> None:
        """A call failed: open after enough of them, or at once when half-open."""
        self._failed += 1
        self._trial = False
        if self._state == "half_open" or self._failed >= self.failures:
            self._opened_at = self.clock.now_us()
            self._set("open")

    def release(self) -> None:
        """A call ended with neither verdict (a client error): let the next trial through."""
        self._trial = False

    def _set(self, state: BreakerState) -> None:
        self._state = state
        if self.on_change is not None:
            self.on_change(state)

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self._state!r}, failures={self._failed}/{self.failures})"


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole answer."""

    text: str
    model: str
    finish_reason: str | None
    usage: Mapping[str, int] | None


@dataclass(frozen=True, slots=True)
class Delta:
    """One piece of a streamed answer; the last pieces carry the finish reason and usage."""

    text: str
    model: str | None = None
    finish_reason: str | None = None
    usage: Mapping[str, int] | None = None


class _Retryable(Exception):
    def __init__(self, message: str, *, timeout: bool = False, wait_s: float | None = None):
        super().__init__(message)
        self.timeout = timeout
        self.wait_s = wait_s


class ChatClient:
    """OpenAI-compatible chat completions with timeouts, retries, a breaker and a slot limit."""

    def __init__(
        self,
        settings: LLMSettings,
        *,
        clock: Clock | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rng: random.Random | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not settings.base_url:
            msg = "config key 'llm.base_url' is not set: a ChatClient needs an endpoint"
            raise ConfigError(msg)
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self.model = settings.model
        self.clock = clock or SystemClock()
        self.metrics = metrics
        self._sleep = sleep or asyncio.sleep
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        headers = {"accept": "application/json"}
        if settings.api_key is not None:
            headers["authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(
                connect=settings.connect_timeout_s,
                read=settings.read_timeout_s,
                write=settings.read_timeout_s,
                pool=settings.total_timeout_s,
            ),
            transport=transport,
        )
        self.breaker = CircuitBreaker(
            settings.breaker_failures,
            settings.breaker_reset_s,
            self.clock,
            on_change=self._breaker_changed,
        )
        self._slots = asyncio.Semaphore(settings.max_concurrency)

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> Completion:
        """The whole answer to ``messages``."""
        payload = self._payload(messages, max_tokens, temperature, stream=False)
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                async with asyncio.timeout(self.settings.total_timeout_s):
                    async with self._slots:
                        resp = await self._send(payload, stream=False)
            except TimeoutError:
                raise GeneratorTimeoutError(self._total_timeout_message()) from None
            try:
                body = json.loads(resp.content)
                choice = body["choices"][0]
                completion = Completion(
                    choice["message"].get("content") or "",
                    str(body.get("model") or self.model),
                    choice.get("finish_reason"),
                    body.get("usage"),
                )
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                self.breaker.failure()
                msg = (
                    f"{self.base_url}/chat/completions answered something that is not a chat "
                    f"completion: {resp.text[:200]!r}"
                )
                raise GeneratorError(msg) from None
            self.breaker.success()
            outcome = "ok"
            return completion
        except GeneratorTimeoutError:
            outcome = "timeout"
            raise
        except CircuitOpenError:
            outcome = "circuit_open"
            raise
        finally:
            self._observe(outcome, started)

    async def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> AsyncIterator[Delta]:
        """The answer to ``messages`` piece by piece, as the endpoint writes it.

        Close the iterator (``aclose``) when stopping early; the connection and
        the concurrency slot are released then.
        """
        payload = self._payload(messages, max_tokens, temperature, stream=True)
        total_s = self.settings.total_timeout_s
        deadline_us = self.clock.now_us() + int(total_s * US_PER_S)
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                async with asyncio.timeout(total_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise GeneratorTimeoutError(self._total_timeout_message()) from None
            try:
                try:
                    async with asyncio.timeout(total_s - (time.perf_counter() - started)):
                        resp = await self._send(payload, stream=True)
                except TimeoutError:
                    raise GeneratorTimeoutError(self._total_timeout_message()) from None
                try:
                    async for delta in self._deltas(resp):
                        yield delta
                        if self.clock.now_us() > deadline_us:
                            raise GeneratorTimeoutError(self._total_timeout_message())
                except httpx.TimeoutException:
                    self.breaker.failure()
                    msg = (
                        f"{self.base_url}/chat/completions stopped sending for more than "
                        f"llm.read_timeout_s={self.settings.read_timeout_s} s mid-answer"
                    )
                    raise GeneratorTimeoutError(msg) from None
                except httpx.HTTPError as exc:
                    self.breaker.failure()
                    msg = f"{self.base_url}/chat/completions broke off mid-answer: {exc}"
                    raise GeneratorError(msg) from None
                except GeneratorError:
                    self.breaker.failure()
                    raise
                finally:
                    await resp.aclose()
            finally:
                self._slots.release()
            self.breaker.success()
            outcome = "ok"
        except GeneratorTimeoutError:
            outcome = "timeout"
            raise
        except CircuitOpenError:
            outcome = "circuit_open"
            raise
        except GeneratorExit:
            outcome = "abandoned"  # the caller stopped reading: no verdict on the endpoint
            self.breaker.release()
            raise
        finally:
            self._observe(outcome, started)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def __repr__(self) -> str:
        key = "set" if self.settings.api_key is not None else "none"
        return (
            f"ChatClient(base_url={self.base_url!r}, model={self.model!r}, api_key={key}, "
            f"breaker={self.breaker.state!r})"
        )

    # -- internals -----------------------------------------------------------------

    def _payload(
        self,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int | None,
        temperature: float | None,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens or self.settings.max_tokens,
            "temperature": self.settings.temperature if temperature is None else temperature,
            "stream": stream,
        }
        if self.model:
            payload["model"] = self.model
        if stream:
            payload["stream_options"] = {"include_usage": True}
        return payload

    async def _send(self, payload: dict[str, Any], *, stream: bool) -> httpx.Response:
        """POST with retries; the response of the first attempt that gets a 2xx."""
        attempt = 0
        deadline_us = self.clock.now_us() + int(self.settings.total_timeout_s * US_PER_S)
        while True:
            if not self.breaker.allow():
                msg = (
                    f"the LLM endpoint {self.base_url} failed {self.breaker.failures} times in a "
                    f"row; calls are refused for another {self.breaker.retry_in_s:.1f} s "
                    "(llm.breaker_reset_s)"
                )
                raise CircuitOpenError(msg)
            try:
                return await self._attempt(payload, stream=stream)
            except _Retryable as exc:
                self.breaker.failure()
                wait = self._backoff(attempt, exc.wait_s)
                out_of_time = self.clock.now_us() + int(wait * US_PER_S) >= deadline_us
                if attempt >= self.settings.max_retries or out_of_time:
                    tries = attempt + 1
                    msg = f"{exc} (after {tries} attempt{'s' if tries > 1 else ''})"
                    if exc.timeout:
                        raise GeneratorTimeoutError(msg) from None
                    raise GeneratorError(msg) from None
                attempt += 1
                if self.metrics is not None:
                    self.metrics.llm_retries.inc()
                await self._sleep(wait)

    async def _attempt(self, payload: dict[str, Any], *, stream: bool) -> httpx.Response:
        url = "/chat/completions"
        try:
            request = self._http.build_request("POST", url, json=payload)
            resp = await self._http.send(request, stream=stream)
        except httpx.ConnectTimeout:
            msg = (
                f"cannot connect to {self.base_url} within llm.connect_timeout_s="
                f"{self.settings.connect_timeout_s} s"
            )
            raise _Retryable(msg, timeout=True) from None
        except httpx.TimeoutException:
            msg = (
                f"{self.base_url}/chat/completions sent nothing for llm.read_timeout_s="
                f"{self.settings.read_timeout_s} s"
            )
            raise _Retryable(msg, timeout=True) from None
        except httpx.TransportError as exc:
            reason = str(exc) or "the connection failed"  # in words: no class names
            msg = f"cannot reach the LLM endpoint {self.base_url}: {reason}"
            raise _Retryable(msg) from None
        if resp.status_code < 300:
            return resp
        body = (await resp.aread()).decode("utf-8", "replace")[:300]
        await resp.aclose()
        if resp.status_code in _RETRY_STATUS:
            msg = f"{self.base_url}{url} answered {resp.status_code}: {body}"
            raise _Retryable(msg, wait_s=_retry_after(resp))
        self.breaker.release()
        hint = {
            401: "check llm.api_key (STREAMRAG_LLM__API_KEY)",
            403: "check llm.api_key (STREAMRAG_LLM__API_KEY)",
            404: "check llm.base_url (it ends before /chat/completions) and llm.model",
        }.get(resp.status_code, "check llm.model and the request")
        msg = f"{self.base_url}{url} answered {resp.status_code}: {body}; {hint}"
        raise GeneratorError(msg)

    def _backoff(self, attempt: int, server_wait: float | None) -> float:
        if server_wait is not None:
            return min(server_wait, self.settings.total_timeout_s)
        base = self.settings.backoff_ms / 1000 * (2**attempt)
        return float(base * (0.5 + self._rng.random()))

    async def _deltas(self, resp: httpx.Response) -> AsyncIterator[Delta]:
        """Parse server-sent events of chat-completion chunks until ``[DONE]``.

        A stream that ends without ``[DONE]`` and without a finish reason broke
        off (a closed connection looks like a normal end of body in HTTP/1.1).
        """
        finished = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" lines
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                msg = (
                    f"{self.base_url}/chat/completions streamed a line that is not JSON: "
                    f"{data[:200]!r}"
                )
                raise GeneratorError(msg) from None
            if "error" in chunk:
                msg = f"{self.base_url}/chat/completions streamed an error: {chunk['error']}"
                raise GeneratorError(msg)
            choices = chunk.get("choices") or []
            choice = choices[0] if choices else {}
            delta = choice.get("delta") or {}
            finished = finished or bool(choice.get("finish_reason"))
            yield Delta(
                delta.get("content") or "",
                chunk.get("model"),
                choice.get("finish_reason"),
                chunk.get("usage"),
            )
        if not finished:
            msg = f"{self.base_url}/chat/completions ended its stream before the answer did"
            raise GeneratorError(msg)

    def _total_timeout_message(self) -> str:
        return (
            f"the LLM endpoint {self.base_url} did not finish within llm.total_timeout_s="
            f"{self.settings.total_timeout_s} s"
        )

    def _observe(self, outcome: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.llm_calls.labels(outcome).inc()
            self.metrics.llm_seconds.observe(time.perf_counter() - started)

    def _breaker_changed(self, state: BreakerState) -> None:
        if self.metrics is not None:
            self.metrics.llm_circuit.set(_STATE_VALUE[state])


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: use our own backoff
