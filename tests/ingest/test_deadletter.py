"""The dead-letter store: ids, one copy per record, torn tails, re-injection records."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamrag.errors import StreamragError
from streamrag.ingest import DeadLetter, DeadLetterStore


def _letter(offset: int, stage: str = "decode") -> DeadLetter:
    return DeadLetter("in.jsonl", offset, stage, f"bad record at {offset}", "{oops")


def test_records_get_stable_ids_and_are_stored_once_per_source_offset_and_stage(
    tmp_path: Path,
) -> None:
    store = DeadLetterStore(tmp_path / "dead.jsonl")
    assert store.add_many([_letter(0), _letter(10)], 0) == 2
    # The stream is replayed after a crash: the same records are refused again.
    again = DeadLetterStore(tmp_path / "dead.jsonl")
    assert again.add_many([_letter(10), _letter(20), _letter(10, "embed")], 0) == 2
    assert again.count == 4
    assert [(e.id, e.letter.offset, e.letter.stage) for e in again.entries()] == [
        (1, 0, "decode"),
        (2, 10, "decode"),
        (3, 20, "decode"),
        (4, 10, "embed"),
    ]
    assert again.get(3).letter.reason == "bad record at 20"
    with pytest.raises(StreamragError, match="no dead letter has id 9"):
        again.get(9)


def test_a_torn_last_line_is_cut_on_open(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    store = DeadLetterStore(path)
    store.add_many([_letter(0)], 0)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"source": "in.jsonl", "offset": 5, "sta')  # a crash mid-append
    reopened = DeadLetterStore(path)
    assert reopened.count == 1
    reopened.add_many([_letter(5)], 0)  # written again, whole, on replay
    assert [e.letter.offset for e in DeadLetterStore(path).entries()] == [0, 5]


def test_re_injections_are_recorded(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path / "dead.jsonl")
    store.add_many([_letter(0), _letter(1)], 0)
    store.mark_replayed([2], tmp_path / "replay-1.jsonl", 0)
    assert [e.replayed_to for e in store.entries()] == [None, str(tmp_path / "replay-1.jsonl")]
