"""The LlamaIndex retriever against a real ``streamrag serve`` on 127.0.0.1.

Each hit is a ``NodeWithScore`` over a ``TextNode``: the chunk's text and id,
the document as its source node, the route's fields as metadata (bookkeeping
ones kept out of what an LLM is shown); filters, ``time_range``, ``as_of`` and
``epoch`` reach the server; errors are the server's, as streamrag errors.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from streamrag.errors import ArgumentError, QueryError, RequestError
from streamrag.integrations.llamaindex import HIDDEN_KEYS, StreamragRetriever
from tests.integrations.conftest import Served

pytestmark = pytest.mark.timeout(120)

Q = "rotate the database password"
BEST = ["ops/rotate-db-password", "it/db-password-reset", "ops/db-backups"]


def ids(hits: list[NodeWithScore]) -> list[str]:
    return [h.node.metadata["doc_id"] for h in hits]


def retriever(served: Served, **options: Any) -> StreamragRetriever:
    return StreamragRetriever(served.url, **options)


def test_nodes_come_back_best_first_with_what_the_route_says(served: Served) -> None:
    r = retriever(served, k=3)
    hits = r.retrieve(Q)
    assert ids(hits) == BEST
    raw = served.http.post("/v1/retrieve", json={"query": Q, "k": 3}).json()
    for hit, chunk in zip(hits, raw["results"], strict=True):
        node = hit.node
        assert isinstance(node, TextNode)
        assert node.text == chunk["text"]
        assert node.node_id == chunk["chunk_id"]
        assert node.ref_doc_id == chunk["doc_id"]
        assert hit.score == chunk["score"]
        for key in ("doc_id", "tenant", "domain", "position", "event_time", "source", "epoch"):
            assert node.metadata[key] == chunk[key], key
        assert node.metadata["embedder"] == chunk["embedder"]
        assert node.metadata["read_epoch"] == raw["epoch"]
        for key, value in (chunk["metadata"] or {}).items():
            assert node.metadata[key] == value
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    # What an LLM is shown: the text, with the document's id and metadata, not bookkeeping.
    shown = hits[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert "rotate the database password every month" in shown
    assert "doc_id: ops/rotate-db-password" in shown
    assert "team: db" in shown
    assert "event_time: 2024-05-01T00:00:00Z" in shown
    for key in HIDDEN_KEYS:
        assert f"{key}:" not in shown, key
    r.close()


def test_filters_as_of_time_range_and_epoch_reach_the_server(served: Served) -> None:
    ops = retriever(served, k=5, filters={"domain": "ops"})
    assert ids(ops.retrieve(Q)) == ["ops/rotate-db-password", "ops/db-backups"]
    acme = retriever(served, k=5, filters={"tenant": "acme", "doc_id": ["acme/rotate-db-password"]})
    assert ids(acme.retrieve(QueryBundle(Q))) == ["acme/rotate-db-password"]
    before = retriever(served, k=1, as_of="2024-03-01T00:00:00Z")
    assert before.retrieve("refund window")[0].node.get_content() == (
        "the refund window is fourteen days"
    )
    assert ids(retriever(served, k=1, as_of=1723248000).retrieve("zoom disconnecting")) == [
        "kb/zoom"  # epoch seconds of 2024-08-10: before the page was deleted
    ]
    assert "kb/zoom" not in ids(retriever(served, k=3).retrieve("zoom disconnecting"))
    window = retriever(
        served, k=5, time_range=(datetime(2024, 5, 2, tzinfo=UTC), "2024-05-04T00:00:00Z")
    )
    assert ids(window.retrieve("database")) == ["ops/db-backups", "it/db-password-reset"]
    pinned = retriever(served, k=3, epoch=served.epoch)
    assert ids(pinned.retrieve(Q)) == BEST


def test_a_refused_query_raises_the_servers_error_with_its_message(served: Served) -> None:
    with pytest.raises(QueryError, match=r"epoch 1000000 is not committed yet") as info:
        retriever(served, epoch=1_000_000).retrieve(Q)
    assert "answered 400 query_error" in str(info.value)
    with pytest.raises(RequestError, match=r"tenant is blank"):
        retriever(served, filters={"tenant": " "}).retrieve(Q)
    with pytest.raises(ArgumentError, match=r"k=0; ask for at least one chunk"):
        retriever(served, k=0)


def test_the_async_path(served: Served) -> None:
    r = retriever(served, k=3)

    async def main() -> tuple[list[list[NodeWithScore]], BaseException]:
        together = await asyncio.gather(
            r.aretrieve(Q), retriever(served, k=5, filters={"domain": "ops"}).aretrieve(Q)
        )
        try:
            await retriever(served, epoch=1_000_000).aretrieve(Q)
        except QueryError as exc:
            return list(together), exc
        raise AssertionError("no error for an epoch that is not committed")

    (best, ops), err = asyncio.run(main())
    assert ids(best) == BEST
    assert [h.score for h in best] == [h.score for h in r.retrieve(Q)]
    assert ids(ops) == ["ops/rotate-db-password", "ops/db-backups"]
    assert "is not committed yet" in str(err)
    r.close()


def test_without_llama_index_the_import_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['llama_index'] = None  # as if it were not installed\n"
        "from streamrag.errors import MissingDependencyError\n"
        "try:\n"
        "    import streamrag.integrations.llamaindex\n"
        "except MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs the package 'llama-index-core'" in out.stdout
    assert "pip install 'streamrag[llamaindex]'" in out.stdout
