"""The HNSW structure itself: files it writes and refuses, cancelled builds, threads per call."""

from __future__ import annotations

import logging
import os
import struct
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from streamrag.errors import ForeignFileError, QueryError
from streamrag.index.ann import (
    AnnSpec,
    BuildCancelled,
    HnswAnn,
    IvfPqAnn,
    build_threads,
    load_hnsw,
    recall_at_10,
)

DIM = 32
SPEC = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=16)


def _clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((20, DIM)).astype(np.float32)
    x = centers[rng.integers(0, 20, n)] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_saved_graph_reads_back_the_same(tmp_path: Path) -> None:
    data = _clustered(3000, seed=1)
    built = HnswAnn.build(data, SPEC)
    path = tmp_path / "seg.hnsw"
    built.save(str(path))
    loaded = load_hnsw(str(path), data, SPEC)
    assert isinstance(loaded, HnswAnn)
    assert loaded.rows == 3000
    assert loaded.nbytes() == built.nbytes()
    q = _clustered(50, seed=2)
    loaded.index.hnsw.efSearch = built.ef
    got, want = loaded.search(q, 10), built.search(q, 10)
    assert np.array_equal(got[0], want[0])
    assert got[1] is not None
    assert want[1] is not None
    assert np.allclose(got[1], want[1])
    # The graph's scores are the exact inner products.
    assert np.allclose(want[1], np.take_along_axis(q @ data.T, want[0], axis=1), atol=1e-5)


def test_the_same_seed_builds_the_same_graph_on_one_thread(tmp_path: Path) -> None:
    data = _clustered(2500, seed=3)
    one = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=16, build_threads=1)
    files = []
    for name in ("a", "b"):
        path = tmp_path / name
        HnswAnn.build(data, one).save(str(path))
        files.append(path.read_bytes())
    assert files[0] == files[1]


def test_build_threads_are_the_process_cpus_unless_set() -> None:
    assert build_threads(AnnSpec(build_threads=3)) == 3
    assert build_threads(AnnSpec()) == len(os.sched_getaffinity(0))


def _task_nice() -> dict[int, int]:
    """Each thread of this process and its nice value (/proc/self/task/*/stat)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        with open(task / "stat", encoding="ascii") as fh:
            fields = fh.read().rpartition(")")[2].split()
        out[int(task.name)] = int(fields[16])  # the 19th field; 17th after the name
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc, sets a thread's nice value")
def test_a_build_on_two_threads_runs_them_at_the_builders_priority_and_is_as_good() -> None:
    """The maintenance thread builds at a lower priority: OpenMP's threads must inherit it.

    They are started by the building thread; sampled between two parts of the
    build, a thread besides the builder has the builder's nice value.
    """
    import faiss

    from streamrag.index import ann as ann_module

    data = _clustered(4 * ann_module._BUILD_PART, seed=8)
    spec = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=16, build_threads=2)
    before = set(_task_nice())
    during: list[dict[int, int]] = []
    after: list[int] = []
    built: list[HnswAnn] = []

    def look() -> bool:  # asked between parts: never cancels
        during.append(_task_nice())
        return False

    def build() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 5)
        built.append(HnswAnn.build(data, spec, look))
        after.append(faiss.omp_get_max_threads())

    builder = threading.Thread(target=build)
    builder.start()
    builder.join()
    assert len(during) == 4
    started = [nice for tid, nice in during[-1].items() if tid not in before]
    # Only the builder was given nice 5: a second thread at 5 is one it started (OpenMP's).
    assert started.count(5) >= 2
    assert after == [1]  # searches in the builder's thread stay on one core
    sample = np.arange(0, data.shape[0], 16)
    assert recall_at_10(built[0], data, sample) >= 0.95


def _hnswlib_like(path: Path, rows: int) -> None:
    """What hnswlib's saveIndex writes: its header (level-0 offset first), then rows of links."""
    size = 4 + 2 * 8 * 4 + DIM * 4 + 8  # links of level 0, the vector, the label
    head = struct.pack(
        "<6QiI3QdQ", 0, rows, rows, size, size - 8, 4 + 2 * 8 * 4, 2, 0, 8, 16, 8, 0.48, 40
    )
    rng = np.random.default_rng(0)
    path.write_bytes(head + rng.integers(0, 256, rows * size, dtype=np.uint8).tobytes())


@pytest.mark.parametrize("kind", ["hnswlib", "garbage_after_header", "other_rows", "empty"])
def test_a_file_of_another_format_or_segment_is_refused_not_misread(
    tmp_path: Path, kind: str
) -> None:
    data = _clustered(2000, seed=4)
    path = tmp_path / "seg.hnsw"
    if kind == "hnswlib":
        _hnswlib_like(path, 2000)
    elif kind == "garbage_after_header":
        HnswAnn.build(data, SPEC).save(str(path))
        raw = bytearray(path.read_bytes())
        path.write_bytes(bytes(raw[:40]) + b"\x00" * 64)
    elif kind == "other_rows":
        HnswAnn.build(data[:1500], SPEC).save(str(path))
    else:
        path.write_bytes(b"")
    with pytest.raises(ForeignFileError, match="is not a FAISS HNSW graph of these 2000 rows"):
        load_hnsw(str(path), data, SPEC)


def test_a_build_stops_between_parts_when_cancelled() -> None:
    from streamrag.index import ann as ann_module

    data = _clustered(3 * ann_module._BUILD_PART + 10, seed=5)
    asked = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) > 2

    with pytest.raises(BuildCancelled):
        HnswAnn.build(data, SPEC, cancelled)
    assert len(asked) == 3  # two parts went in, the third was not started
    whole = HnswAnn.build(data, SPEC, lambda: False)
    assert whole.index.ntotal == data.shape[0]


def test_a_build_takes_one_thread_for_each_part_while_the_index_is_busy() -> None:
    import faiss

    from streamrag.index import ann as ann_module

    data = _clustered(4 * ann_module._BUILD_PART, seed=9)
    spec = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=16, build_threads=2)
    answers = iter([False, True, True, False])
    used: list[int] = []  # the threads of the part before, seen before each next one

    def look() -> bool:
        used.append(faiss.omp_get_max_threads())
        return False

    def busy() -> bool:
        return next(answers)

    built = HnswAnn.build(data, spec, look, busy)
    assert used[1:] == [2, 1, 1]  # parts 1-3; part 4 (wide again) is seen by nobody
    assert built.index.ntotal == data.shape[0]
    assert faiss.omp_get_max_threads() == 1
    one = AnnSpec(hnsw_m=8, hnsw_ef_construction=40, hnsw_ef_search=16, build_threads=1)
    used.clear()
    HnswAnn.build(data, one, look, lambda: False)
    assert set(used) == {1}


def test_every_thread_searches_with_one_openmp_thread() -> None:
    """OpenMP's thread count is per thread: each thread that searches must get one."""
    import faiss

    data = _clustered(2000, seed=6)
    ann = HnswAnn.build(data, SPEC)
    seen: list[int] = []

    def query() -> None:
        ann.search(data[:64], 10)
        seen.append(faiss.omp_get_max_threads())

    threads = [threading.Thread(target=query) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1, 1, 1]


def test_more_neighbours_than_rows() -> None:
    data = _clustered(40, seed=7)
    ann = HnswAnn.build(data, SPEC)
    labels, scores = ann.search(data[:3], 100)
    assert labels.shape == (3, 40)
    assert scores is not None
    for row, row_scores in zip(labels, scores, strict=True):
        found = row[row >= 0]
        assert len(set(found.tolist())) == found.size  # no row twice, best first
        assert np.all(np.diff(row_scores[row >= 0]) <= 1e-6)
        assert np.isneginf(row_scores[row < 0]).all()  # pads, if the graph reached fewer
    assert labels[0, 0] == 0  # a row is its own nearest neighbour
    empty = ann.search(data[:2], 0)
    assert empty[0].shape == (2, 0)


def test_queries_of_any_layout_search_alike_and_a_wrong_width_is_refused() -> None:
    # The graph is searched through pointers to the query block: a strided,
    # Fortran-ordered or float64 block must be made contiguous float32 first,
    # and a block of the wrong width must not be read past its end.
    data = _clustered(2000, seed=8)
    ann = HnswAnn.build(data, SPEC)
    q = _clustered(6, seed=9)
    want_labels, want_scores = ann.search(q, 10)
    assert want_scores is not None
    assert np.allclose(want_scores, np.take_along_axis(q @ data.T, want_labels, axis=1), atol=1e-5)
    wide = np.zeros((12, DIM), np.float32)
    wide[::2] = q
    for layout in (wide[::2], np.asfortranarray(q), q.astype(np.float64)):
        labels, scores = ann.search(layout, 10)  # type: ignore[arg-type]
        assert np.array_equal(labels, want_labels)
        assert scores is not None
        assert np.allclose(scores, want_scores)
    with pytest.raises(QueryError, match=f"shape \\(n, {DIM}\\)"):
        ann.search(q[:, : DIM // 2], 10)
    with pytest.raises(QueryError, match=f"shape \\(n, {DIM}\\)"):
        ann.search(q[0], 10)


def test_an_index_saved_with_hnswlib_graphs_opens_and_builds_them_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgrading: a checkpoint whose graph files hnswlib wrote (checksums right) still opens."""
    from streamrag.changes import Op
    from streamrag.index import LsmIndex, LsmSpec, SearchFilter
    from streamrag.index.compaction import CompactionSpec
    from streamrag.index.store import file_checksum, read_manifest, write_manifest

    from .reference import Change, make_batch, unit

    dim = 8
    spec = LsmSpec(
        seal_rows=64,
        ann=AnnSpec(min_rows=64, hnsw_m=8, hnsw_ef_construction=32),
        compaction=CompactionSpec(fanout=8, seal_rows=64),
        checkpoint_every=1000,
    )
    index = LsmIndex(dim, spec, path=tmp_path)
    for e in range(4):
        changes = [
            Change(f"d{e}-{i}", Op.UPSERT, e * 100 + i, e * 100 + i, (e * 100 + i,))
            for i in range(64)
        ]
        index.commit(make_batch(changes, dim))
    while index.maintain():
        pass
    index.checkpoint()
    assert index.health().ann_segments >= 1

    def answer(ix: LsmIndex) -> list[list[str]]:
        q = np.stack([unit(s, dim) for s in (3, 150, 777)])
        return [[h.doc_id for h in hits] for hits in ix.search_many(q, 10, SearchFilter())[1]]

    want = answer(index)
    index.close()
    graphs = sorted(tmp_path.glob("seg-*.hnsw"))
    assert graphs
    [manifest] = sorted(tmp_path.glob("manifest-*.json"))[-1:]
    body = read_manifest(manifest)
    for g in graphs:
        _hnswlib_like(g, 64)  # what an earlier streamrag left there
        body["files"][g.name] = file_checksum(g)
    write_manifest(manifest, body)

    with caplog.at_level(logging.WARNING, logger="streamrag.index"):
        again = LsmIndex(dim, spec, path=tmp_path, background=False)
    assert caplog.text.count("built again in the background") == len(graphs)
    assert again.health().ann_segments == 0  # opened at once, scanned exactly meanwhile
    assert answer(again) == want
    while again.maintain():
        pass
    assert again.health().ann_segments == index.health().ann_segments
    assert again.health().exact_by_measurement == 0
    assert answer(again) == want
    again.checkpoint()  # the rebuilt graphs are written in FAISS's format
    again.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamrag.index"):
        third = LsmIndex(dim, spec, path=tmp_path, background=False)
    assert "built again" not in caplog.text
    assert third.health().ann_segments == index.health().ann_segments
    third.close()


def test_the_hot_path_gives_what_a_search_gives_and_pq_leaves_it_to_search() -> None:
    data = _clustered(2000, seed=10)
    ann = HnswAnn.build(data, SPEC)
    q = np.ascontiguousarray(_clustered(5, seed=11))
    top = ann.top_k(q, 10)
    assert top is not None
    labels, scores = ann.search(q, 10)
    assert np.array_equal(top[0], labels)
    assert scores is not None
    assert np.array_equal(top[1], scores)
    pq = IvfPqAnn.build(_clustered(4000, seed=12), AnnSpec(pq_m=8))
    assert pq.top_k(q, 10) is None  # approximate scores: re-scored on the search path
