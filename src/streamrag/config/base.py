"""The base of every settings model: frozen, and unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    """Settings are immutable once validated; a key the model does not know is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)
