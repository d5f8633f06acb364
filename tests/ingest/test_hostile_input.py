"""Hostile input through the real decoder and the pipeline: nothing is lost, whatever it is.

Every line read is applied or dead-lettered with its reason, exactly once, and
counted — a line nested 100,000 levels deep, a 50 MB line, a byte-order mark,
random bytes, random JSON shapes, or an event-time stage that throws.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrag.chunking import TokenSplitter
from streamrag.index import LsmIndex
from streamrag.index.base import CommitBatch, CommitResult
from streamrag.ingest import DeadLetterStore, Decoder
from streamrag.runtime import Pipeline
from streamrag.sources import JsonlSource, RawBatch
from streamrag.testing import FakeEmbedder, ManualClock, change_line
from tests.conftest import with_batcher

T0 = 1_714_521_600


def _deep(levels: int) -> bytes:
    inner = b'{"a":' * levels + b"1" + b"}" * levels
    return b'{"doc_id":"deep","event_time":1,"text":"t","metadata":' + inner + b"}"


def _pipeline(path: Path, tmp: Path, **kwargs: Any) -> tuple[Pipeline, list[int]]:
    """A pipeline over ``path`` and the list of offsets its commits carried."""
    clock = ManualClock(T0 * 10**6)
    emb = FakeEmbedder()
    committed: list[int] = []

    def hook(b: CommitBatch, r: CommitResult) -> None:
        committed.extend(d.offset for d in b.docs)

    p = Pipeline(
        source=JsonlSource(path, max_line_bytes=1_000_001),
        embedder=emb,
        index=LsmIndex(emb.dim, clock=clock),
        dead_letters=DeadLetterStore(tmp / "dead.jsonl", truncate=True),
        clock=clock,
        splitter=TokenSplitter(max_tokens=32, overlap_tokens=4),
        on_commit=[hook],
        **with_batcher(kwargs, clock),
    )
    return p, committed


def _lines(path: Path, lines: list[bytes]) -> list[int]:
    """Write the lines; return each one's byte offset."""
    offsets, at = [], 0
    with path.open("wb") as fh:
        for line in lines:
            offsets.append(at)
            fh.write(line + b"\n")
            at += len(line) + 1
    return offsets


def test_a_deeply_nested_line_is_dead_lettered_and_its_neighbours_applied(tmp_path: Path) -> None:
    good = [change_line(f"d{i}", T0, f"text {i}").encode() for i in range(20)]
    path = tmp_path / "in.jsonl"
    offsets = _lines(path, [*good[:10], _deep(100_000), *good[10:]])
    p, committed = _pipeline(path, tmp_path)
    p.run_until_caught_up()
    st = p.stats
    assert (st.ingested, st.applied, st.dead_lettered) == (21, 20, 1)
    [letter] = list(p.dead_letters.read())
    assert letter.offset == offsets[10]
    assert "nested too deeply" in letter.reason
    assert sorted(committed) == [o for i, o in enumerate(offsets) if i != 10]
    assert p.caught_up


def test_a_50_mb_line_says_its_real_size(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    huge = b'{"doc_id":"big","event_time":1,"text":"' + b"x" * (50 * 2**20) + b'"}'
    _lines(path, [change_line("a", T0, "fine").encode(), huge, change_line("b", T0, "ok").encode()])
    p, _ = _pipeline(path, tmp_path)
    p.run_until_caught_up()
    [letter] = list(p.dead_letters.read())
    assert f"record is {len(huge):,} bytes" in letter.reason
    assert "max_document_bytes=1,000,000" in letter.reason
    assert (p.stats.applied, p.stats.dead_lettered) == (2, 1)


def test_a_byte_order_mark_is_dropped_and_an_empty_tenant_refused() -> None:
    bom = b"\xef\xbb\xbf" + change_line("a", T0, "with a BOM").encode()
    empty = change_line("b", T0, "no tenant", tenant="").encode()
    null = change_line("c", T0, "default tenant", tenant=None).encode()
    batch, letters = Decoder().decode([RawBatch("in", [bom, empty, null], [0, 1, 2], 3)])
    assert batch.doc_ids == ["a", "c"]
    assert batch.tenants == ["default", "default"]
    [letter] = letters
    assert letter.offset == 1
    assert "'tenant' is empty" in letter.reason


class _ThrowingStage:
    """An event-time stage that fails on every batch (a bug, a bad window value)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def process(self, changes: Any) -> Any:
        raise RuntimeError("window state is broken")


def test_an_event_time_stage_that_throws_loses_no_read(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    _lines(path, [change_line(f"d{i}", T0, f"text {i}").encode() for i in range(5)])
    p, committed = _pipeline(path, tmp_path)
    p.event_time = _ThrowingStage(p.event_time)  # type: ignore[assignment]
    p.run_until_caught_up()
    assert len(committed) == 5  # every change reached the index
    assert (p.stats.applied, p.stats.dead_lettered, p.stats.window_errors) == (5, 0, 5)
    letters = list(p.dead_letters.read())
    assert {x.stage for x in letters} == {"window-error"}
    assert "window state is broken" in letters[0].reason


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_shapes = st.fixed_dictionaries(
    {},
    optional={
        "doc_id": _json | st.text(min_size=1, max_size=6),
        "event_time": _json | st.integers(0, 2**31),
        "op": _json | st.sampled_from(["upsert", "delete"]),
        "text": _json | st.text(min_size=1, max_size=40),
        "tenant": _json,
        "metadata": _json,
    },
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=60),
            _shapes.map(lambda r: json.dumps(r).encode()),
            st.integers(0, 10**6).map(lambda i: change_line(f"ok-{i}", T0, f"valid {i}").encode()),
            st.integers(2, 6).map(lambda e: _deep(10**e)),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_every_line_is_applied_or_dead_lettered_exactly_once(
    tmp_path: Path, lines: list[bytes]
) -> None:
    lines = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    lines = [line for line in lines if line.strip(b" ")]  # blank lines are not records
    if not lines:
        return
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / "in.jsonl"
    offsets = _lines(path, lines)
    p, committed = _pipeline(path, folder, max_batch_size=4)
    p.run_until_caught_up()
    dead = [x.offset for x in p.dead_letters.read() if x.stage == "decode"]
    st = p.stats
    assert st.ingested == len(lines)
    assert st.applied + st.dead_lettered == st.ingested
    assert st.dead_lettered == len(dead)
    # Every valid change is committed as a version (nothing is stale: offsets differ).
    assert st.stale == 0
    assert len(committed) == st.applied
    assert sorted([*committed, *dead]) == offsets  # each line once, applied or dead-lettered
    p.close()
