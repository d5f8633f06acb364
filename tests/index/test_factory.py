"""``index.*`` settings become the index's spec in one place: :func:`lsm_spec`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamrag.config import IndexSettings
from streamrag.index import ExactIndex, LsmIndex, LsmSpec
from streamrag.index.factory import build_index, lsm_spec
from streamrag.timing import SystemClock

NOT_THE_LSM_SPEC = {"kind", "persist", "on_corruption", "initial_capacity"}
"""Settings that choose or open the index rather than configure the LSM index."""


def test_the_spec_defaults_are_the_settings_defaults() -> None:
    """The two sets of defaults are kept equal: one changed alone fails here."""
    assert lsm_spec(IndexSettings()) == LsmSpec()


def _other_value(name: str, default: Any) -> Any:
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3
    return {"ann": "exact", "history": "current"}[name]


@pytest.mark.parametrize("name", sorted(set(IndexSettings.model_fields) - NOT_THE_LSM_SPEC))
def test_every_setting_reaches_the_spec(name: str) -> None:
    default = IndexSettings.model_fields[name].default
    changed = IndexSettings(**{name: _other_value(name, default)})
    assert lsm_spec(changed) != lsm_spec(IndexSettings()), f"index.{name} is not wired"


def test_seal_rows_sizes_both_the_growing_segment_and_the_compaction_tiers() -> None:
    spec = lsm_spec(IndexSettings(seal_rows=100))
    assert (spec.seal_rows, spec.compaction.seal_rows) == (100, 100)


def test_build_index_picks_the_kind(tmp_path: Path) -> None:
    clock = SystemClock()
    exact = build_index(IndexSettings(kind="exact"), 4, state_dir=tmp_path, clock=clock)
    assert isinstance(exact, ExactIndex)
    lsm = build_index(IndexSettings(), 4, state_dir=tmp_path, clock=clock, background=False)
    assert isinstance(lsm, LsmIndex)
    assert lsm.spec == LsmSpec()
    assert (tmp_path / "index").is_dir()
    lsm.close()
