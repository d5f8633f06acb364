"""The OpenAI-compatible chat client against real servers on 127.0.0.1.

Protocol and streaming run against llama.cpp serving SmolLM2; failures (5xx,
429, refused and silent connections, streams that break off) against a
scripted server. Backoff waits are recorded, not slept; the breaker runs on a
manual clock.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import pytest

from streamrag.config import LLMSettings
from streamrag.errors import CircuitOpenError, GeneratorError, GeneratorTimeoutError
from streamrag.runtime.metrics import Metrics
from streamrag.serve.generator import ChatClient, CircuitBreaker, Delta
from streamrag.serve.local_llm import LocalLLM
from streamrag.testing import ManualClock
from tests.e2e.conftest import wait_for
from tests.serve.conftest import Reply, ScriptedLLM, chunks, completion

MESSAGES = [{"role": "user", "content": "Say one word."}]


def _client(base_url: str, **kw: Any) -> tuple[ChatClient, list[float]]:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    settings = LLMSettings(base_url=base_url, **kw)
    client = ChatClient(settings, sleep=sleep, rng=random.Random(7), metrics=Metrics())
    return client, waits


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _collect(client: ChatClient, **kw: Any) -> list[Delta]:
    try:
        return [d async for d in client.stream(MESSAGES, **kw)]
    finally:
        await client.aclose()


async def _complete(client: ChatClient, **kw: Any) -> Any:
    try:
        return await client.complete(MESSAGES, **kw)
    finally:
        await client.aclose()


# -- a real llama.cpp server -----------------------------------------------------------


def test_complete_and_stream_against_llama_cpp(local_llm: LocalLLM) -> None:
    client, _ = _client(local_llm.base_url, model="smollm2", max_tokens=6, temperature=0)
    whole = _run(_complete(client))
    assert whole.finish_reason in ("stop", "length")
    assert whole.usage["completion_tokens"] <= 6
    assert whole.usage["prompt_tokens"] > 0

    client, _ = _client(local_llm.base_url, model="smollm2", max_tokens=6, temperature=0)
    deltas = _run(_collect(client))
    assert len(deltas) >= 2  # a role chunk, then text pieces
    assert any(d.finish_reason in ("stop", "length") for d in deltas)
    usage = [d.usage for d in deltas if d.usage]
    assert usage
    assert usage[-1]["completion_tokens"] <= 6
    # Same prompt, greedy sampling: the stream spells the same text as the whole answer.
    assert "".join(d.text for d in deltas) == whole.text
    assert client.metrics is not None
    assert client.breaker.state == "closed"


# -- timeouts -----------------------------------------------------------------------


def test_a_silent_endpoint_times_out(silent_port: int) -> None:
    client, _ = _client(f"http://127.0.0.1:{silent_port}/v1", read_timeout_s=0.2, max_retries=0)
    started = time.monotonic()
    with pytest.raises(GeneratorTimeoutError, match=r"read_timeout_s=0\.2"):
        _run(_complete(client))
    assert time.monotonic() - started < 5


def test_a_stream_that_stops_sending_times_out(scripted_llm: ScriptedLLM) -> None:
    scripted_llm.script(Reply(hang=True))
    client, _ = _client(scripted_llm.url, read_timeout_s=0.2, max_retries=0)
    with pytest.raises(GeneratorTimeoutError):
        _run(_collect(client))


def test_the_total_timeout_bounds_a_call_with_its_retries(silent_port: int) -> None:
    client, _ = _client(
        f"http://127.0.0.1:{silent_port}/v1",
        read_timeout_s=30,
        total_timeout_s=0.3,
        max_retries=5,
    )
    started = time.monotonic()
    with pytest.raises(GeneratorTimeoutError, match=r"total_timeout_s=0\.3"):
        _run(_complete(client))
    assert time.monotonic() - started < 5


# -- retries and backoff ------------------------------------------------------------------


def test_5xx_is_retried_with_exponential_backoff(scripted_llm: ScriptedLLM) -> None:
    scripted_llm.script(
        Reply(503, {"error": "busy"}),
        Reply(502, {"error": "bad gateway"}),
        Reply(body=completion("fine")),
    )
    client, waits = _client(scripted_llm.url, backoff_ms=100, max_retries=2)
    result = _run(_complete(client))
    assert result.text == "fine"
    assert len(scripted_llm.requests) == 3
    # 100 ms, then 200 ms, each with jitter in [0.5, 1.5).
    assert len(waits) == 2
    assert 0.05 <= waits[0] < 0.15
    assert 0.1 <= waits[1] < 0.3
    assert client.metrics is not None
    text = client.metrics.render().decode()
    assert "streamrag_llm_retries_total 2.0" in text
    assert 'streamrag_llm_calls_total{outcome="ok"} 1.0' in text


def test_retry_after_is_honoured(scripted_llm: ScriptedLLM) -> None:
    scripted_llm.script(
        Reply(429, {"error": "slow down"}, headers={"Retry-After": "7"}),
        Reply(body=completion()),
    )
    client, waits = _client(scripted_llm.url)
    _run(_complete(client))
    assert waits == [7.0]


def test_retries_give_up_and_say_how_often(closed_port: int) -> None:
    client, waits = _client(f"http://127.0.0.1:{closed_port}/v1", max_retries=2)
    with pytest.raises(GeneratorError, match=r"cannot reach .* \(after 3 attempts\)"):
        _run(_complete(client))
    assert len(waits) == 2


def test_client_errors_are_not_retried_and_the_key_is_never_shown(
    scripted_llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
) -> None:
    scripted_llm.script(Reply(401, {"error": {"message": "invalid api key"}}))
    secret = "sk-very-secret-123"
    client, waits = _client(scripted_llm.url, api_key=secret)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(GeneratorError, match=r"check llm\.api_key") as err:
        _run(_complete(client))
    assert len(scripted_llm.requests) == 1
    assert waits == []
    assert scripted_llm.requests[0]["headers"]["authorization"] == f"Bearer {secret}"
    assert secret not in str(err.value)
    assert secret not in repr(client)
    assert secret not in repr(client.settings)
    assert secret not in caplog.text
    assert client.breaker.state == "closed"  # a client error says nothing of the endpoint's health


# -- the circuit breaker ------------------------------------------------------------------


def test_breaker_opens_refuses_fast_and_closes_after_a_good_trial(
    scripted_llm: ScriptedLLM,
) -> None:
    clock = ManualClock(0)
    scripted_llm.script(Reply(503, {}), Reply(503, {}), Reply(body=completion("back")))
    settings = LLMSettings(
        base_url=scripted_llm.url, max_retries=1, breaker_failures=2, breaker_reset_s=30
    )
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    metrics = Metrics()
    client = ChatClient(settings, clock=clock, sleep=sleep, metrics=metrics)

    async def scenario() -> None:
        try:
            with pytest.raises(GeneratorError, match="503"):
                await client.complete(MESSAGES)  # two failed attempts: the breaker opens
            assert client.breaker.state == "open"
            with pytest.raises(CircuitOpenError, match=r"refused for another 30\.0 s"):
                await client.complete(MESSAGES)
            assert len(scripted_llm.requests) == 2  # the refused call never left
            clock.advance_ms(29_999)
            with pytest.raises(CircuitOpenError):
                await client.complete(MESSAGES)
            clock.advance_ms(1)
            result = await client.complete(MESSAGES)  # the trial call goes out and succeeds
            assert result.text == "back"
            assert client.breaker.state == "closed"
        finally:
            await client.aclose()

    _run(scenario())
    text = metrics.render().decode()
    assert 'streamrag_llm_calls_total{outcome="circuit_open"} 2.0' in text
    assert "streamrag_llm_circuit_state 0.0" in text


def test_a_failed_trial_reopens_the_breaker() -> None:
    clock = ManualClock(0)
    b = CircuitBreaker(failures=3, reset_s=5, clock=clock)
    for _ in range(3):
        assert b.allow()
        b.failure()
    assert not b.allow()
    clock.advance_ms(5_000)
    assert b.allow()  # the trial
    assert not b.allow()  # only one at a time
    b.failure()
    assert b.state == "open"
    assert not b.allow()
    clock.advance_ms(5_000)
    assert b.allow()
    b.success()
    assert b.state == "closed"
    b.failure()
    assert b.state == "closed"  # one failure after a success: not yet


# -- concurrency and streaming ----------------------------------------------------------------


def test_concurrency_is_limited_to_the_slots(scripted_llm: ScriptedLLM) -> None:
    import threading

    gate = threading.Event()
    scripted_llm.script(Reply(body=completion(), gate=gate))
    client, _ = _client(scripted_llm.url, max_concurrency=1)

    async def scenario() -> None:
        calls = [asyncio.create_task(client.complete(MESSAGES)) for _ in range(3)]
        await asyncio.to_thread(wait_for, lambda: scripted_llm.requests, 10, "a request")
        # One call holds the only slot; the others wait for it and have sent nothing.
        assert client._slots.locked()
        assert len(scripted_llm.requests) == 1
        gate.set()
        await asyncio.gather(*calls)
        await client.aclose()

    _run(scenario())
    assert len(scripted_llm.requests) == 3
    assert scripted_llm.max_in_flight == 1


def test_stream_parsing_skips_comments_and_stops_at_done(scripted_llm: ScriptedLLM) -> None:
    scripted_llm.script(Reply(stream=chunks("Hel", "lo", " [1]")))
    client, _ = _client(scripted_llm.url)
    deltas = _run(_collect(client))
    assert "".join(d.text for d in deltas) == "Hello [1]"
    assert deltas[-1].finish_reason == "stop"
    body = scripted_llm.requests[0]["body"]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_a_stream_that_breaks_off_is_an_error(scripted_llm: ScriptedLLM) -> None:
    scripted_llm.script(Reply(stream=chunks("one", "two", "three"), break_after=2))
    client, _ = _client(scripted_llm.url)
    got: list[str] = []

    async def scenario() -> None:
        try:
            async for d in client.stream(MESSAGES):
                got.append(d.text)
        finally:
            await client.aclose()

    with pytest.raises(GeneratorError):
        _run(scenario())
    assert got == ["", "one"]
