"""Stage ⑩ of the data path: the HTTP query API (FastAPI on uvicorn).

Retrieval: :mod:`.retrieve` (the lean ``/v1/retrieve`` path) and :mod:`.batcher`
(concurrent queries → one embedding call and one search). Answers:
:mod:`.answer` wires the semantic cache (:mod:`.cache`), context assembly
(:mod:`.context`, :mod:`.tokens`), prompt safety (:mod:`.safety`,
:mod:`.prompt`) and a generator — any OpenAI-compatible LLM (:mod:`.generator`)
or the extractive answerer (:mod:`.extractive`). :mod:`.openai_api` offers
OpenAI-compatible routes; :mod:`.local_llm` runs a llama.cpp server for a demo.
"""

from streamrag.serve.app import create_app

__all__ = ["create_app"]
