r"""A LangChain retriever over a streamrag server's ``POST /v1/retrieve``.

Install with ``pip install 'streamrag[langchain]'`` (LangChain's core package).
:class:`StreamragRetriever` is a LangChain ``BaseRetriever``: ``invoke`` and
``ainvoke`` (and so every chain built on a retriever) return LangChain
``Document``\\ s, best first::

    from streamrag.integrations.langchain import StreamragRetriever

    retriever = StreamragRetriever(base_url="http://127.0.0.1:8000", k=3,
                                   filters={"domain": "ops"})
    docs = retriever.invoke("how do I rotate the database password?")
    docs[0].page_content, docs[0].metadata["doc_id"], docs[0].metadata["score"]

    # per call: any option of the route
    retriever.invoke("the zoom page", k=1, as_of="2024-08-10T00:00:00Z")

Each ``Document`` has the chunk's text as ``page_content``, its chunk id as
``id``, and as ``metadata`` the document's own metadata plus streamrag's fields
(``doc_id``, ``chunk_id``, ``tenant``, ``domain``, ``position``, ``score``,
``event_time``, ``source``, ``offset``, ``epoch``, ``read_epoch``,
``embedder``; see :meth:`~streamrag.integrations.client.Passage.fields`).

Options, errors, connections and the API key (``STREAMRAG_API_KEY``) are those
of :class:`~streamrag.integrations.client.RetrieveClient`: a refused query
raises the streamrag error the server named, with its message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import Field, PrivateAttr, SecretStr

from streamrag.errors import MissingDependencyError
from streamrag.integrations.client import (
    API_KEY_ENV,
    DEFAULT_URL,
    RetrieveClient,
    Retrieved,
    TimeLike,
    TimeRangeLike,
)

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError:  # pragma: no cover - the tests import it without the framework too
    package = "langchain-core"
    raise MissingDependencyError(
        package, "langchain", "The LangChain retriever (streamrag.integrations.langchain)"
    ) from None

__all__ = ["StreamragRetriever", "to_documents"]


def _env_key() -> SecretStr | None:
    key = os.environ.get(API_KEY_ENV)
    return SecretStr(key) if key else None


def to_documents(found: Retrieved) -> list[Document]:
    """LangChain documents for the passages of one answer, in its order."""
    return [
        Document(page_content=p.text, metadata=p.fields(), id=p.chunk_id) for p in found.passages
    ]


class StreamragRetriever(BaseRetriever):
    """Chunks from a streamrag server as LangChain documents (see the module's docs).

    The fields are the route's options and how to reach the server; each
    option may also be given to one call (``invoke(query, k=2)``).
    """

    base_url: str = Field(DEFAULT_URL, description="The server, http://HOST:PORT.")
    k: int = Field(4, ge=1, description="How many chunks to return.")
    filters: dict[str, Any] | None = Field(
        None, description="tenant, domain, doc_id and metadata conditions, as the route takes."
    )
    time_range: TimeRangeLike | None = Field(
        None, description="(start, end) on the documents' event time; None for an open end."
    )
    as_of: TimeLike | None = Field(
        None, description="The documents as they were at this event time."
    )
    epoch: int | None = Field(None, ge=0, description="Read this committed epoch.")
    api_key: SecretStr | None = Field(
        default_factory=_env_key, description=f"Bearer token; defaults to ${API_KEY_ENV}."
    )
    timeout_s: float = Field(10.0, gt=0, description="Connect, read and write timeout.")
    http_client: httpx.Client | None = Field(None, exclude=True)
    http_async_client: httpx.AsyncClient | None = Field(None, exclude=True)

    _client: RetrieveClient = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        """Make the HTTP client once the fields are set."""
        super().model_post_init(context)
        key = self.api_key.get_secret_value() if self.api_key is not None else ""
        self._client = RetrieveClient(
            self.base_url,
            api_key=key,
            timeout_s=self.timeout_s,
            http_client=self.http_client,
            http_async_client=self.http_async_client,
        )

    def close(self) -> None:
        """Close the connections the retriever opened."""
        self._client.close()

    def _options(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {
            "k": self.k,
            "filters": self.filters,
            "time_range": self.time_range,
            "as_of": self.as_of,
            "epoch": self.epoch,
        }
        options.update((name, v) for name, v in overrides.items() if v is not None)
        return options

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: Mapping[str, Any] | None = None,
        time_range: TimeRangeLike | None = None,
        as_of: TimeLike | None = None,
        epoch: int | None = None,
    ) -> list[Document]:
        """Ask the server, and turn what it found into documents."""
        given = {"k": k, "filters": filters, "time_range": time_range, "as_of": as_of}
        options = self._options({**given, "epoch": epoch})
        return to_documents(self._client.retrieve(query, **options))

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filters: Mapping[str, Any] | None = None,
        time_range: TimeRangeLike | None = None,
        as_of: TimeLike | None = None,
        epoch: int | None = None,
    ) -> list[Document]:
        """:meth:`_get_relevant_documents` without blocking the event loop."""
        given = {"k": k, "filters": filters, "time_range": time_range, "as_of": as_of}
        options = self._options({**given, "epoch": epoch})
        return to_documents(await self._client.aretrieve(query, **options))
