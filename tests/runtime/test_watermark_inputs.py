"""A folder's files are one watermark input, not one each."""

from __future__ import annotations

from pathlib import Path

from streamrag.config import load_settings
from streamrag.runtime.service import Service
from streamrag.sources import MultiSource
from streamrag.sources.folder import FolderSource
from streamrag.testing import ManualClock

T0 = 1_704_067_200_000_000


def test_a_folder_reader_names_the_folder_as_the_input_of_its_files(tmp_path: Path) -> None:
    reader = MultiSource([FolderSource(name="docs", path=tmp_path, watch=False)]).build()
    assert reader.watermark_input("folder:docs:a/b.md") == "folder:docs"
    assert reader.watermark_input("kafka:k:t:0") == "kafka:k:t:0"
    reader.close()


def test_a_job_over_a_folder_of_files_keeps_one_watermark_input_for_it(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"page-{i}.md").write_text(f"# Page {i}\n\nBody of page {i}.\n")
    settings = load_settings(
        overrides={
            "state_dir": str(tmp_path / "state"),
            "embedder.class": "hashing",
            "sources": [{"kind": "folder", "name": "docs", "path": str(docs), "settle_ms": 0}],
        },
        environ={},
    )
    clock = ManualClock(T0)
    svc = Service(settings, clock=clock)
    clock.advance_ms(1000)
    svc.pipeline.run_until_caught_up()
    assert svc.index.stats().live_docs == 40
    tracker = svc.pipeline.event_time.tracker
    # The folder, and nothing per file (the push journal and replay folder sent nothing).
    assert tracker.partitions == 1
    assert set(tracker.snapshot()["inputs"]) == {"folder:docs"}
    svc.stop()


def test_only_a_grouping_reader_puts_the_event_time_step_on_the_remapping_path(
    tmp_path: Path,
) -> None:
    from streamrag.runtime.pipeline import _watermark_inputs
    from streamrag.sources import JsonlSource

    plain = MultiSource([JsonlSource(tmp_path / "a.jsonl"), JsonlSource(tmp_path / "r")]).build()
    assert _watermark_inputs(plain) is None
    grouped = MultiSource(
        [JsonlSource(tmp_path / "a.jsonl"), FolderSource(name="d", path=tmp_path, watch=False)]
    ).build()
    inputs = _watermark_inputs(grouped)
    assert inputs is not None
    assert inputs("folder:d:x.md") == "folder:d"
    grouped.close()
