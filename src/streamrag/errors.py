r"""One error tree for streamrag.

Every exception streamrag raises on purpose derives from :class:`StreamragError`,
so ``except StreamragError`` catches them all. Third-party exceptions are mapped
to one of these at the boundary where they happen. Messages say what was
expected, what was found and what to do. Leaves that stand where Python code
expects a built-in exception also derive from it (``ArgumentError`` and
``DecodeError`` are ``ValueError``\ s, ``UnknownNameError`` a ``KeyError``,
``StateError`` a ``RuntimeError``), so a validator or an ``except ValueError``
written against the built-in keeps working::

    StreamragError
    ├── ArgumentError          a call got a value outside what it accepts (a caller's bug)
    ├── StateError             a call came in a state that does not allow it
    ├── ConfigError            a setting is missing or has a bad value
    │   ├── SpecError          a window, aggregate or other spec does not hold together
    │   └── SchemaError        a version of a record schema breaks a registry rule (named)
    ├── MissingDependencyError a package a feature needs is not installed
    │   └── MissingModelError  a model a feature needs is not installed (says how to get it)
    ├── InputError             an input record cannot be used (goes to dead letters)
    │   ├── DecodeError        not JSON, or not a valid change
    │   └── TimestampError     a time that cannot be read (no zone, out of range)
    ├── SourceError            a source cannot be read or resumed
    ├── AuthenticationError    a request has no API key, or one that is not valid (401)
    ├── PermissionDeniedError  a valid key may not do this: its role, or another tenant (403)
    ├── OverloadedError        the job's bounded queues are full: retry later (429)
    │   └── QueryTimeoutError  a query got no answer within serve.query_timeout_s
    ├── EmbedderError          an embedder failed or returned a bad shape
    ├── IndexStoreError        the vector index refused an operation
    │   ├── CorruptStateError  a state file fails its checksum (names the file)
    │   └── ForeignFileError   a derived file holds another format: it is built again
    ├── QueryError             a query is malformed (bad filter, k, time range)
    │   ├── RequestError       a request field fails its check (a limit, a blank value)
    │   └── UnknownNameError   a query names something that does not exist (a window)
    └── GeneratorError         the LLM endpoint failed, timed out or returned garbage
        ├── GeneratorTimeoutError  the endpoint did not answer in time
        └── CircuitOpenError   the endpoint failed too often; calls are refused for a while
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "AuthenticationError",
    "CircuitOpenError",
    "ConfigError",
    "CorruptStateError",
    "DecodeError",
    "EmbedderError",
    "ForeignFileError",
    "GeneratorError",
    "GeneratorTimeoutError",
    "IndexStoreError",
    "InputError",
    "MissingDependencyError",
    "MissingModelError",
    "OverloadedError",
    "PermissionDeniedError",
    "QueryError",
    "QueryTimeoutError",
    "RequestError",
    "SchemaError",
    "SourceError",
    "SpecError",
    "StateError",
    "StreamragError",
    "TimestampError",
    "UnknownNameError",
]


class StreamragError(Exception):
    """Root of every error streamrag raises on purpose."""


class ArgumentError(StreamragError, ValueError):
    """A function or constructor got a value outside what it accepts.

    A bug of the calling code, not of the data: the message names the argument,
    the value and the allowed range.
    """


class StateError(StreamragError, RuntimeError):
    """A call came in a state that does not allow it (for example after close)."""


class ConfigError(StreamragError):
    """A configuration key is missing or has a bad value.

    The message names the key (dotted path), the bad value and what is allowed.
    """


class SpecError(ConfigError, ValueError):
    """A spec (a window, an aggregate, a trigger) does not hold together.

    Raised inside settings validators too, which is why it is also a ``ValueError``.
    """


class SchemaError(ConfigError):
    """A version of a source's record schema breaks a rule of the schema registry.

    ``rules`` names each rule broken (``type-narrowed``, ``field-removed``, ...);
    the message names the source, the version, the field and what to do. Not a
    ``ValueError`` on purpose: raised while settings load, it reaches the caller
    as it is, the same error ``streamrag schemas check`` reports.
    """

    def __init__(self, message: str, rules: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.rules = rules


class MissingDependencyError(StreamragError):
    """A package streamrag needs for a feature is not installed.

    The message names the package and the command that installs it: the extra
    for optional parts, or the package itself for one the environment lost.
    """

    def __init__(self, package: str, extra: str | None, purpose: str) -> None:
        self.package = package
        self.extra = extra
        command = f"pip install 'streamrag[{extra}]'" if extra else f"pip install '{package}'"
        super().__init__(
            f"{purpose} needs the package {package!r}, which is not installed. "
            f"Install it with: {command}"
        )


class MissingModelError(MissingDependencyError):
    """A model a feature needs (a spaCy pipeline) is not installed.

    Models are often not on PyPI, so the message gives the way to get this one.
    """

    def __init__(self, model: str, purpose: str, install: str) -> None:
        self.package = model
        self.extra = None
        StreamragError.__init__(
            self,
            f"{purpose} needs the model {model!r}, which is not installed. Install it: {install}",
        )


class InputError(StreamragError):
    """An input record cannot be used. Such records go to the dead-letter store."""


class DecodeError(InputError, ValueError):
    """A record is not valid JSON or does not match the change schema."""


class TimestampError(InputError, ValueError):
    """A time cannot be read: no time zone, not a time, or out of range."""


class SourceError(StreamragError):
    """A source cannot be opened, read or resumed from its offset."""


class AuthenticationError(StreamragError):
    """A request carries no API key, or a key the server does not know (HTTP 401).

    The server takes ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``;
    the answer carries ``WWW-Authenticate: Bearer``. The message never repeats
    the key that was sent.
    """


class PermissionDeniedError(StreamragError):
    """A valid API key may not do what the request asks (HTTP 403).

    Its role is too low (a reader pushing documents, a writer calling
    ``/v1/admin/*``), or the request names a tenant other than the key's.
    """


class OverloadedError(StreamragError):
    """The job's bounded queues are full: try again after ``retry_after_s`` seconds.

    HTTP answers 429 with a ``Retry-After`` header; nothing of the request was taken.
    """

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueryTimeoutError(OverloadedError):
    """A query got no answer from the query workers within ``serve.query_timeout_s``.

    HTTP answers 429 (code ``query_timeout``) with ``Retry-After``; the query was
    not answered and may be sent again.
    """


class EmbedderError(StreamragError):
    """An embedder failed, or returned vectors of the wrong shape or type."""


class IndexStoreError(StreamragError):
    """The vector index refused an operation (for example a dimension mismatch)."""


class ForeignFileError(IndexStoreError):
    """A file the index can rebuild (an ANN graph) holds another format or other rows.

    Written by an earlier streamrag (an hnswlib graph) or for another segment: it
    is never read as this one's; the index builds it again in the background.
    """


class CorruptStateError(IndexStoreError):
    """A file of the index's state is damaged: its checksum or framing does not match.

    ``path`` names the file. The index never serves what such a file holds: it
    refuses to open (or, with ``index.on_corruption: rebuild``, rebuilds itself
    from its sources).
    """

    def __init__(self, path: object, detail: str) -> None:
        self.path = str(path)
        msg = (
            f"index file {path} is damaged: {detail}. Nothing from it was served. Restore the "
            "state directory from a backup, or set index.on_corruption: rebuild to move the "
            "damaged index aside and rebuild it from the source (possible when the source can "
            "be read again from its start, as files can)"
        )
        super().__init__(msg)


class QueryError(StreamragError):
    """A query is malformed: unknown filter, bad ``k`` or an empty time range."""


class RequestError(QueryError, ValueError):
    """A field of a request fails its check: over a limit, blank, or not a number.

    Raised inside the request schemas' validators; the HTTP layer answers 422
    with the fields that failed.
    """


class UnknownNameError(QueryError, KeyError):
    """A query names something that does not exist, such as a window."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GeneratorError(StreamragError):
    """The LLM endpoint failed: refused the connection, timed out, or answered an error.

    Answers fall back to the extractive answerer when this happens before any
    text was streamed; the response then names the reason.
    """


class GeneratorTimeoutError(GeneratorError):
    """The LLM endpoint did not connect, answer or finish within its configured timeouts."""


class CircuitOpenError(GeneratorError):
    """The LLM endpoint failed too many times in a row; calls are refused until it cools down."""
