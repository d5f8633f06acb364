from __future__ import annotations

from pathlib import Path

import pytest

from streamrag.errors import SourceError
from streamrag.sources import JsonlSource


def _lines(batches: list) -> list[bytes]:  # type: ignore[type-arg]
    return [line for b in batches for line in b.lines]


def test_reads_complete_lines_and_resumes_at_byte_offset(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"n":1}\n{"n":2}\n{"n":3')  # the last line is still being written
    reader = JsonlSource(f).build()
    batches = reader.poll(1 << 20)
    assert _lines(batches) == [b'{"n":1}', b'{"n":2}']
    assert batches[0].offsets == [0, 8]
    assert reader.snapshot() == {str(f): 16}
    assert reader.backlog_bytes() == 6
    assert reader.poll(1 << 20) == []  # the partial line is not read early
    with open(f, "ab") as fh:
        fh.write(b"}\n")
    assert _lines(reader.poll(1 << 20)) == [b'{"n":3}']
    # A new reader resumed from the snapshot starts exactly there.
    with open(f, "ab") as fh:
        fh.write(b'{"n":4}\n')
    resumed = JsonlSource(f).build(reader.snapshot())
    assert _lines(resumed.poll(1 << 20)) == [b'{"n":4}']


def test_final_poll_returns_a_last_line_without_newline(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"n":1}\n{"n":2}')
    reader = JsonlSource(f).build()
    assert _lines(reader.poll(1 << 20, final=True)) == [b'{"n":1}', b'{"n":2}']
    assert reader.backlog_bytes() == 0


def test_respects_the_read_budget(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"".join(b'{"n":%d}\n' % i for i in range(100)))
    reader = JsonlSource(f).build()
    first = _lines(reader.poll(40))
    assert 1 <= len(first) <= 5
    rest = []
    while batch := reader.poll(40):
        rest += _lines(batch)
    assert len(first) + len(rest) == 100


def test_a_line_longer_than_the_budget_is_cut_and_skipped(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"x" * 200_000 + b"\n" + b'{"n":1}\n')
    reader = JsonlSource(f, max_line_bytes=1000).build()
    lines = _lines(reader.poll(100))
    assert len(lines) == 1
    assert len(lines[0]) == 1000  # kept head only: memory stays bounded
    assert _lines(reader.poll(100)) == [b'{"n":1}']


def test_directory_picks_up_new_files_and_skips_others(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"f":"a"}\n')
    (tmp_path / "notes.txt").write_bytes(b"ignored\n")
    reader = JsonlSource(tmp_path).build()
    assert _lines(reader.poll(1 << 20)) == [b'{"f":"a"}']
    (tmp_path / "b.jsonl").write_bytes(b'{"f":"b"}\n')
    batches = reader.poll(1 << 20)
    assert _lines(batches) == [b'{"f":"b"}']
    assert batches[0].source == str(tmp_path / "b.jsonl")
    assert set(reader.snapshot()) == {str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")}


def test_missing_file_is_empty_until_it_appears(tmp_path: Path) -> None:
    f = tmp_path / "later.jsonl"
    reader = JsonlSource(f).build()
    assert reader.poll(100) == []
    f.write_bytes(b'{"n":1}\n')
    assert _lines(reader.poll(100)) == [b'{"n":1}']


def test_truncated_file_is_an_error_with_advice(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"n":1}\n{"n":2}\n')
    reader = JsonlSource(f).build()
    reader.poll(100)
    f.write_bytes(b"")
    with pytest.raises(SourceError, match="append-only"):
        reader.poll(100)
