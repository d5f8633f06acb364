"""``finish_reason`` is the LLM's own: ``length`` when it stopped at ``max_tokens``.

On ``/v1/answer`` (the body and the ``done`` event) and on
``/v1/chat/completions`` (the whole completion and the last chunk of a stream),
whatever the scripted OpenAI-compatible endpoint answers comes through; an
extractive answer is whole, so ``stop``. Each body fits its documented model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.responses import AnswerResponse, ChatCompletion
from streamrag.testing import FakeEmbedder, change_line
from tests.serve.conftest import Reply, ScriptedLLM, ThreadedUvicorn, chunks, completion

Q = "how do I rotate the database password?"


def make_service(tmp_path: Path, **overrides: Any) -> Service:
    source = tmp_path / "in.jsonl"
    source.write_text(
        change_line("runbook-1", "2024-01-01T00:00:00Z", "Rotate the database password.") + "\n"
    )
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "serve.query_workers": 1,
            **overrides,
        },
        environ={},
    )
    svc = Service(settings, embedder=FakeEmbedder())
    svc.pipeline.run_until_caught_up()
    return svc


@pytest.fixture
def with_llm(tmp_path: Path, scripted_llm: ScriptedLLM) -> Iterator[tuple[TestClient, ScriptedLLM]]:
    svc = make_service(tmp_path, **{"llm.base_url": scripted_llm.url})
    with TestClient(create_app(svc, manage_service=False)) as c:
        yield c, scripted_llm


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_answer_passes_the_llms_finish_reason_through(
    with_llm: tuple[TestClient, ScriptedLLM], reason: str
) -> None:
    c, llm = with_llm
    llm.script(Reply(body=completion("Rotate it [1]", finish_reason=reason)))
    body = c.post("/v1/answer", json={"query": Q, "cache": False, "max_tokens": 4}).json()
    assert body["generator"] == "llm"
    assert body["finish_reason"] == reason
    AnswerResponse.model_validate(body)
    assert llm.requests[-1]["body"]["max_tokens"] == 4

    llm.script(Reply(stream=chunks("Rotate", " it", finish_reason=reason)))
    r = c.post("/v1/answer", json={"query": Q, "cache": False, "stream": True})
    events = sse_events(r.text)
    assert [k for k, _ in events] == ["meta", "delta", "delta", "done"]
    assert "finish_reason" not in events[0][1]  # known only once the LLM is done
    assert events[-1][1]["finish_reason"] == reason
    AnswerResponse.model_validate(events[-1][1])


def test_a_cached_answer_keeps_its_finish_reason(with_llm: tuple[TestClient, ScriptedLLM]) -> None:
    c, llm = with_llm
    llm.script(Reply(body=completion("Rotate it [1]", finish_reason="length")))
    first = c.post("/v1/answer", json={"query": Q}).json()
    again = c.post("/v1/answer", json={"query": Q}).json()
    assert (first["cached"], again["cached"]) == (None, "exact")
    assert again["finish_reason"] == "length"  # the same cut answer
    assert len(llm.requests) == 1


def test_an_extractive_answer_is_whole(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    with TestClient(create_app(svc, manage_service=False)) as c:
        body = c.post("/v1/answer", json={"query": Q}).json()
        chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": Q}]})
    assert (body["generator"], body["finish_reason"]) == ("extractive", "stop")
    assert chat.json()["choices"][0]["finish_reason"] == "stop"
    ChatCompletion.model_validate(chat.json())


def test_chat_completions_pass_length_through_to_the_openai_client(
    tmp_path: Path, scripted_llm: ScriptedLLM
) -> None:
    svc = make_service(tmp_path, **{"llm.base_url": scripted_llm.url})
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        messages: Any = [{"role": "user", "content": Q}]
        scripted_llm.script(Reply(body=completion("Rotate it", finish_reason="length")))
        raw = client.chat.completions.with_raw_response.create(
            model="streamrag", messages=messages, max_tokens=2
        )
        assert raw.parse().choices[0].finish_reason == "length"
        ChatCompletion.model_validate(raw.http_response.json())  # the body as sent

        scripted_llm.script(Reply(stream=chunks("Rotate", " it", finish_reason="length")))
        stream = client.chat.completions.create(
            model="streamrag", messages=messages, max_tokens=2, temperature=0.3, stream=True
        )
        reasons = [c.choices[0].finish_reason for c in stream if c.choices]
        assert reasons[-1] == "length"
        assert set(reasons[:-1]) == {None}
        client.close()
