"""Every registered embedder goes through the same checks."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from functools import cache

import numpy as np
import pytest

from streamrag.embed import REGISTRY, build_embedder
from streamrag.embed.base import Embedder
from streamrag.embed.onnx import OnnxEmbedder
from streamrag.embed.remote import OpenAIEmbedder
from streamrag.testing import CountingEmbedder, FakeEmbedder
from tests.embed.test_onnx import run_cache
from tests.embed.test_remote import serving_streamrag

TEXTS = ["How do I rotate the database password?", "Parental leave in Spain", "", "ünïcödé"]


@cache
def _registered(name: str) -> Embedder:
    return build_embedder(name)


def _embedders() -> list[object]:
    out: list[object] = [
        pytest.param(FakeEmbedder, id="fake"),
        pytest.param(lambda: CountingEmbedder(), id="counting"),
    ]
    for name in sorted(set(REGISTRY.values())):
        if name.startswith(("streamrag.embed.remote:", "streamrag.embed.onnx:")):
            continue  # they need a server, or the run's model cache: the cases below
        marks = [pytest.mark.slow] if "sentence_transformers" in name else []
        out.append(pytest.param(lambda n=name: _registered(n), id=name, marks=marks))
    for precision in ("int8", "fp32"):
        out.append(
            pytest.param(
                f"onnx_{precision}",
                id=f"streamrag.embed.onnx:OnnxEmbedder[{precision}]",
                marks=[pytest.mark.slow],
            )
        )
    # The OpenAI-compatible embedder, against a real streamrag serving /v1/embeddings.
    out.append(
        pytest.param(
            "remote_openai", id="streamrag.embed.remote:OpenAIEmbedder", marks=[pytest.mark.slow]
        )
    )
    return out


@pytest.fixture(scope="module")
def remote_openai(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedder]:
    with serving_streamrag(tmp_path_factory.mktemp("serve")) as url:
        emb = OpenAIEmbedder(url, model="contract")
        yield emb
        emb.close()


@pytest.fixture(scope="module")
def onnx_int8(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    return OnnxEmbedder("int8", cache_dir=run_cache(tmp_path_factory))


@pytest.fixture(scope="module")
def onnx_fp32(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    return OnnxEmbedder("fp32", cache_dir=run_cache(tmp_path_factory))


@pytest.mark.parametrize("make", _embedders())
def test_embedder_contract(make, request: pytest.FixtureRequest) -> None:  # type: ignore[no-untyped-def]
    emb = request.getfixturevalue(make) if isinstance(make, str) else make()
    assert type(emb).__doc__
    assert isinstance(emb.version, str)
    assert emb.version
    inputs = list(TEXTS)
    a = emb.embed_many(inputs)
    assert inputs == TEXTS  # the input is not mutated
    assert a.dtype == np.float32
    assert a.shape == (len(TEXTS), emb.dim)
    assert np.isfinite(a).all()
    norms = np.linalg.norm(a, axis=1)
    assert np.all((np.abs(norms - 1) < 1e-3) | (norms == 0))
    np.testing.assert_allclose(emb.embed_many(inputs), a, atol=1e-5)  # deterministic
    one = emb.embed_many(TEXTS[:1])
    np.testing.assert_allclose(one[0], a[0], atol=1e-5)  # batching does not change vectors
    assert emb.embed_many([]).shape == (0, emb.dim)


def test_hashing_embedder_pickles() -> None:
    emb = _registered("streamrag.embed.hashing:HashingEmbedder")
    clone = pickle.loads(pickle.dumps(emb))
    np.testing.assert_array_equal(clone.embed_many(TEXTS), emb.embed_many(TEXTS))


@pytest.mark.slow
def test_minilm_ranks_by_meaning_offline() -> None:
    emb = _registered("streamrag.embed.sentence_transformers:SentenceTransformerEmbedder")
    q, near, far = emb.embed_many(
        ["How can I change my login secret?", "Steps to reset your password", "Lunch menu today"]
    )
    assert q @ near > q @ far + 0.2  # no shared words, related meaning
    assert emb.version == "sentence-transformers/all-MiniLM-L6-v2"


@pytest.mark.slow
def test_minilm_chunks_fit_its_own_token_budget() -> None:
    from streamrag.config import load_settings
    from streamrag.runtime.build import build_splitter

    emb = _registered("streamrag.embed.sentence_transformers:SentenceTransformerEmbedder")
    settings = load_settings(
        overrides={"chunking.max_tokens": 32, "chunking.overlap_tokens": 4}, environ={}
    )
    splitter = build_splitter(settings, emb)
    text = " ".join(f"internationalization{i} configuration-management" for i in range(60))
    chunks = splitter.split(text)
    assert len(chunks) > 5
    assert all(emb.count_tokens(c) <= 32 for c in chunks)  # type: ignore[attr-defined]
    # Counting words instead would overshoot: these words are several pieces each.
    assert emb.count_tokens(" ".join(text.split()[:32])) > 32  # type: ignore[attr-defined]
