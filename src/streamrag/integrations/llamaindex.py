r"""A LlamaIndex retriever over a streamrag server's ``POST /v1/retrieve``.

Install with ``pip install 'streamrag[llamaindex]'`` (``llama-index-core``).
:class:`StreamragRetriever` is a LlamaIndex ``BaseRetriever``: ``retrieve`` and
``aretrieve`` return ``NodeWithScore``\\ s, best first, and it plugs into a
query engine like any other retriever::

    from llama_index.core.query_engine import RetrieverQueryEngine
    from streamrag.integrations.llamaindex import StreamragRetriever

    retriever = StreamragRetriever(base_url="http://127.0.0.1:8000", k=3,
                                   filters={"domain": "ops"})
    for hit in retriever.retrieve("how do I rotate the database password?"):
        print(hit.score, hit.node.metadata["doc_id"], hit.node.get_content())
    engine = RetrieverQueryEngine.from_args(retriever, llm=...)

Each node is a ``TextNode`` whose id is the chunk id, whose source node
(``ref_doc_id``) is the document id, and whose metadata is the document's own
plus streamrag's fields (see
:meth:`~streamrag.integrations.client.Passage.fields`). The bookkeeping fields
(:data:`HIDDEN_KEYS`: chunk id, position, score, source offset, epochs, embedder)
are kept out of the text LlamaIndex shows an LLM or an embedder; the document
id, tenant, domain, event time, source and the document's metadata stay in it.

Options, errors, connections and the API key (``STREAMRAG_API_KEY``) are those
of :class:`~streamrag.integrations.client.RetrieveClient`: a refused query
raises the streamrag error the server named, with its message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from streamrag.errors import ArgumentError, MissingDependencyError
from streamrag.integrations.client import (
    DEFAULT_URL,
    RetrieveClient,
    Retrieved,
    TimeLike,
    TimeRangeLike,
)

try:
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.schema import (
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
except ImportError:  # pragma: no cover - the tests import it without the framework too
    package = "llama-index-core"
    raise MissingDependencyError(
        package, "llamaindex", "The LlamaIndex retriever (streamrag.integrations.llamaindex)"
    ) from None

__all__ = ["HIDDEN_KEYS", "StreamragRetriever", "to_nodes"]

HIDDEN_KEYS = ("chunk_id", "position", "score", "offset", "epoch", "read_epoch", "embedder")
"""Metadata keys left out of the node text an LLM or embedder sees."""


def to_nodes(found: Retrieved) -> list[NodeWithScore]:
    """LlamaIndex nodes, with their scores, for the passages of one answer, in its order."""
    return [
        NodeWithScore(
            node=TextNode(
                id_=p.chunk_id,
                text=p.text,
                metadata=p.fields(),
                relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=p.doc_id)},
                excluded_llm_metadata_keys=list(HIDDEN_KEYS),
                excluded_embed_metadata_keys=list(HIDDEN_KEYS),
            ),
            score=p.score,
        )
        for p in found.passages
    ]


class StreamragRetriever(BaseRetriever):
    """Chunks from a streamrag server as LlamaIndex nodes (see the module's docs).

    Args:
        base_url: The server, ``http://HOST:PORT`` (a trailing ``/v1`` is fine).
        k: How many chunks to return.
        filters: ``tenant``, ``domain``, ``doc_id`` and ``metadata`` conditions,
            as the route takes them.
        time_range: ``(start, end)`` on the documents' event time.
        as_of: The documents as they were at this event time.
        epoch: Read this committed epoch.
        api_key: Sent as a bearer token; ``None`` reads ``STREAMRAG_API_KEY``.
        timeout_s: Limit for connecting and for each read and write, in seconds.
        http_client: An ``httpx.Client`` to send synchronous requests with.
        http_async_client: An ``httpx.AsyncClient`` to send asynchronous ones with.
        callback_manager: LlamaIndex's callbacks for this retriever.
        verbose: LlamaIndex's verbose flag.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        k: int = 4,
        filters: Mapping[str, Any] | None = None,
        time_range: TimeRangeLike | None = None,
        as_of: TimeLike | None = None,
        epoch: int | None = None,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        http_client: httpx.Client | None = None,
        http_async_client: httpx.AsyncClient | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if k < 1:
            msg = f"k={k}; ask for at least one chunk"
            raise ArgumentError(msg)
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        self.client = RetrieveClient(
            base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            http_client=http_client,
            http_async_client=http_async_client,
        )
        self.options: dict[str, Any] = {
            "k": k,
            "filters": filters,
            "time_range": time_range,
            "as_of": as_of,
            "epoch": epoch,
        }

    def close(self) -> None:
        """Close the connections the retriever opened."""
        self.client.close()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """Ask the server, and turn what it found into nodes."""
        return to_nodes(self.client.retrieve(query_bundle.query_str, **self.options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        """:meth:`_retrieve` without blocking the event loop."""
        return to_nodes(await self.client.aretrieve(query_bundle.query_str, **self.options))
