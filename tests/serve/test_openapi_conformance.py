"""The served OpenAPI description is true: schemathesis checks every route against it.

schemathesis reads ``/openapi.json`` from the app, generates requests from it —
valid ones and ones that break the schema on purpose — sends them to the app
(in process, over ASGI, with its lifespan: a real service with a real index,
pipeline and push journal behind it) and checks every response:

* no 5xx;
* the status code is one the route documents;
* the content type is one documented for that status (``text/event-stream``
  for streamed answers, ``text/plain; version=0.0.4`` for ``/metrics``);
* the body fits the documented schema (the response models, and OpenAI's
  error object for every error);
* the documented headers are there (``Retry-After`` on a 429);
* a request that breaks the schema is refused with a 4xx.

The run is bounded and deterministic: a fixed seed, derandomized generation, no
example database, at most :data:`MAX_EXAMPLES` generated requests per route
(after the documented examples and schemathesis's coverage cases).

One route is left out, on purpose: ``POST /v1/admin/reindex`` starts background
work — it imports the embedder a body names and starts a backfill thread that
builds a whole index generation — which a generated request must not set off
here. Its answers are tested in ``tests/runtime/test_reindex*.py`` and its
documentation is checked below like every route's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.serve import create_app
from streamrag.testing import FakeEmbedder, change_line

MAX_EXAMPLES = 25
"""Generated requests per route (each takes a few milliseconds)."""
LEFT_OUT = ("POST", "/v1/admin/reindex")
"""Starts a backfill: see the module docstring."""

CONFIG = schemathesis.Config.from_dict(
    {
        "seed": 20240501,
        "generation": {
            "mode": "all",
            "max-examples": MAX_EXAMPLES,
            "deterministic": True,
            "database": "none",
        },
        "phases": {"stateful": {"enabled": False}},
    }
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]


def _service(tmp_path: Path) -> Service:
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            change_line(
                f"doc-{i}",
                f"2024-05-0{1 + i % 3}T00:00:00Z",
                f"database password rotation note {i}. Restart the service after it.",
                domain=["ops", "it"][i % 2],
                metadata={"year": 2020 + i},
            )
            + "\n"
            for i in range(12)
        )
    )
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "serve.query_workers": 1,
            "serve.max_body_bytes": 64_000,
            "event_time.windows": [
                {"name": "per_domain_daily", "size_ms": 86_400_000},
                {"name": "per_tenant", "size_ms": 86_400_000, "key": ["tenant", "domain"]},
            ],
        },
        environ={},
    )
    svc = Service(settings, embedder=FakeEmbedder())
    svc.pipeline.run_until_caught_up()
    return svc


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The app's own description, loaded from the app (a running service behind it)."""
    svc = _service(tmp_path_factory.mktemp("conformance"))
    app = create_app(svc)
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
    shutdown_lifespans()  # stops the service, as the server's shutdown would


@pytest.fixture(autouse=True)
def _node_id(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32's pytest integration reads ``Node._nodeid``, which pytest 9.2 renamed."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema").exclude(
    method=LEFT_OUT[0], path=LEFT_OUT[1]
)


@schema.parametrize()
def test_every_response_is_what_the_description_says(case: schemathesis.Case[Any]) -> None:
    case.call_and_validate(checks=CHECKS)


def test_the_description_documents_every_route(api_schema: Any) -> None:
    spec = api_schema.raw_schema
    assert LEFT_OUT[1] in spec["paths"]  # left out of the run, not of the description
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            responses = op["responses"]
            ok = [s for s in responses if s.startswith("2")]
            assert ok, (method, path)
            for status in ok:
                assert responses[status].get("content"), (method, path, status)
            assert "500" in responses, (method, path)
            for status, answer in responses.items():
                if status.startswith(("4", "5")):
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    model = "ValidationErrorResponse" if status == "422" else "ErrorResponse"
                    assert ref == f"#/components/schemas/{model}", (method, path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]  # FastAPI's, unused


def test_times_are_described_as_iso_strings_or_epoch_seconds(api_schema: Any) -> None:
    schemas = api_schema.raw_schema["components"]["schemas"]
    time_types = [
        schemas["RetrievalOptions"]["properties"]["as_of"],
        schemas["RetrieveRequest"]["properties"]["as_of"],
        schemas["TimeRange"]["properties"]["start"],
        schemas["TimeRange"]["properties"]["end"],
    ]
    for prop in time_types:
        kinds = {(t.get("type"), t.get("format")) for t in prop["anyOf"]}
        assert kinds == {("string", "date-time"), ("number", None), ("null", None)}, prop


def test_streams_and_metrics_are_described_with_their_content_types(api_schema: Any) -> None:
    paths = api_schema.raw_schema["paths"]
    for path in ("/v1/answer", "/v1/chat/completions"):
        content = paths[path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(metrics) == {"text/plain; version=0.0.4"}
