"""Counting tokens the way the LLM will, so that context fits its budget.

A context budget is only as good as the count behind it. Three counters:

* :class:`ApproxCounter` — for an endpoint whose tokenizer streamrag does not
  know (DeepSeek's API, say). It takes the larger of ``ceil(chars / 4)`` and
  ``ceil(4/3 × words)``: English BPE tokenizers average about four characters or
  three quarters of a word per token, and taking the larger of the two keeps
  the estimate on the safe side for text with long or many short words. It is
  an approximation: code, numbers and other languages can use more tokens.
* :class:`ServerCounter` — the endpoint's own tokenizer, through the
  ``POST /tokenize`` route that llama.cpp's server (and xllamacpp) offers next
  to ``/v1``. Exact; one request per text.
* :class:`HFTokenizerCounter` — a Hugging Face ``tokenizer.json`` file (the
  model's tokenizer, loaded locally with the ``tokenizers`` package). Exact.

``llm.tokenizer`` picks one: ``approx``, ``server`` or a path.

>>> ApproxCounter().count_many(["one two three four", "a" * 40])
[6, 10]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from streamrag.config import LLMSettings
from streamrag.errors import ConfigError, GeneratorError, MissingDependencyError

__all__ = [
    "ApproxCounter",
    "HFTokenizerCounter",
    "ServerCounter",
    "TokenCounter",
    "build_counter",
    "server_root",
]


class TokenCounter(Protocol):
    """Counts the tokens of texts, many at a time."""

    @property
    def name(self) -> str:
        """What counts: shown in responses next to the token figures."""
        ...

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text."""
        ...


class ApproxCounter:
    """The larger of chars/4 and 4/3 × words: a safe-side estimate for unknown tokenizers."""

    name = "approx"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Estimated tokens of each text."""
        return [max(math.ceil(len(t) / 4), math.ceil(len(t.split()) * 4 / 3)) for t in texts]

    def __repr__(self) -> str:
        return "ApproxCounter()"


def server_root(base_url: str) -> str:
    """The server root of an OpenAI-style base URL: ``http://h:p/v1`` → ``http://h:p``.

    >>> server_root("http://127.0.0.1:8080/v1/")
    'http://127.0.0.1:8080'
    """
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class ServerCounter:
    """The endpoint's own tokenizer via llama.cpp's ``POST /tokenize``."""

    name = "server"

    def __init__(
        self, base_url: str, *, timeout_s: float = 5.0, client: httpx.Client | None = None
    ) -> None:
        self.url = server_root(base_url) + "/tokenize"
        self._client = client or httpx.Client(timeout=timeout_s)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Exact token counts, one request per text."""
        counts = []
        for text in texts:
            try:
                resp = self._client.post(self.url, json={"content": text})
                resp.raise_for_status()
                counts.append(len(resp.json()["tokens"]))
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                msg = (
                    f"cannot count tokens with {self.url} ({type(exc).__name__}: {exc}); the "
                    "endpoint must offer llama.cpp's /tokenize, else set llm.tokenizer: approx"
                )
                raise GeneratorError(msg) from None
        return counts

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def __repr__(self) -> str:
        return f"ServerCounter({self.url!r})"


class HFTokenizerCounter:
    """A Hugging Face ``tokenizer.json``, loaded with the ``tokenizers`` package."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            package = "tokenizers"
            raise MissingDependencyError(package, None, "llm.tokenizer as a file") from None
        self.path = Path(path)
        try:
            self._tok: Any = Tokenizer.from_file(str(self.path))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            msg = (
                f"config key 'llm.tokenizer' = {str(path)!r}: cannot load it as a tokenizer.json "
                f"({exc}); give 'approx', 'server' or the path of a tokenizer.json"
            )
            raise ConfigError(msg) from None
        self.name = f"tokenizer:{self.path.name}"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Exact token counts (no special tokens)."""
        encoded = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encoded]

    def __repr__(self) -> str:
        return f"HFTokenizerCounter({str(self.path)!r})"


def build_counter(settings: LLMSettings) -> TokenCounter:
    """The counter ``llm.tokenizer`` names ('server' needs ``llm.base_url``)."""
    choice = settings.tokenizer
    if choice == "approx":
        return ApproxCounter()
    if choice == "server":
        if not settings.base_url:
            msg = "config key 'llm.tokenizer' = 'server' needs llm.base_url; or use 'approx'"
            raise ConfigError(msg)
        return ServerCounter(settings.base_url, timeout_s=settings.connect_timeout_s)
    return HFTokenizerCounter(choice)
