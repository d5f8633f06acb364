"""API keys: who is calling, which tenant they may see, and what their role allows.

**Keys.** A key is ``sr_`` followed by 32 random bytes (``secrets.token_urlsafe``),
made by ``streamrag keys create`` and shown once. The server keeps only its
SHA-256 (:func:`hash_key`), in ``security.keys`` or the key file. A fast,
unsalted hash is the right tool here, as for GitHub's and Stripe's tokens:
salting and slow hashes (bcrypt, scrypt, Argon2) exist to stop the guessing of
*low-entropy* secrets such as passwords from a stolen hash, and 256 random bits
cannot be guessed however fast each guess is. A plain SHA-256 also lets every
request be checked in a microsecond. The presented key's hash is compared with
every stored hash with :func:`hmac.compare_digest` (constant time), and neither
key nor hash is ever logged or shown in an error.

**Requests** carry the key as ``Authorization: Bearer <key>`` (what the
``openai`` client sends as its ``api_key``) or ``X-API-Key: <key>``. No key, or
an unknown one: 401 with ``WWW-Authenticate: Bearer``. A key whose role is too
low: 403. A key over its limits (:mod:`streamrag.serve.limits`): 429 with
``Retry-After``.

**Roles**, each allowed all that the one before it is:

=========  ==================================================================
reader     ``/v1/retrieve``, ``/v1/answer``, ``/v1/chat/completions``,
           ``/v1/embeddings``, ``/v1/models``, ``/v1/status`` (its tenant's
           view), ``/v1/windows`` (its tenant's rows)
writer     ``POST /v1/documents`` too, for its own tenant
admin      ``/v1/admin/*``, ``/metrics``, the whole ``/v1/status``, and the
           windows that are not keyed by tenant
=========  ==================================================================

**The tenant comes from the key.** A request may name its key's tenant
(``filters.tenant``), or name none; naming another is a 403. Every read —
retrieval, answers, chat, the answer cache (its scope holds the tenant) — is
then filtered to that tenant, whatever the filters, document ids, time range,
``as_of`` or ``epoch`` say; admin keys included. Pushed changes name the
key's tenant or none (it is filled in), and carry ``pushed_by``: the key's
name. Window results keyed by ``tenant`` show only the key's tenant's rows;
windows keyed otherwise mix tenants, so only admin keys see them.
``/v1/status`` shows a non-admin key its tenant's view: no other tenant's
names, counts or document ids. ``/healthz`` and the API description
(``/openapi.json``, ``/docs``, ``/redoc``) are open; ``/metrics`` needs an admin
key unless ``security.metrics: public``.

**Without any key** nothing is checked, and a request's ``filters.tenant``
decides, as in local development; the server then binds only to a loopback
address (:func:`check_bind`). Once keys exist they stay required: revoking
every key refuses every request, it never opens the server again.

Checks run in :class:`AuthASGI`, ahead of routing, so the raw-bytes retrieve
path (:class:`~streamrag.serve.retrieve.RetrieveASGI`) is covered like every
route. Each route's role is declared in :data:`ROUTE_ROLES`, by route path; a
route missing there needs an admin key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.requests import HTTPConnection
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from streamrag.config import Settings
from streamrag.config.security import ROLES, ApiKeySpec, KeyFile, KeyLimitSettings, Role
from streamrag.errors import (
    AuthenticationError,
    ConfigError,
    OverloadedError,
    PermissionDeniedError,
    StreamragError,
)
from streamrag.eventtime import NamedWindow, WindowResult
from streamrag.serve.errors import error_response
from streamrag.serve.limits import KeyLimiter
from streamrag.serve.schemas import Filters
from streamrag.timing import US_PER_S, Clock

__all__ = [
    "ANSWER_ROUTES",
    "KEY_PREFIX",
    "OPEN",
    "ROUTE_ROLES",
    "AuthASGI",
    "KeyRing",
    "Principal",
    "check_bind",
    "document_security",
    "hash_key",
    "key_max_k",
    "new_key",
    "presented_key",
    "principal_of",
    "request_tenant",
    "route_paths",
    "stamp_changes",
    "window_rows",
]

log = logging.getLogger("streamrag.serve.auth")

KEY_PREFIX = "sr_"
"""Every key streamrag makes starts with this (secret scanners can find leaked ones)."""

OPEN = None
"""The "role" of a route that needs no key."""

ROUTE_ROLES: Mapping[str, Role | None] = {
    "/v1/retrieve": "reader",
    "/v1/answer": "reader",
    "/v1/chat/completions": "reader",
    "/v1/embeddings": "reader",
    "/v1/models": "reader",
    "/v1/status": "reader",
    "/v1/windows": "reader",
    "/v1/windows/{name}": "reader",
    "/v1/documents": "writer",
    "/v1/admin/rollback": "admin",
    "/v1/admin/reindex": "admin",
    "/v1/admin/generations": "admin",
    "/v1/admin/generations/switch": "admin",
    "/v1/admin/generations/rollback": "admin",
    "/v1/admin/generations/drop": "admin",
    "/metrics": "admin",
    "/healthz": OPEN,
    "/openapi.json": OPEN,
    "/docs": OPEN,
    "/docs/oauth2-redirect": OPEN,
    "/redoc": OPEN,
}
"""The least role each route needs, by route path (``OPEN``: none). Unlisted: admin."""

ANSWER_ROUTES = frozenset({"/v1/answer", "/v1/chat/completions"})
"""Routes bounded by ``max_answers_in_flight`` as well (they may hold an LLM call)."""

_PRINCIPAL = "streamrag.principal"
_RELOAD_US = US_PER_S
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def new_key() -> str:
    """A new API key: ``sr_`` and 32 random bytes, URL-safe (43 characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The SHA-256 of ``key``, hex: what the server stores (see the module docstring)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a key names: the key's name, its tenant, role and limits."""

    name: str
    tenant: str
    role: Role
    limits: KeyLimitSettings
    max_k: int | None = None

    def may(self, role: Role) -> bool:
        """Whether this key's role includes ``role``."""
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def is_admin(self) -> bool:
        """Whether this is an admin key."""
        return self.role == "admin"

    def __repr__(self) -> str:
        return f"Principal({self.name!r}, tenant={self.tenant!r}, role={self.role!r})"


class KeyRing:
    """The keys the server accepts: ``security.keys`` and the key file, read again when edited.

    The file is looked at (a ``stat``) at most once a second by ``clock``; a
    revoked key is refused from then on. A key file that cannot be read while
    the server runs drops its keys (the configured ones stay), and is logged.
    """

    def __init__(
        self,
        configured: Sequence[ApiKeySpec],
        key_file: Path | None,
        defaults: KeyLimitSettings,
        clock: Clock,
    ) -> None:
        self.configured = list(configured)
        self.file = KeyFile(key_file) if key_file is not None else None
        self.defaults = defaults
        self.clock = clock
        self._seen: tuple[int, int, int] | None = None
        self._checked_us: int | None = None
        self._from_file: list[ApiKeySpec] = []
        self._digests: list[tuple[bytes, Principal]] = []
        self._ever = False
        self._load(strict=True)

    @classmethod
    def from_settings(cls, settings: Settings, clock: Clock) -> KeyRing:
        """The keys of ``settings``: ``security.keys`` and ``security.key_file``."""
        sec = settings.security
        return cls(sec.keys, sec.key_path(settings.state_dir), sec.limits, clock)

    @property
    def enabled(self) -> bool:
        """Whether keys are required: some key exists, or existed since the server started."""
        self._maybe_reload()
        return self._ever

    def __len__(self) -> int:
        self._maybe_reload()
        return len(self._digests)

    def authenticate(self, key: str) -> Principal | None:
        """The principal of ``key``, or None when no key matches (constant-time compare)."""
        self._maybe_reload()
        digest = bytes.fromhex(hash_key(key))  # headers are read as latin-1: always encodable
        found: Principal | None = None
        for stored, principal in self._digests:  # every hash is compared, match or not
            if hmac.compare_digest(stored, digest):
                found = principal
        return found

    def _maybe_reload(self) -> None:
        if self.file is None:
            return
        now = self.clock.now_us()
        if self._checked_us is not None and now - self._checked_us < _RELOAD_US:
            return
        self._checked_us = now
        try:
            st = self.file.path.stat()
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            seen = (0, 0, 0)
        except OSError:
            seen = (-1, -1, -1)
        if seen != self._seen:
            self._load(strict=False)

    def _load(self, *, strict: bool) -> None:
        if self.file is not None:
            try:
                st = self.file.path.stat()
                self._seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            except FileNotFoundError:
                self._seen = (0, 0, 0)
            except OSError:
                self._seen = (-1, -1, -1)
            try:
                self._from_file = self.file.read()
            except ConfigError as exc:
                if strict:
                    raise
                log.error("API keys of the key file are refused until it is fixed: %s", exc)
                self._from_file = []
        specs = [*self.configured, *self._from_file]
        names = [s.name for s in specs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice and strict:
            msg = f"API keys {twice} are both in security.keys and in the key file; keep one"
            raise ConfigError(msg)
        self._digests = [
            (
                bytes.fromhex(s.sha256),
                Principal(s.name, s.tenant, s.role, s.limits(self.defaults), s.max_k),
            )
            for s in specs
            if s.name not in twice
        ]
        self._ever = self._ever or bool(specs)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def presented_key(scope: Scope) -> str | None:
    """The key a request carries: ``Authorization: Bearer``, else ``X-API-Key``."""
    auth = _header(scope, b"authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = _header(scope, b"x-api-key")
    return key.strip() if key and key.strip() else None


class AuthASGI:
    """Middleware that authenticates, checks the route's role and the key's limits.

    Without keys (:attr:`KeyRing.enabled` false) every request passes as it
    is. With keys, the caller's :class:`Principal` is put in the request scope
    (:func:`principal_of`) for the routes, which take the tenant from it.
    """

    def __init__(
        self, app: ASGIApp, keys: KeyRing, limiter: KeyLimiter, metrics_public: bool = False
    ) -> None:
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.roles = dict(ROUTE_ROLES)
        if metrics_public:
            self.roles["/metrics"] = OPEN
        self._exact: dict[str, str] | None = None
        self._templated: list[tuple[re.Pattern[str], str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check one HTTP request, then pass it on (or answer 401, 403 or 429)."""
        if scope["type"] != "http" or not self.keys.enabled:
            await self.app(scope, receive, send)
            return
        route = self._route(scope)
        needed: Role | None = self.roles.get(route, "admin") if route is not None else "reader"
        if needed is OPEN:
            await self.app(scope, receive, send)
            return
        try:
            principal = self._authenticate(scope)
            if not principal.may(needed):
                msg = (
                    f"the API key {principal.name!r} is a {principal.role} key; "
                    f"{scope['method']} {scope['path']} needs a{'n' if needed == 'admin' else ''} "
                    f"{needed} key"
                )
                raise PermissionDeniedError(msg)
            admission = self.limiter.admit(
                principal.name, principal.limits, answers=route in ANSWER_ROUTES
            )
        except StreamragError as exc:
            await _refuse(exc, send)
            return
        scope[_PRINCIPAL] = principal
        with admission:
            await self.app(scope, receive, send)

    def _authenticate(self, scope: Scope) -> Principal:
        key = presented_key(scope)
        if key is None:
            msg = (
                "this server needs an API key: send it as 'Authorization: Bearer <key>' or "
                "'X-API-Key: <key>' (an admin makes one with `streamrag keys create`)"
            )
            raise AuthenticationError(msg)
        principal = self.keys.authenticate(key)
        if principal is None:
            msg = (
                "the API key sent is not valid (unknown or revoked); check it, or ask an "
                "admin for a new one (`streamrag keys create`)"
            )
            raise AuthenticationError(msg)
        return principal

    def _route(self, scope: Scope) -> str | None:
        """The path of the route that will answer ``scope``, or None when none will."""
        if self._exact is None:
            self._index(scope["app"].router.routes)
        assert self._exact is not None
        path = _route_path(scope)
        found = self._exact.get(path)
        if found is not None:
            return found
        for regex, template in self._templated:
            if regex.match(path):
                return template
        return None

    def _index(self, routes: Sequence[Any]) -> None:
        exact: dict[str, str] = {}
        for path in route_paths(routes):
            if "{" in path:
                self._templated.append((compile_path(path)[0], path))
            else:
                exact.setdefault(path, path)
        self._exact = exact


def _route_path(scope: Scope) -> str:
    """The path routing matches: ``path`` without ``root_path``, as Starlette's router takes it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


def route_paths(routes: Sequence[Any]) -> list[str]:
    """The path of every route, those of included routers too (FastAPI nests them)."""
    return [p for rc in iter_route_contexts(routes) if isinstance(p := rc.path, str)]


async def _refuse(exc: StreamragError, send: Send) -> None:
    status, body = error_response(exc)
    headers = [(b"content-type", b"application/json")]
    if isinstance(exc, AuthenticationError):
        headers.append((b"www-authenticate", b'Bearer realm="streamrag"'))
    elif isinstance(exc, OverloadedError):
        headers.append((b"retry-after", str(exc.retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def principal_of(request: Scope | HTTPConnection) -> Principal | None:
    """The principal :class:`AuthASGI` found for a request (a scope or a Request); None: no keys."""
    scope = request.scope if isinstance(request, HTTPConnection) else request
    found = scope.get(_PRINCIPAL)
    return found if isinstance(found, Principal) else None


def request_tenant(principal: Principal | None, filters: Filters) -> str:
    """The tenant a request reads: its key's (naming another: a 403); without keys, its own."""
    if principal is None:
        return filters.tenant
    if "tenant" in filters.model_fields_set and filters.tenant != principal.tenant:
        msg = (
            f"filters.tenant is {filters.tenant!r}, and the API key {principal.name!r} belongs to "
            f"the tenant {principal.tenant!r}; name that tenant or leave filters.tenant out"
        )
        raise PermissionDeniedError(msg)
    return principal.tenant


def key_max_k(principal: Principal | None, max_k: int) -> int:
    """The largest ``k`` for this caller: ``serve.max_k``, or the key's own bound below it."""
    if principal is None or principal.max_k is None:
        return max_k
    return min(max_k, principal.max_k)


def stamp_changes(principal: Principal | None, changes: Sequence[Any]) -> list[Any]:
    """Pushed changes with the key's tenant and ``pushed_by`` set; another tenant is a 403.

    A change that names no tenant gets the key's. ``pushed_by`` is always the
    key's name, whatever the client sent; without keys it is removed (a client
    cannot claim to be a key).
    """
    out: list[Any] = []
    for i, change in enumerate(changes):
        if not isinstance(change, Mapping):
            out.append(change)  # the journal refuses it, naming it
            continue
        record = {k: v for k, v in change.items() if k != "pushed_by"}
        if principal is not None:
            tenant = record.get("tenant")
            if tenant is None:
                record["tenant"] = principal.tenant
            elif not isinstance(tenant, str) or tenant.strip() != principal.tenant:
                msg = (
                    f"change {i} is for the tenant {tenant!r}, and the API key "
                    f"{principal.name!r} writes only to the tenant {principal.tenant!r}; "
                    "leave 'tenant' out or name that tenant (nothing was taken)"
                )
                raise PermissionDeniedError(msg)
            record["pushed_by"] = principal.name
        out.append(record)
    return out


def window_rows(
    principal: Principal | None, window: NamedWindow, results: list[WindowResult]
) -> list[WindowResult] | None:
    """The results of ``window`` the caller may see; None when the whole window is hidden.

    Keyed by tenant: the key's tenant's rows. Keyed otherwise (its rows mix
    tenants): all of them for admin keys (and without keys), else hidden.
    """
    if principal is None:
        return results
    if "tenant" not in window.key:
        return results if principal.is_admin else None
    at, parts = window.key.index("tenant"), len(window.key)

    def tenant_of(key: Any) -> Any:
        if parts == 1:
            return key
        return key[at] if isinstance(key, tuple | list) and len(key) == parts else None

    return [r for r in results if tenant_of(r.key) == principal.tenant]


def check_bind(host: str, *, keys: bool, insecure: bool = False) -> str | None:
    """Refuse to serve beyond loopback without keys; the warning to print, if any.

    With keys: any address. Without: a loopback address only (127.0.0.0/8,
    ::1, localhost), unless ``insecure`` — then a warning that anyone who can
    reach the address can read and change every tenant's documents.
    """
    if keys:
        return None
    if _is_loopback(host):
        return (
            f"no API keys: serving without authentication on {host} only (local development); "
            "make keys with `streamrag keys create` to serve other hosts"
        )
    if insecure:
        return (
            f"INSECURE: serving on {host} WITHOUT API KEYS (--insecure). Anyone who can reach "
            "this address can read, change and roll back every tenant's documents."
        )
    msg = (
        f"refusing to listen on {host}: there are no API keys, and without them streamrag "
        "serves only a loopback address (127.0.0.1). Make keys with `streamrag keys create "
        "--tenant T --role reader`, bind to 127.0.0.1, or pass --insecure to serve "
        "everyone without authentication"
    )
    raise ConfigError(msg)


def _is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def document_security(app: Any, keys: KeyRing) -> None:
    """Describe the keys in the app's OpenAPI description, when the server has keys.

    Each route that needs a key gets the two ways to send one, and its 401,
    403 and 429 answers; open routes stay as they are. Without keys nothing is
    added: the description says what the server does.
    """
    original: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema  # type: ignore[no-any-return]
        schema = original()
        if not keys.enabled:
            return schema
        schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
        schemes["bearer"] = {"type": "http", "scheme": "bearer", "description": "An API key."}
        schemes["apiKey"] = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
        for path, ops in schema.get("paths", {}).items():
            role = ROUTE_ROLES.get(path, "admin")
            if role is OPEN:
                continue
            for op in ops.values():
                if not isinstance(op, dict):
                    continue
                op["security"] = [{"bearer": []}, {"apiKey": []}]
                responses = op.setdefault("responses", {})
                responses.setdefault("401", {"description": "No API key, or an unknown one."})
                responses.setdefault(
                    "403", {"description": f"Needs a{'n' if role == 'admin' else ''} {role} key."}
                )
                responses.setdefault("429", {"description": "Over the key's limits."})
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
