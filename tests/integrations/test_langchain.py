"""The LangChain retriever against a real ``streamrag serve`` on 127.0.0.1.

What the route returns is what LangChain gets: the same chunks in the same
order, each a ``Document`` whose metadata carries the score and where the chunk
came from; filters, ``time_range``, ``as_of`` and ``epoch`` reach the server; a
refused query raises the streamrag error the server named, with its message.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from langchain_core.documents import Document
from langchain_core.runnables import RunnableLambda

from streamrag.errors import (
    ArgumentError,
    ConfigError,
    QueryError,
    RequestError,
    StreamragError,
)
from streamrag.integrations.langchain import StreamragRetriever
from tests.e2e.conftest import free_port
from tests.integrations.conftest import Served

pytestmark = pytest.mark.timeout(120)

Q = "rotate the database password"
BEST = ["ops/rotate-db-password", "it/db-password-reset", "ops/db-backups"]


def ids(docs: list[Document]) -> list[str]:
    return [d.metadata["doc_id"] for d in docs]


def route(served: Served, **body: Any) -> dict[str, Any]:
    r = served.http.post("/v1/retrieve", json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


@pytest.fixture
def retriever(served: Served) -> Iterator[StreamragRetriever]:
    made = StreamragRetriever(base_url=served.url, k=3)
    yield made
    made.close()


def test_documents_come_back_best_first_with_what_the_route_says(
    served: Served, retriever: StreamragRetriever
) -> None:
    docs = retriever.invoke(Q)
    assert ids(docs) == BEST
    raw = route(served, query=Q, k=3)
    for doc, hit in zip(docs, raw["results"], strict=True):
        assert doc.page_content == hit["text"]
        assert doc.id == hit["chunk_id"]
        own = hit["metadata"] or {}
        fields = ("chunk_id", "doc_id", "tenant", "domain", "position", "score", "event_time")
        expected = {**own, **{f: hit[f] for f in fields}}
        expected |= {"source": hit["source"], "offset": hit["offset"], "epoch": hit["epoch"]}
        expected |= {"embedder": hit["embedder"], "read_epoch": raw["epoch"]}
        assert doc.metadata == expected
    first = docs[0].metadata
    assert first["team"] == "db"
    assert first["year"] == 2024
    assert first["domain"] == "ops"
    assert first["tenant"] == "default"
    assert first["event_time"] == "2024-05-01T00:00:00Z"
    assert first["epoch"] == first["read_epoch"] == served.epoch
    assert first["embedder"] == "hashing-blake2b-v1-d384"
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > scores[1] > 0


def test_filters_reach_the_server(served: Served) -> None:
    ops = StreamragRetriever(base_url=served.url, k=5, filters={"domain": "ops"})
    assert ids(ops.invoke(Q)) == ["ops/rotate-db-password", "ops/db-backups"]
    recent = StreamragRetriever(
        base_url=served.url, k=5, filters={"metadata": {"year": {"gte": 2024}}}
    )
    assert ids(recent.invoke(Q)) == ["ops/rotate-db-password", "it/db-password-reset"]
    acme = StreamragRetriever(base_url=served.url, k=5, filters={"tenant": "acme"})
    [doc] = acme.invoke(Q)
    assert (doc.metadata["doc_id"], doc.metadata["tenant"]) == ("acme/rotate-db-password", "acme")
    # Options given to one call override the retriever's for that call only.
    assert ids(ops.invoke(Q, k=1)) == ["ops/rotate-db-password"]
    assert ids(ops.invoke(Q, filters={"domain": "it"})) == ["it/db-password-reset"]
    assert ids(ops.invoke(Q)) == ["ops/rotate-db-password", "ops/db-backups"]
    for made in (ops, recent, acme):
        made.close()


def test_as_of_time_range_and_epoch_reach_the_server(
    served: Served, retriever: StreamragRetriever
) -> None:
    # kb/refunds was reworded on 1 June; kb/zoom deleted on 17 August.
    [now] = retriever.invoke("refund window", k=1)
    assert now.page_content == "the refund window is thirty days"
    [before] = retriever.invoke("refund window", k=1, as_of="2024-03-01T00:00:00Z")
    assert before.page_content == "the refund window is fourteen days"
    assert "kb/zoom" not in ids(retriever.invoke("zoom disconnecting"))
    then = StreamragRetriever(base_url=served.url, k=1, as_of=datetime(2024, 8, 10, tzinfo=UTC))
    assert ids(then.invoke("zoom disconnecting")) == ["kb/zoom"]
    # Event time in [2 May, 4 May): the backups note and the desk's reset note.
    window = ("2024-05-02T00:00:00Z", datetime(2024, 5, 4, tzinfo=UTC))
    got = ids(retriever.invoke("database", k=5, time_range=window))
    assert got == ["ops/db-backups", "it/db-password-reset"]
    opened = ids(retriever.invoke("database", k=5, time_range={"start": "2024-05-04T00:00:00Z"}))
    assert "ops/db-backups" not in opened
    pinned = StreamragRetriever(base_url=served.url, k=3, epoch=served.epoch)
    assert ids(pinned.invoke(Q)) == BEST
    assert {d.metadata["read_epoch"] for d in pinned.invoke(Q)} == {served.epoch}
    then.close()
    pinned.close()


def test_a_refused_query_raises_the_servers_error_with_its_message(
    served: Served, retriever: StreamragRetriever
) -> None:
    with pytest.raises(QueryError, match=r"epoch 1000000 is not committed yet") as info:
        retriever.invoke(Q, epoch=1_000_000)
    assert f"streamrag at {served.url} answered 400 query_error" in str(info.value)
    with pytest.raises(QueryError, match=r"k=100000 is above serve.max_k"):
        retriever.invoke(Q, k=100_000)
    with pytest.raises(QueryError, match=r"before the retained history"):
        retriever.invoke(Q, as_of="2001-01-01T00:00:00Z")
    # Validation on the server (a 422) is a RequestError, with the field that failed.
    with pytest.raises(RequestError, match=r"as_of.*has no time zone") as bad:
        retriever.invoke(Q, as_of="2024-05-01T00:00:00")
    assert "answered 422 validation_error" in str(bad.value)
    # Caught before sending: a naive datetime, a time_range that is no range.
    with pytest.raises(ArgumentError, match=r"naive datetime"):
        retriever.invoke(Q, as_of=datetime(2024, 5, 1))  # noqa: DTZ001 - the mistake under test
    with pytest.raises(ArgumentError, match=r"takes only 'start' and 'end'"):
        retriever.invoke(Q, time_range={"from": "2024-05-01T00:00:00Z"})


def test_a_server_that_is_not_there_or_not_streamrag_says_so(served: Served) -> None:
    gone = StreamragRetriever(base_url=f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(StreamragError, match=r"could not be reached.*streamrag serve"):
        gone.invoke(Q)
    elsewhere = StreamragRetriever(base_url=f"{served.url}/not-streamrag")
    with pytest.raises(ConfigError, match=r"is not there \(404\)"):
        elsewhere.invoke(Q)
    with pytest.raises(ConfigError, match=r"not an http\(s\) URL"):
        StreamragRetriever(base_url="127.0.0.1:8000")
    for made in (gone, elsewhere):
        made.close()


def test_the_async_path(served: Served) -> None:
    retriever = StreamragRetriever(base_url=f"{served.url}/v1", k=3)  # a /v1 URL works too

    async def main() -> tuple[list[list[Document]], BaseException]:
        together = await asyncio.gather(
            retriever.ainvoke(Q),
            retriever.ainvoke(Q, filters={"domain": "ops"}),
            retriever.ainvoke("refund window", k=1, as_of="2024-03-01T00:00:00Z"),
        )
        try:
            await retriever.ainvoke(Q, epoch=1_000_000)
        except QueryError as exc:
            return list(together), exc
        raise AssertionError("no error for an epoch that is not committed")

    (best, ops, before), err = asyncio.run(main())
    assert ids(best) == BEST
    assert ids(ops) == ["ops/rotate-db-password", "ops/db-backups"]
    assert before[0].page_content == "the refund window is fourteen days"
    assert best[0].metadata == retriever.invoke(Q)[0].metadata
    assert "is not committed yet" in str(err)
    retriever.close()


def test_the_api_key_is_sent_as_a_bearer_token_and_never_shown(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[httpx.Request] = []
    client = httpx.Client(event_hooks={"request": [seen.append]})
    monkeypatch.setenv("STREAMRAG_API_KEY", "sk-env-9a7c")
    from_env = StreamragRetriever(base_url=served.url, http_client=client)
    given = StreamragRetriever(base_url=served.url, api_key="sk-given-1b2d", http_client=client)
    monkeypatch.delenv("STREAMRAG_API_KEY")
    none = StreamragRetriever(base_url=served.url, http_client=client)
    for made in (from_env, given, none):
        assert made.invoke(Q)
    auth = [r.headers.get("authorization") for r in seen]
    assert auth == ["Bearer sk-env-9a7c", "Bearer sk-given-1b2d", None]
    for made in (from_env, given):
        assert "sk-" not in repr(made)
        assert "sk-" not in str(made.model_dump())
    client.close()


def test_it_composes_like_any_langchain_runnable(served: Served) -> None:
    retriever = StreamragRetriever(base_url=served.url, k=2)
    chain = retriever | RunnableLambda(lambda docs: [d.metadata["doc_id"] for d in docs])
    assert chain.invoke(Q) == BEST[:2]
    assert [found[0] for found in chain.batch([Q, "refund window"])] == [BEST[0], "kb/refunds"]
    retriever.close()


def test_importing_streamrag_never_imports_a_framework() -> None:
    code = (
        "import sys, streamrag, streamrag.integrations, streamrag.integrations.client\n"
        "print([m for m in ('langchain_core', 'llama_index') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_langchain_the_import_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['langchain_core'] = None  # as if it were not installed\n"
        "from streamrag.errors import MissingDependencyError\n"
        "try:\n"
        "    import streamrag.integrations.langchain\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs the package 'langchain-core'" in out.stdout
    assert "pip install 'streamrag[langchain]'" in out.stdout
