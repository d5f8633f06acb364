"""Embedders that call an embedding server over HTTP: OpenAI-compatible, and TEI.

Two protocols cover nearly every embedding server:

* **OpenAI's** ``POST /v1/embeddings`` with ``{"model": ..., "input": [texts]}``,
  answered ``{"data": [{"index": i, "embedding": [...]}, ...]}``
  (:class:`OpenAIEmbedder`). OpenAI itself speaks it, and so do vLLM
  (``vllm serve MODEL --task embed``), Ollama's OpenAI route
  (``http://HOST:11434/v1``), LiteLLM's proxy, and streamrag's own
  ``/v1/embeddings`` (another streamrag job's embedder, shared).
* **Hugging Face Text Embeddings Inference**'s ``POST /embed`` with
  ``{"inputs": [texts], "normalize": true, "truncate": true}``, answered with a
  JSON list of vectors (:class:`TEIEmbedder`). TEI refuses batches larger than
  its ``--max-client-batch-size`` (32 by default), hence that default here.

``url`` is the server's base (``http://127.0.0.1:8000``); one already ending in
``/v1`` (or in the route itself) is accepted too. Texts go in batches of
``batch_size``; the batches of one call go out in parallel, and at most
``max_concurrency`` requests are in flight at once for the whole embedder, however
many threads share it (the ingest thread and the query workers do).

**Retries.** A 429, a 5xx, a timeout (``timeout_s`` each for connecting,
sending, waiting for a byte) or a broken connection is retried, up to
``attempts`` tries in all, after ``backoff_s``, then twice as long each time, at
most ``max_backoff_s``. A ``Retry-After`` header (seconds or an HTTP date) sets
the wait instead, within the same cap. Any other 4xx is the request's fault and
is not retried: :class:`~streamrag.errors.EmbedderError` names the status and
the start of the body. So does the last failure once the tries are spent.

**Poison texts are not handled here.** The pipeline wraps every embedder with
:func:`streamrag.embed.resilient.embed_resilient`, which retries whole batches
again and bisects a failing one to set aside the text that cannot be embedded
(a 400 for one over-long text, say). These retries only smooth over a
server's brief troubles within one call. With ``embedder.timeout_s`` set, the
pipeline abandons a call that overruns it: keep that above ``attempts`` times
``timeout_s`` plus the waits, or pass ``attempts=1`` and let the pipeline retry.

**The API key** is read from the environment variable named by ``api_key_env``
and sent as ``Authorization: Bearer``; it never appears in ``repr``, logs or
error messages. ``dim`` is asked of the server with one call (``load()``, or the
first read of ``dim``) unless given; give it to build the job while the server
is down. ``version`` (recorded with every chunk) names the protocol, the model
and the dimension, ``openai:<model>:d<dim>``, unless given.
"""

from __future__ import annotations

import base64
import concurrent.futures
import email.utils
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import numpy.typing as npt

from streamrag.embed.base import check_vectors
from streamrag.errors import ArgumentError, ConfigError, EmbedderError

__all__ = ["OpenAIEmbedder", "TEIEmbedder"]

log = logging.getLogger("streamrag.embed.remote")

_PROBE = "dimension probe"
_BODY_START = 200


class _Retry(Exception):
    """A failure worth another try; ``wait`` is what the server asked for, if anything."""

    def __init__(self, reason: str, wait: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.wait = wait


class _Secret:
    """A value that shows as ``***`` wherever it is printed (repr, logs, tracebacks)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


def _retry_after(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delay-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _redact_url(url: str) -> str:
    """``url`` without a user or password in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, ""))


class _RemoteEmbedder:
    """What both protocols share: batching, concurrency, timeouts, retries, the key."""

    _route = ""
    _protocol = ""
    model: str | None = None
    holds_gil = False
    """Waits on the network with the interpreter lock released: no worker process."""
    in_process = False
    """A call waits on the network (see :func:`streamrag.embed.base.in_process`)."""

    def __init__(
        self,
        url: str,
        *,
        dim: int | None,
        api_key_env: str | None,
        batch_size: int,
        timeout_s: float,
        max_concurrency: int,
        attempts: int,
        backoff_s: float,
        max_backoff_s: float,
        version: str | None,
        sleep: Callable[[float], None],
        space: str | None = None,
    ) -> None:
        for name, value in (
            ("batch_size", batch_size),
            ("max_concurrency", max_concurrency),
            ("attempts", attempts),
        ):
            if value < 1:
                msg = f"{name} must be at least 1, found {value}"
                raise ArgumentError(msg)
        if timeout_s <= 0 or backoff_s < 0 or max_backoff_s < 0:
            msg = (
                f"timeout_s must be positive and the back-offs not negative, found "
                f"timeout_s={timeout_s}, backoff_s={backoff_s}, max_backoff_s={max_backoff_s}"
            )
            raise ArgumentError(msg)
        if dim is not None and dim < 1:
            msg = f"dim must be positive, found {dim}"
            raise ArgumentError(msg)
        self.base_url = self._base(url)
        self.endpoint = self.base_url + self._route
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.api_key_env = api_key_env
        self._dim = dim
        self._version = version
        self._space = space
        self._sleep = sleep
        headers = {"Accept": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                msg = (
                    f"config key 'embedder.args.api_key_env' = {api_key_env!r}: "
                    "that environment variable is not set or empty; set it to the API key"
                )
                raise ConfigError(msg)
            headers["Authorization"] = f"Bearer {key}"
            self._secret: _Secret | None = _Secret(key)
        else:
            self._secret = None
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        )
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._load_lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    # -- what subclasses say -------------------------------------------------------

    def _base(self, url: str) -> str:
        url = url.strip().rstrip("/")
        if url.endswith(self._route):
            url = url[: -len(self._route)]
        return url

    def _payload(self, texts: list[str]) -> dict[str, Any]:
        raise NotImplementedError

    def _vectors(self, body: Any, n: int) -> list[Any]:
        raise NotImplementedError

    def _model_name(self) -> str:
        raise NotImplementedError

    # -- the Embedder protocol -----------------------------------------------------

    @property
    def dim(self) -> int:
        """Vector length: as given, or asked of the server with one call."""
        if self._dim is None:
            self.load()
        assert self._dim is not None
        return self._dim

    @property
    def version(self) -> str:
        """``<protocol>:<model>:d<dim>`` unless given: which model made a vector."""
        if self._version is not None:
            return self._version
        return f"{self._protocol}:{self._model_name()}:d{self.dim}"

    @property
    def space(self) -> str:
        """The vector space (the model) as given, else :attr:`version`.

        Name the model when a local embedder of the same model is the fallback
        (``space: all-MiniLM-L6-v2``): see :mod:`streamrag.embed.choice`.
        """
        return self._space or self.version

    def load(self) -> None:
        """Ask the server for the dimension now (one call) if it was not given."""
        self._model_name()
        with self._load_lock:
            if self._dim is None:
                rows = self._post([_PROBE])
                if len(rows) != 1 or not isinstance(rows[0], list | np.ndarray) or not len(rows[0]):
                    msg = f"{self._who()} answered no vector for one text; check the model"
                    raise EmbedderError(msg)
                self._dim = len(rows[0])
                log.info("%s makes %d-dimensional vectors", self._who(), self._dim)

    def embed_many(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Unit float32 rows, one per text, in order; batches go out in parallel."""
        dim = self.dim
        texts = list(texts)
        n = len(texts)
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32)
        batches = [texts[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        if len(batches) == 1:
            parts = [self._embed_batch(batches[0])]
        else:
            pool = self._executor()
            parts = list(pool.map(self._embed_batch, batches))
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def close(self) -> None:
        """Close the connections and the worker threads."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None
        self._client.close()

    # -- internals -----------------------------------------------------------------

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.max_concurrency, "streamrag-remote-embed"
                )
            return self._pool

    def _embed_batch(self, texts: list[str]) -> npt.NDArray[np.float32]:
        rows = self._post(texts)
        assert self._dim is not None
        try:
            arr = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError):
            msg = f"{self._who()} answered vectors of different lengths or non-numbers"
            raise EmbedderError(msg) from None
        return check_vectors(arr, len(texts), self._dim, self._who())

    def _post(self, texts: list[str]) -> list[Any]:
        """The server's vectors for ``texts``, retried as the module doc says."""
        payload = self._payload(texts)
        attempt = 1
        while True:
            try:
                return self._vectors(self._once(payload), len(texts))
            except _Retry as failure:
                if attempt >= self.attempts:
                    msg = f"{self._who()} failed {self.attempts} times; last: {failure.reason}"
                    raise EmbedderError(self._clean(msg)) from None
                exp = self.backoff_s * 2 ** (attempt - 1)
                wait = min(self.max_backoff_s, exp if failure.wait is None else failure.wait)
                log.warning(
                    "%s: %s; try %d of %d in %.2fs",
                    self._who(),
                    self._clean(failure.reason),
                    attempt + 1,
                    self.attempts,
                    wait,
                )
                self._sleep(wait)
                attempt += 1

    def _once(self, payload: dict[str, Any]) -> Any:
        """One request: the decoded body of a 2xx, a :class:`_Retry`, or an EmbedderError."""
        try:
            with self._slots:
                response = self._client.post(self.endpoint, json=payload)
        except httpx.TimeoutException as exc:
            msg = f"no answer within {self.timeout_s}s ({type(exc).__name__})"
            raise _Retry(msg) from None
        except httpx.TransportError as exc:
            msg = f"connection failed ({type(exc).__name__}: {exc})"
            raise _Retry(msg) from None
        status = response.status_code
        if status == 429 or status >= 500:
            wait = _retry_after(response.headers.get("Retry-After"), time.time())
            msg = f"HTTP {status}: {self._body_start(response)}"
            raise _Retry(msg, wait)
        if status >= 300:
            hint = "; lower batch_size" if status == 413 else ""
            msg = f"{self._who()} answered HTTP {status}{hint}: {self._body_start(response)}"
            raise EmbedderError(self._clean(msg))
        try:
            return response.json()
        except ValueError:
            msg = f"{self._who()} answered HTTP {status} with a body that is not JSON: " + (
                self._body_start(response)
            )
            raise EmbedderError(self._clean(msg)) from None

    def _body_start(self, response: httpx.Response) -> str:
        text = response.text.strip().replace("\n", " ")
        return repr(text[:_BODY_START] + ("..." if len(text) > _BODY_START else ""))

    def _clean(self, message: str) -> str:
        """``message`` with the API key blanked out, should a server echo it."""
        return message.replace(self._secret.value, "***") if self._secret else message

    def _who(self) -> str:
        return f"{type(self).__name__} at {_redact_url(self.endpoint)}"

    def _bad_answer(self, what: str) -> EmbedderError:
        return EmbedderError(self._clean(f"{self._who()} answered {what}"))

    def __getstate__(self) -> dict[str, Any]:
        msg = f"{type(self).__name__} holds connections and cannot be pickled; build another"
        raise EmbedderError(msg)

    def __repr__(self) -> str:
        dim = "?" if self._dim is None else self._dim
        return (
            f"{type(self).__name__}(url={_redact_url(self.base_url)!r}, "
            f"model={self.model!r}, dim={dim})"
        )


class OpenAIEmbedder(_RemoteEmbedder):
    """An OpenAI-compatible ``/v1/embeddings`` server: OpenAI, vLLM, Ollama, LiteLLM, streamrag."""

    _route = "/v1/embeddings"
    _protocol = "openai"

    def __init__(
        self,
        url: str,
        model: str,
        *,
        dim: int | None = None,
        api_key_env: str | None = None,
        batch_size: int = 64,
        timeout_s: float = 30,
        max_concurrency: int = 4,
        attempts: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30,
        version: str | None = None,
        space: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not model:
            msg = "model must name the server's embedding model, found an empty string"
            raise ArgumentError(msg)
        self.model = model
        super().__init__(
            url,
            dim=dim,
            api_key_env=api_key_env,
            batch_size=batch_size,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            attempts=attempts,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            version=version,
            space=space,
            sleep=sleep,
        )

    def _base(self, url: str) -> str:
        url = super()._base(url)
        return url[: -len("/v1")] if url.endswith("/v1") else url

    def _model_name(self) -> str:
        return str(self.model)

    def _payload(self, texts: list[str]) -> dict[str, Any]:
        return {"model": self.model, "input": texts}

    def _vectors(self, body: Any, n: int) -> list[Any]:
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != n:
            got = len(data) if isinstance(data, list) else "no 'data' list"
            msg = f"{got} embeddings for {n} texts"
            raise self._bad_answer(msg)
        rows: list[Any] = [None] * n
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                msg = f"an item without 'embedding' at {pos}"
                raise self._bad_answer(msg)
            i = item.get("index", pos)
            if not isinstance(i, int) or not 0 <= i < n or rows[i] is not None:
                msg = f"a bad or repeated index {i!r}"
                raise self._bad_answer(msg)
            vec = item["embedding"]
            if isinstance(vec, str):  # encoding_format=base64: little-endian float32
                vec = np.frombuffer(base64.b64decode(vec), dtype="<f4")
            rows[i] = vec
        return rows


class TEIEmbedder(_RemoteEmbedder):
    """A Hugging Face Text Embeddings Inference server (``POST /embed``)."""

    _route = "/embed"
    _protocol = "tei"

    def __init__(
        self,
        url: str,
        dim: int | None = None,
        *,
        model: str | None = None,
        api_key_env: str | None = None,
        batch_size: int = 32,
        timeout_s: float = 30,
        max_concurrency: int = 4,
        attempts: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30,
        version: str | None = None,
        space: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model = model
        super().__init__(
            url,
            dim=dim,
            api_key_env=api_key_env,
            batch_size=batch_size,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            attempts=attempts,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            version=version,
            space=space,
            sleep=sleep,
        )

    def _model_name(self) -> str:
        """The model as given, else as TEI's ``GET /info`` names it (asked once)."""
        with self._load_lock:
            if self.model is None:
                try:
                    with self._slots:
                        info = self._client.get(self.base_url + "/info").json()
                    self.model = str(info["model_id"])
                except (httpx.HTTPError, ValueError, KeyError, TypeError):
                    log.warning("%s: no model_id from GET /info; pass model=", self._who())
                    self.model = "unknown"
            return self.model

    def _payload(self, texts: list[str]) -> dict[str, Any]:
        return {"inputs": texts, "normalize": True, "truncate": True}

    def _vectors(self, body: Any, n: int) -> list[Any]:
        if not isinstance(body, list) or len(body) != n:
            got = len(body) if isinstance(body, list) else "no list of"
            msg = f"{got} vectors for {n} texts"
            raise self._bad_answer(msg)
        return body
