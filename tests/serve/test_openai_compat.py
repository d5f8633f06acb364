"""The stock ``openai`` client against streamrag under uvicorn on 127.0.0.1."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.serve.local_llm import LocalLLM
from tests.serve.conftest import ThreadedUvicorn
from tests.serve.test_answer_api import Q, make_service

ACME = {"streamrag": {"k": 3, "filters": {"tenant": "acme"}}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Service, openai.OpenAI]]:
    svc = make_service(tmp_path)
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        yield svc, client
        client.close()


def extra(obj: Any) -> dict[str, Any]:
    """The ``streamrag`` field streamrag adds to OpenAI's objects."""
    block = (obj.model_extra or {}).get("streamrag")
    assert block is not None
    return block  # type: ignore[no-any-return]


def test_embeddings_match_the_index_embedder(served: tuple[Service, openai.OpenAI]) -> None:
    svc, client = served
    texts = ["rotate the database password", "parental leave"]
    expected = svc.embed_many(texts)
    # Left to itself the client asks for base64 and decodes it; floats when asked.
    for resp in (
        client.embeddings.create(model="any", input=texts),
        client.embeddings.create(model="any", input=texts, encoding_format="float"),
    ):
        got = np.asarray([d.embedding for d in resp.data], dtype=np.float32)
        assert [d.index for d in resp.data] == [0, 1]
        np.testing.assert_allclose(got, expected, atol=1e-6)
    raw = client.embeddings.create(model="any", input=texts, encoding_format="base64")
    decoded = np.frombuffer(base64.b64decode(raw.data[1].embedding), dtype="<f4")  # type: ignore[arg-type]
    np.testing.assert_allclose(decoded, expected[1], atol=1e-6)
    one = client.embeddings.create(model="any", input="rotate the database password")
    np.testing.assert_allclose(one.data[0].embedding, expected[0], atol=1e-6)
    assert one.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError, match="the token id 100300, which cl100k_base"):
        client.embeddings.create(model="any", input=[[1, 2, 100_300]])


def test_chat_completions_whole_and_streamed(served: tuple[Service, openai.OpenAI]) -> None:
    _, client = served
    messages: Any = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": Q},
    ]
    whole = client.chat.completions.create(model="streamrag", messages=messages, extra_body=ACME)
    assert whole.object == "chat.completion"
    answer = whole.choices[0].message.content
    assert answer
    assert "[1]" in answer
    assert whole.choices[0].finish_reason == "stop"
    info = extra(whole)
    assert info["generator"] == "extractive"
    assert info["citations"][0]["doc_id"] == "runbook-1"

    stream = client.chat.completions.create(
        model="streamrag",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"streamrag": {"k": 3, "filters": {"tenant": "acme"}}},
    )
    got = list(stream)
    assert got[0].choices[0].delta.role == "assistant"
    assert extra(got[0])["citations"] == info["citations"]
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    assert text == answer
    finals = [c for c in got if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(finals) == 1
    assert extra(finals[0])["cached"] == "exact"
    assert got[-1].choices == []
    assert got[-1].usage is not None
    assert len({c.id for c in got}) == 1


def test_chat_refuses_what_it_cannot_answer(served: tuple[Service, openai.OpenAI]) -> None:
    _, client = served
    with pytest.raises(openai.BadRequestError, match="no user message"):
        client.chat.completions.create(
            model="streamrag", messages=[{"role": "system", "content": "hi"}]
        )
    assert [m.id for m in client.models.list()] == ["streamrag"]


def test_chat_through_a_real_llm(tmp_path: Path, local_llm: LocalLLM) -> None:
    svc = make_service(
        tmp_path,
        **{
            "llm.base_url": local_llm.base_url,
            "llm.max_tokens": 8,
            "llm.tokenizer": "server",
            "answer.context.max_tokens": 60,
        },
    )
    with ThreadedUvicorn(create_app(svc, manage_service=False)) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        messages: Any = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "Hi. Ask me about the runbooks."},
            {"role": "user", "content": Q},
        ]
        whole = client.chat.completions.create(
            model="streamrag", messages=messages, max_tokens=6, extra_body=ACME
        )
        assert extra(whole)["generator"] == "llm"
        assert 0 < whole.usage.completion_tokens <= 6  # type: ignore[union-attr]
        # The LLM's own finish reason: "length" when it was cut at max_tokens.
        cut = whole.usage.completion_tokens == 6  # type: ignore[union-attr]
        assert whole.choices[0].finish_reason == ("length" if cut else "stop")
        assert extra(whole)["citations"][0]["doc_id"] == "runbook-1"

        chunks = list(
            client.chat.completions.create(
                model="streamrag",
                messages=messages,
                max_tokens=6,
                temperature=0.5,  # another cache scope: the LLM writes again
                stream=True,
                extra_body=ACME,
            )
        )
        assert extra(chunks[0])["generator"] == "llm"
        assert extra(chunks[0])["cached"] is None
        pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices[0].delta.content]
        assert pieces  # the LLM's tokens arrive as they are written
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        client.close()
