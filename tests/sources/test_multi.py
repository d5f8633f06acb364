from __future__ import annotations

from pathlib import Path

from streamrag.sources import JsonlSource, MultiSource, MultiSourceReader
from streamrag.testing import WATERMARK, ScriptedSource


def test_resume_map_is_split_by_owner(tmp_path: Path) -> None:
    (tmp_path / "replay").mkdir()
    (tmp_path / "in.jsonl").write_bytes(b'{"n":1}\n{"n":2}\n')
    (tmp_path / "replay" / "a.jsonl").write_bytes(b'{"r":1}\n')
    multi = MultiSource([JsonlSource(tmp_path / "in.jsonl"), JsonlSource(tmp_path / "replay")])
    resume = {str(tmp_path / "in.jsonl"): 8, str(tmp_path / "replay" / "a.jsonl"): 8}
    reader = multi.build(resume)
    assert [line for b in reader.poll(1 << 20) for line in b.lines] == [b'{"n":2}']
    assert reader.snapshot() == {**resume, str(tmp_path / "in.jsonl"): 16}


def test_a_batch_with_only_a_watermark_passes_through(tmp_path: Path) -> None:
    scripted = ScriptedSource("p0")
    scripted.push(WATERMARK(7))
    (tmp_path / "in.jsonl").write_bytes(b'{"n":1}\n')
    reader = MultiSourceReader([scripted.build(), JsonlSource(tmp_path / "in.jsonl").build()])
    batches = reader.poll(1 << 20)
    assert [(b.source, b.lines, b.watermark) for b in batches] == [
        ("p0", [], 7),
        (str(tmp_path / "in.jsonl"), [b'{"n":1}'], None),
    ]
