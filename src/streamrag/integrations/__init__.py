"""Retrievers for the frameworks applications are already built on, over streamrag's HTTP API.

* :mod:`streamrag.integrations.client` — :class:`RetrieveClient`, ``POST /v1/retrieve``
  over httpx; needs nothing more.
* :mod:`streamrag.integrations.langchain` — a LangChain ``BaseRetriever``
  (``pip install 'streamrag[langchain]'``).
* :mod:`streamrag.integrations.llamaindex` — a LlamaIndex ``BaseRetriever``
  (``pip install 'streamrag[llamaindex]'``).

Each retriever sends a query with its options (``k``, ``filters``,
``time_range``, ``as_of``, ``epoch``) to a running ``streamrag serve`` and
returns the framework's own documents, best first, with the chunk's score and
where it came from in their metadata. A framework is imported only by its own
module, so ``import streamrag`` (or this package) never loads one; importing a
module whose framework is missing raises
:class:`~streamrag.errors.MissingDependencyError` with the ``pip install`` that
fixes it.

LangChain's stock ``OpenAIEmbeddings`` needs no adapter: it talks to streamrag's
``/v1/embeddings`` as it is (see ``docs/integrations.md``).
"""

from __future__ import annotations

from streamrag.integrations.client import Passage, RetrieveClient, Retrieved

__all__ = ["Passage", "RetrieveClient", "Retrieved"]
