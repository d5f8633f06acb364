"""The remote embedders against real servers on 127.0.0.1.

A real ``streamrag serve`` answers ``/v1/embeddings`` with the hashing embedder:
the OpenAI-compatible embedder must give its vectors. The faults come from a
small real HTTP server scripted here (it speaks OpenAI's ``/v1/embeddings`` and
TEI's ``/embed``): 429 with ``Retry-After``, 503s, a hang past the timeout, a
400. Back-off waits are recorded through ``sleep=``, never waited.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamrag.embed import HashingEmbedder, build_embedder
from streamrag.embed.remote import OpenAIEmbedder, TEIEmbedder
from streamrag.errors import ConfigError, EmbedderError
from tests.e2e.conftest import Server, free_port

pytestmark = pytest.mark.timeout(120)

DIM = 8
TEXTS = [f"text number {i} about topic {i % 3}" for i in range(10)]
KEY = "sk-test-7d1f0c9e4b"


@contextlib.contextmanager
def serving_streamrag(tmp: Path, dim: int = 64) -> Iterator[str]:
    """A real ``streamrag serve`` with the hashing embedder; yields its base url."""
    inbox = tmp / "inbox"
    inbox.mkdir(exist_ok=True)
    cfg = tmp / "serve.yaml"
    cfg.write_text(
        f"source: {{path: {inbox}}}\nstate_dir: {tmp / 'state'}\n"
        f"embedder: {{class: hashing, args: {{dim: {dim}}}}}\n"
    )
    port = free_port()
    server = Server(
        ["serve", "--config", str(cfg), "--port", str(port)], port, tmp, tmp / "serve.log"
    )
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


# -- a scripted embedding server ------------------------------------------------------


@dataclass
class Reply:
    """One scripted answer; ``hang`` holds it until the test ends (or 10 s)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None  # None: the real vectors for the request
    hang: bool = False


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class Scripted:
    """A real HTTP server speaking OpenAI's and TEI's protocols, answering from a script."""

    def __init__(self, model_id: str = "BAAI/bge-small-en-v1.5") -> None:
        self.script: list[Reply] = []
        self.seen: list[Seen] = []
        self.model_id = model_id
        self.in_flight = 0
        self.max_in_flight = 0
        self.overlap = 1  # a request waits (up to 0.5 s) until this many are in flight
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.local = HashingEmbedder(dim=DIM)
        handler = self._handler()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def expected(self, texts: list[str]) -> np.ndarray:
        return self.local.embed_many(texts)

    def answer(self, path: str, body: Any) -> tuple[int, dict[str, str], str]:
        with self.cond:
            reply = self.script.pop(0) if self.script else Reply()
        if reply.hang:
            self.release.wait(10)
        if reply.body is not None or reply.status != 200:
            return reply.status, reply.headers, reply.body or ""
        if path == "/info":
            return 200, {}, json.dumps({"model_id": self.model_id})
        if path == "/embed":
            vectors = (3 * self.expected(body["inputs"])).tolist()  # TEI: a list of vectors
            return 200, reply.headers, json.dumps(vectors)
        vectors = (3 * self.expected(body["input"])).tolist()  # not unit: the client normalizes
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        data.reverse()  # out of order: the client sorts by index
        return 200, reply.headers, json.dumps({"object": "list", "data": data, "model": "m"})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self._serve(json.loads(self.rfile.read(length)))

            def _serve(self, body: Any) -> None:
                with scripted.cond:
                    scripted.seen.append(Seen(self.path, dict(self.headers), body))
                    scripted.in_flight += 1
                    scripted.max_in_flight = max(scripted.max_in_flight, scripted.in_flight)
                    scripted.cond.notify_all()
                    scripted.cond.wait_for(
                        lambda: scripted.in_flight >= scripted.overlap, timeout=0.5
                    )
                try:
                    status, headers, text = scripted.answer(self.path, body)
                    data = text.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (a timeout)
                finally:
                    with scripted.cond:
                        scripted.in_flight -= 1

        return Handler

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.path != "/info"]

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    server = Scripted()
    yield server
    server.close()


class Waits(list[float]):
    """A ``sleep`` that records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def close_after() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for emb in made:
        emb.close()


def _openai(scripted: Scripted, made: list[Any], **kwargs: Any) -> OpenAIEmbedder:
    kwargs.setdefault("sleep", Waits())
    emb = OpenAIEmbedder(scripted.url, "m", **kwargs)
    made.append(emb)
    return emb


# -- a real streamrag server ----------------------------------------------------------


@pytest.fixture(scope="module")
def streamrag_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving_streamrag(tmp_path_factory.mktemp("serve")) as url:
        yield url


@pytest.mark.slow
def test_vectors_from_a_real_streamrag_server_equal_the_local_embedder(
    streamrag_url: str, close_after: list[Any]
) -> None:
    emb = OpenAIEmbedder(streamrag_url, model="x", batch_size=4)
    close_after.append(emb)
    posts: list[int] = []
    post = emb._client.post

    def counting(url: str, **kwargs: Any) -> Any:
        posts.append(len(kwargs["json"]["input"]))
        return post(url, **kwargs)

    emb._client.post = counting  # type: ignore[method-assign]
    assert emb.dim == 64  # asked of the server: one call
    assert emb.version == "openai:x:d64"
    got = emb.embed_many(TEXTS)
    assert sorted(posts) == [1, 2, 4, 4]  # the probe, then 10 texts in batches of 4
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, HashingEmbedder(dim=64).embed_many(TEXTS), atol=1e-6)
    # A url that already ends in /v1 (as the openai client wants it) works the same.
    v1 = OpenAIEmbedder(streamrag_url + "/v1/", model="x", dim=64)
    close_after.append(v1)
    np.testing.assert_allclose(v1.embed_many(TEXTS[:3]), got[:3], atol=1e-6)


# -- retries ----------------------------------------------------------------------------


def test_429_waits_as_retry_after_says_then_succeeds(
    scripted: Scripted, close_after: list[Any]
) -> None:
    emb = _openai(scripted, close_after, dim=DIM, backoff_s=0.01)
    scripted.script = [Reply(429, {"Retry-After": "1"}, '{"error": "slow down"}')]
    got = emb.embed_many(TEXTS[:3])
    np.testing.assert_allclose(got, scripted.expected(TEXTS[:3]), atol=1e-6)
    assert emb._sleep == [1.0]
    assert len(scripted.posts()) == 2


def test_503_twice_backs_off_exponentially_then_succeeds(
    scripted: Scripted, close_after: list[Any]
) -> None:
    emb = _openai(scripted, close_after, dim=DIM, backoff_s=0.5)
    scripted.script = [Reply(503, body="busy"), Reply(503, body="busy")]
    got = emb.embed_many(TEXTS[:2])
    np.testing.assert_allclose(got, scripted.expected(TEXTS[:2]), atol=1e-6)
    assert emb._sleep == [0.5, 1.0]
    assert len(scripted.posts()) == 3


def test_waits_are_capped_and_retry_after_may_be_a_date(
    scripted: Scripted, close_after: list[Any]
) -> None:
    emb = _openai(scripted, close_after, dim=DIM, attempts=6, backoff_s=1, max_backoff_s=3)
    soon = email.utils.formatdate(time.time() + 2.5, usegmt=True)
    scripted.script = [
        Reply(429, {"Retry-After": "3600"}, "later"),  # capped at max_backoff_s
        Reply(503, {"Retry-After": soon}, "later"),  # an HTTP date: about 2 s from now
        Reply(502, body="x"),
        Reply(500, body="x"),
        Reply(504, body="x"),
    ]
    emb.embed_many(TEXTS[:1])
    waits = emb._sleep
    assert waits[0] == 3
    assert 0.5 <= waits[1] <= 2.5
    assert waits[2:] == [3, 3, 3]  # 1 * 2**2 = 4 and more, capped
    assert len(scripted.posts()) == 6


def test_giving_up_after_the_attempts_names_the_last_failure(
    scripted: Scripted, close_after: list[Any]
) -> None:
    emb = _openai(scripted, close_after, dim=DIM, attempts=3, backoff_s=0.1)
    scripted.script = [Reply(503, body="overloaded, try later")] * 3
    with pytest.raises(EmbedderError, match=r"failed 3 times.*HTTP 503.*overloaded"):
        emb.embed_many(TEXTS[:2])
    assert emb._sleep == [0.1, 0.2]
    assert len(scripted.posts()) == 3


def test_a_hang_past_the_timeout_is_retried(scripted: Scripted, close_after: list[Any]) -> None:
    emb = _openai(scripted, close_after, dim=DIM, timeout_s=0.3, backoff_s=0.05)
    scripted.script = [Reply(hang=True)]
    start = time.monotonic()
    got = emb.embed_many(TEXTS[:2])
    assert time.monotonic() - start < 5  # the hung request was abandoned after 0.3 s
    np.testing.assert_allclose(got, scripted.expected(TEXTS[:2]), atol=1e-6)
    assert emb._sleep == [0.05]
    assert len(scripted.posts()) == 2


def test_a_400_is_not_retried(scripted: Scripted, close_after: list[Any]) -> None:
    emb = _openai(scripted, close_after, dim=DIM)
    scripted.script = [Reply(400, body='{"error": {"message": "input is too long"}}')]
    with pytest.raises(EmbedderError, match=r"HTTP 400.*input is too long"):
        emb.embed_many(TEXTS[:2])
    assert len(scripted.posts()) == 1
    assert emb._sleep == []


def test_a_server_that_is_not_there_is_retried_then_an_error(close_after: list[Any]) -> None:
    emb = OpenAIEmbedder(f"http://127.0.0.1:{free_port()}", "m", dim=DIM, attempts=2, sleep=Waits())
    close_after.append(emb)
    with pytest.raises(EmbedderError, match=r"failed 2 times.*connection failed"):
        emb.embed_many(["a"])
    assert emb._sleep == [0.5]


def test_answers_that_do_not_fit_are_errors(scripted: Scripted, close_after: list[Any]) -> None:
    emb = _openai(scripted, close_after, dim=DIM)
    one = json.dumps({"data": [{"index": 0, "embedding": [1.0] * DIM}]})
    scripted.script = [Reply(body=one)]
    with pytest.raises(EmbedderError, match="1 embeddings for 2 texts"):
        emb.embed_many(["a", "b"])
    scripted.script = [Reply(body="<html>gateway</html>")]
    with pytest.raises(EmbedderError, match="not JSON"):
        emb.embed_many(["a"])
    wrong_dim = _openai(scripted, close_after, dim=DIM + 1)
    with pytest.raises(EmbedderError, match="shape"):
        wrong_dim.embed_many(["a"])
    assert emb._sleep == []


# -- TEI ------------------------------------------------------------------------------


def test_tei_embeds_through_embed_with_the_same_retries(
    scripted: Scripted, close_after: list[Any]
) -> None:
    waits = Waits()
    emb = TEIEmbedder(scripted.url, batch_size=4, max_concurrency=1, backoff_s=0.25, sleep=waits)
    close_after.append(emb)
    emb.load()
    assert (emb.dim, emb.version) == (DIM, "tei:BAAI/bge-small-en-v1.5:d8")
    scripted.script = [Reply(429, {"Retry-After": "2"}, "queue full"), Reply(503, body="x")]
    got = emb.embed_many(TEXTS)
    np.testing.assert_allclose(got, scripted.expected(TEXTS), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
    assert waits == [2.0, 0.5]  # one batch at a time: the first got both faults
    posts = scripted.posts()
    assert {p.path for p in posts} == {"/embed"}
    assert sorted(len(p.body["inputs"]) for p in posts) == [1, 2, 4, 4, 4, 4]
    assert all(p.body["normalize"] is True and p.body["truncate"] is True for p in posts)
    scripted.script = [Reply(413, body="batch size 40 > maximum allowed batch size 32")]
    with pytest.raises(EmbedderError, match=r"HTTP 413; lower batch_size.*maximum allowed"):
        emb.embed_many(["a"])


# -- the API key ------------------------------------------------------------------------


def test_the_api_key_is_sent_and_never_shown(
    scripted: Scripted,
    close_after: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("STREAMRAG_TEST_KEY", KEY)
    emb = _openai(scripted, close_after, dim=DIM, api_key_env="STREAMRAG_TEST_KEY", attempts=2)
    emb.embed_many(["a"])
    assert scripted.seen[-1].headers["Authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(emb)
    assert KEY not in str(vars(emb))
    caplog.set_level(logging.DEBUG, logger="streamrag.embed.remote")
    echo = f'{{"error": "bad key {KEY}"}}'
    scripted.script = [Reply(503, body=echo), Reply(503, body=echo)]
    with pytest.raises(EmbedderError) as retried:
        emb.embed_many(["a"])
    scripted.script = [Reply(401, body=echo)]
    with pytest.raises(EmbedderError) as refused:
        emb.embed_many(["a"])
    for message in (str(retried.value), str(refused.value), caplog.text):
        assert "bad key ***" in message  # an echo of the key is blanked out
        assert KEY not in message
    assert "HTTP 401" in str(refused.value)
    monkeypatch.delenv("STREAMRAG_TEST_KEY")
    with pytest.raises(ConfigError, match="STREAMRAG_TEST_KEY"):
        OpenAIEmbedder(scripted.url, "m", api_key_env="STREAMRAG_TEST_KEY")


# -- concurrency ------------------------------------------------------------------------


def test_eight_threads_never_exceed_max_concurrency(
    scripted: Scripted, close_after: list[Any]
) -> None:
    emb = _openai(scripted, close_after, dim=DIM, batch_size=1, max_concurrency=3)
    scripted.overlap = 3  # each request waits for company: overlap is sure to happen
    errors: list[BaseException] = []
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        texts = [f"thread {i} text {j}" for j in range(4)]
        try:
            results[i] = emb.embed_many(texts)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(scripted.posts()) == 32
    assert scripted.max_in_flight == 3
    for i, got in results.items():
        expected = scripted.expected([f"thread {i} text {j}" for j in range(4)])
        np.testing.assert_allclose(got, expected, atol=1e-6)


# -- configuration ----------------------------------------------------------------------


def test_built_by_registered_name(scripted: Scripted, close_after: list[Any]) -> None:
    emb = build_embedder("openai", {"url": scripted.url + "/v1", "model": "m", "dim": DIM})
    close_after.append(emb)
    assert isinstance(emb, OpenAIEmbedder)
    assert emb.endpoint == scripted.url + "/v1/embeddings"
    assert emb.version == "openai:m:d8"
    np.testing.assert_allclose(emb.embed_many(["a b"]), scripted.expected(["a b"]), atol=1e-6)
    tei = build_embedder("tei", {"url": scripted.url, "dim": DIM, "version": "my-tei-v1"})
    close_after.append(tei)
    assert isinstance(tei, TEIEmbedder)
    assert tei.version == "my-tei-v1"
    assert scripted.posts()[-1].body["input"] == ["a b"]  # built without a call (dim given)
    with pytest.raises(ConfigError, match=r"embedder\.args"):
        build_embedder("openai", {"url": scripted.url})
