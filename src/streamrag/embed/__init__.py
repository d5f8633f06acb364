"""Stage ⑦ of the data path: turn chunk texts into vectors, in batches.

:mod:`.base` holds the :class:`Embedder` contract and the loader for configured
embedders; :mod:`.hashing` a fast deterministic embedder for tests and
benchmarks; :mod:`.sentence_transformers` the default MiniLM model (loaded lazily).
:mod:`.onnx` runs the same model through ONNX Runtime, in fp32 or int8 (``minilm-onnx``).
"""

from streamrag.embed.base import REGISTRY, Embedder, build_embedder, check_vectors
from streamrag.embed.hashing import HashingEmbedder

__all__ = ["REGISTRY", "Embedder", "HashingEmbedder", "build_embedder", "check_vectors"]
