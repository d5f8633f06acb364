"""Real servers on 127.0.0.1 for the answer-side tests.

* ``local_llm`` — llama.cpp (xllamacpp) serving SmolLM2-135M, one per session.
  It tests the protocol, streaming, timeouts and citations; never answer quality.
* ``scripted_llm`` — a small OpenAI-compatible HTTP server that answers each
  request as scripted: a status, a body, a stream that breaks off, or silence.
  It makes the failures a real endpoint has (503s, 429 with Retry-After, a
  connection that never answers) happen on demand.
* ``ThreadedUvicorn`` — streamrag's app under a real uvicorn on a free port.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from streamrag.serve.local_llm import SMOLLM2_FILE, LocalLLM
from tests.e2e.conftest import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / ".models" / SMOLLM2_FILE


@pytest.fixture(scope="session")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLLM]:
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run `make models` (make test does it)")
    log = tmp_path_factory.mktemp("llm") / "llm.log"
    with LocalLLM(MODEL, threads=2, ctx_size=2048, parallel=2, log_path=log) as llm:
        yield llm


# -- a scripted OpenAI-compatible endpoint ------------------------------------------


@dataclass
class Reply:
    """One scripted answer: a status and JSON body, an SSE stream, or silence."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stream: list[str] | None = None  # SSE data payloads, sent in order
    break_after: int | None = None  # close the connection after this many stream events
    hang: bool = False  # accept, read the request, never answer
    gate: threading.Event | None = None  # wait for this before answering


def completion(text: str = "Hello [1]", finish_reason: str = "stop") -> dict[str, Any]:
    """A whole chat completion; ``finish_reason="length"`` as when max_tokens cut it."""
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def chunks(*pieces: str, finish_reason: str = "stop") -> list[str]:
    """A streamed chat completion: role, one chunk per piece, the finish reason, [DONE]."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return json.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "scripted",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    out = [chunk({"role": "assistant", "content": None})]
    out += [chunk({"content": p}) for p in pieces]
    out.append(chunk({}, finish_reason))
    out.append("[DONE]")
    return out


class ScriptedLLM:
    """An HTTP server on 127.0.0.1 that plays ``replies`` in order (the last one repeats)."""

    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply(body=completion())]
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with outer._lock:
                    outer.requests.append(
                        {
                            "path": self.path,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                    reply = outer.replies.pop(0) if len(outer.replies) > 1 else outer.replies[0]
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    outer._play(self, reply)
                finally:
                    with outer._lock:
                        outer.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def script(self, *replies: Reply) -> None:
        self.replies = list(replies)

    def _play(self, h: BaseHTTPRequestHandler, reply: Reply) -> None:
        if reply.gate is not None:
            reply.gate.wait(30)
        if reply.hang:
            self._release.wait(30)
            return
        if reply.stream is not None:
            h.send_response(reply.status)
            h.send_header("content-type", "text/event-stream")
            h.send_header("connection", "close")
            h.end_headers()
            for i, data in enumerate(reply.stream):
                if reply.break_after is not None and i >= reply.break_after:
                    h.wfile.flush()
                    h.connection.shutdown(socket.SHUT_RDWR)
                    return
                h.wfile.write(f": keep-alive\n\ndata: {data}\n\n".encode())
                h.wfile.flush()
            return
        payload = json.dumps(reply.body).encode()
        h.send_response(reply.status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(payload)))
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(payload)

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    server = ScriptedLLM()
    yield server
    server.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (the kernel completes the handshake)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: connections are refused."""
    return free_port()


# -- streamrag under uvicorn ------------------------------------------------------


class ThreadedUvicorn:
    """streamrag's app served by uvicorn on 127.0.0.1 in a thread of this process."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedUvicorn:
        self._thread.start()
        wait_for(lambda: self.server.started, 30, "uvicorn to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(30)
