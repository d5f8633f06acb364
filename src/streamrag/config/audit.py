"""The ``audit`` section: the hash-chained log of committed epochs.

Every epoch the pipeline commits, and every rollback, gets one record in
``<state_dir>/audit/epochs.jsonl`` (see :mod:`streamrag.runtime.audit`);
``streamrag audit verify`` checks the chain and the index against it. With
``hmac_key_env`` each record is also signed with HMAC-SHA256 under the secret
that environment variable holds, so that only a holder of the secret can write
records that verify.

This is not the *answer* audit log of the prompt-safety checks
(``answer.safety.audit_log``, ``<state_dir>/audit.jsonl``): that one records
questions and answers, this one what the index holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import Field

from streamrag.config.base import Frozen as _Frozen
from streamrag.errors import ConfigError

__all__ = ["AuditSettings"]


class AuditSettings(_Frozen):
    """The epoch audit log: where it is, and whether its records are signed."""

    enabled: bool = Field(
        True, description="Append one hash-chained record per committed epoch and rollback."
    )
    path: Path | None = Field(
        None, description="The epoch audit log (JSONL); default: <state_dir>/audit/epochs.jsonl."
    )
    hmac_key_env: str | None = Field(
        None,
        description="Sign every record with HMAC-SHA256 under the secret held by this "
        "environment variable (e.g. STREAMRAG_AUDIT_KEY); verify needs the same secret.",
    )
    fsync: bool = Field(
        True, description="fsync the log after every record (off: a power loss may lose the last)."
    )

    def log_path(self, state_dir: Path) -> Path:
        """The epoch audit log of a job whose state is in ``state_dir``."""
        return self.path or state_dir / "audit" / "epochs.jsonl"

    def secret(self, environ: Mapping[str, str]) -> bytes | None:
        """The signing secret from ``environ`` (None when records are not signed).

        Raises :class:`~streamrag.errors.ConfigError` when ``hmac_key_env`` names
        a variable that is unset or empty: records would silently go unsigned.
        """
        name = self.hmac_key_env
        if name is None:
            return None
        value = environ.get(name, "")
        if not value:
            msg = (
                f"config key 'audit.hmac_key_env' names the environment variable {name}, which "
                f"is not set: set {name} to the audit secret (the same one the log was signed "
                "with), or remove audit.hmac_key_env to write unsigned records"
            )
            raise ConfigError(msg)
        return value.encode("utf-8")
