"""A Service's sources hold files and watch threads; stopping it releases them, started or not."""

from __future__ import annotations

import threading
from pathlib import Path

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.testing import ManualClock, change_line

T0 = 1_704_067_200  # 2024-01-01T00:00:00Z, in seconds


def _watches() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("streamrag-watch")}


def test_a_service_used_by_hand_and_stopped_releases_its_watch_threads(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(change_line("a", T0, "hello") + "\n", encoding="utf-8")
    settings = load_settings(
        overrides={
            "source.path": str(source),
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "embedder.args": {"dim": 32},
        },
        environ={},
    )
    before = _watches()
    svc = Service(settings, clock=ManualClock(T0 * 10**6))
    svc.pipeline.run_until_caught_up()  # never started: the test drives the pipeline
    made = _watches() - before
    assert made, "the job's sources watch nothing: this test no longer tests anything"
    svc.stop()
    assert not [t.name for t in made if t.is_alive()]
    svc.stop()  # a second stop is harmless
