"""Counting tokens the way the LLM will, so that context fits its budget.

A context budget is only as good as the count behind it. Three counters:

* :class:`ApproxCounter` — for an endpoint whose tokenizer streamrag does not
  know (DeepSeek's API, say). It counts a token per run of up to six letters
  and one more per five letters beyond, a token per digit, per punctuation or
  symbol character and per line break or indentation. BPE tokenizers keep
  common English words whole, split long and rare ones, and (Llama-style
  tokenizers) spell numbers digit by digit. Against SmolLM2's tokenizer the
  estimate is within about −5 % to +30 % for English prose, code, log lines and
  SQL (tests check this). It is an approximation: text in other languages can
  take up to twice the estimate with an English-centred tokenizer — name the
  model's ``tokenizer.json`` for such corpora.
* :class:`ServerCounter` — the endpoint's own tokenizer, through the
  ``POST /tokenize`` route that llama.cpp's server (and xllamacpp) offers next
  to ``/v1``. Exact; one request per text.
* :class:`HFTokenizerCounter` — a Hugging Face ``tokenizer.json`` file (the
  model's tokenizer, loaded locally with the ``tokenizers`` package). Exact.

``llm.tokenizer`` picks one: ``approx``, ``server`` or a path.

>>> ApproxCounter().count_many(["one two three four", "retry=3/5", "a" * 40])
[4, 5, 8]
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

from streamrag.config import LLMSettings
from streamrag.errors import ConfigError, GeneratorError, MissingDependencyError

_PIECE = re.compile(r"[^\W\d_]+|\d|[^\w\s]|_|\n|\s{2,}")
_WHOLE_WORD = 6  # letters a tokenizer usually keeps as one token
_LETTERS_PER_TOKEN = 5

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
    """An estimate by character class, for tokenizers streamrag does not know."""

    name = "approx"

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Estimated tokens of each text."""
        return [self._count(t) for t in texts]

    @staticmethod
    def _count(text: str) -> int:
        n = 0
        for m in _PIECE.finditer(text):
            piece = m.group(0)
            if piece[0].isalpha() and len(piece) > _WHOLE_WORD:
                n += math.ceil(len(piece) / _LETTERS_PER_TOKEN)
            else:
                n += 1  # a short word, a digit, a symbol, a line break or an indent
        return n

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
