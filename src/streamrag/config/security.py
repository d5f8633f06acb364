"""Settings of API keys and per-key limits, and the key file that holds the keys' hashes.

An API key names a **tenant** and a **role** (``reader`` < ``writer`` <
``admin``, each allowed what the one before it is). Keys come from two places,
merged: ``security.keys`` in the configuration, and the key file
(``security.key_file``, by default ``<state_dir>/keys.yaml``) that
``streamrag keys create`` appends to. Both hold only the SHA-256 of a key, never
the key itself::

    security:
      keys:
        - name: acme-reader
          tenant: acme
          role: reader
          sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
          rate_per_s: 5        # this key's own limits (optional)

Without any key the server checks nothing, and binds only to 127.0.0.1.

**Limits.** Every key gets a token bucket (``rate_per_s`` requests per second,
up to ``burst`` at once) and a bound on its requests in flight, with a lower
one for answers and chat completions (they hold an LLM call); a key may set
its own. ``max_k`` bounds ``k`` below ``serve.max_k``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from streamrag.config.base import Frozen
from streamrag.errors import ConfigError, SpecError

__all__ = [
    "ROLES",
    "ApiKeySpec",
    "KeyFile",
    "KeyLimitSettings",
    "Role",
    "SecuritySettings",
]

Role = Literal["reader", "writer", "admin"]
ROLES: tuple[Role, ...] = ("reader", "writer", "admin")
"""The roles from least to most allowed; each may do all that the ones before it may."""

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class KeyLimitSettings(Frozen):
    """Per-key limits: a token bucket and bounds on requests in flight."""

    rate_per_s: float = Field(
        20.0, gt=0, description="Requests per second a key may make, sustained (token bucket)."
    )
    burst: int = Field(
        40, ge=1, description="Requests a key may make at once after being idle (bucket size)."
    )
    max_in_flight: int = Field(
        16, ge=1, description="Requests of one key being answered at the same time."
    )
    max_answers_in_flight: int = Field(
        4,
        ge=1,
        description="Answers and chat completions of one key being made at the same time "
        "(each may hold an LLM call).",
    )


class ApiKeySpec(Frozen):
    """One API key: its name, tenant, role, the SHA-256 of the key, and its own limits."""

    name: str = Field(..., pattern=_NAME, description="Unique name (letters, digits, . _ -).")
    tenant: str = Field(..., min_length=1, description="The only tenant the key can read or write.")
    role: Role = Field(..., description="reader, writer (push ingest) or admin (/v1/admin/*).")
    sha256: str = Field(
        ..., pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the key, hex (never the key)."
    )
    created: str | None = Field(None, description="When the key was made (UTC).")
    rate_per_s: float | None = Field(None, gt=0, description="Overrides security.limits.")
    burst: int | None = Field(None, ge=1, description="Overrides security.limits.")
    max_in_flight: int | None = Field(None, ge=1, description="Overrides security.limits.")
    max_answers_in_flight: int | None = Field(None, ge=1, description="Overrides security.limits.")
    max_k: int | None = Field(None, gt=0, description="Largest k for this key (≤ serve.max_k).")

    @model_validator(mode="after")
    def _tenant_named(self) -> ApiKeySpec:
        if self.tenant != self.tenant.strip():
            msg = f"key {self.name!r}: tenant {self.tenant!r} has spaces around it; remove them"
            raise SpecError(msg)
        return self

    def limits(self, defaults: KeyLimitSettings) -> KeyLimitSettings:
        """This key's limits: its own where it sets them, else ``defaults``."""
        own = {
            k: getattr(self, k)
            for k in KeyLimitSettings.model_fields
            if getattr(self, k) is not None
        }
        return defaults.model_copy(update=own)


class SecuritySettings(Frozen):
    """API keys (tenant and role per key), per-key limits, and who may read /metrics."""

    keys: list[ApiKeySpec] = Field(
        default_factory=list,
        description="API keys by hash (name, tenant, role, sha256); merged with the key file.",
    )
    key_file: Path | None = Field(
        None,
        description="YAML file of keys that `streamrag keys create` appends to; "
        "default: <state_dir>/keys.yaml.",
    )
    limits: KeyLimitSettings = KeyLimitSettings()
    metrics: Literal["admin", "public"] = Field(
        "admin",
        description="Who may read /metrics once keys exist: admin keys, or anyone "
        "(a scraper on a private network).",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> SecuritySettings:
        names = [k.name for k in self.keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            msg = f"security.keys names {twice} more than once; give every key its own name"
            raise SpecError(msg)
        return self

    def key_path(self, state_dir: Path) -> Path:
        """The key file: ``key_file``, else ``<state_dir>/keys.yaml``."""
        return self.key_file or Path(state_dir) / "keys.yaml"


class KeyFile:
    """The YAML file of key hashes: read it, add a key, remove one (written atomically).

    The file is ``{"keys": [{name, tenant, role, sha256, created}, ...]}``,
    readable by its owner only (mode 0600). A missing file holds no keys.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[ApiKeySpec]:
        """The keys in the file (none when it does not exist)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except OSError as exc:
            msg = f"cannot read the key file {self.path}: {exc.strerror}; check its permissions"
            raise ConfigError(msg) from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            msg = f"the key file {self.path} is not YAML ({exc}); fix it or make it again"
            raise ConfigError(msg) from None
        rows = data.get("keys") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            msg = f"the key file {self.path} should hold a mapping with a list 'keys'"
            raise ConfigError(msg)
        try:
            specs = [ApiKeySpec.model_validate(row) for row in rows]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            msg = f"the key file {self.path} has a bad entry ({where}: {first['msg']})"
            raise ConfigError(msg) from None
        names = [s.name for s in specs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            msg = f"the key file {self.path} names {twice} more than once; revoke and make again"
            raise ConfigError(msg)
        return specs

    def add(self, spec: ApiKeySpec) -> None:
        """Append ``spec``; a key of the same name is refused."""
        specs = self.read()
        if any(s.name == spec.name for s in specs):
            msg = (
                f"the key file {self.path} already has a key named {spec.name!r}; pick another "
                "name, or revoke that key first"
            )
            raise ConfigError(msg)
        self._write([*specs, spec])

    def remove(self, name: str) -> ApiKeySpec:
        """Remove the key named ``name`` and return it."""
        specs = self.read()
        found = next((s for s in specs if s.name == name), None)
        if found is None:
            known = ", ".join(s.name for s in specs) or "none"
            msg = f"the key file {self.path} has no key named {name!r} (it has: {known})"
            raise ConfigError(msg)
        self._write([s for s in specs if s.name != name])
        return found

    def _write(self, specs: list[ApiKeySpec]) -> None:
        rows: list[dict[str, Any]] = [s.model_dump(exclude_none=True) for s in specs]
        text = yaml.safe_dump({"keys": rows}, sort_keys=False, allow_unicode=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".keys-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
