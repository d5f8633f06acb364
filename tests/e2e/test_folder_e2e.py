"""A folder of documents through the real server, with two crashes: the index ends as the folder is.

``python -m streamrag run CFG`` indexes a folder (``sources: [{kind: folder}]``)
while a writer keeps changing it — new files, edits, deletes, renames, a folder
moved in. The first process kills itself inside a commit (the embedder
SIGKILLs it on a chosen call); the second is SIGKILLed by the test while
changes stream in; more changes are made while it is down; the third catches
up. Then the index, opened on the state directory, must hold exactly the
folder's files, each at its current text: nothing lost, nothing twice, no
removed file back.
"""

from __future__ import annotations

import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamrag.config import IndexSettings
from streamrag.index import LsmIndex
from streamrag.index.factory import lsm_spec
from streamrag.ingest.normalize import normalize_text
from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.timeout(240)

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
INDEX = {"checkpoint_every": 16, "seal_rows": 1024}


class Writer:
    """Changes the folder at random: create, edit, delete, rename, move a folder in."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.n = 0

    def text(self, name: str) -> str:
        self.n += 1
        words = " ".join(self.rng.choice(WORDS) for _ in range(6))
        return f"{name} revision {self.n} {words}\n"

    def create(self, sub: str = "") -> None:
        name = f"{sub}doc-{self.n}-{self.rng.randrange(10**6)}.{self.rng.choice(['md', 'txt'])}"
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text(name), encoding="utf-8")

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def step(self) -> None:
        files = self.files()
        roll = self.rng.random()
        if roll < 0.3 or len(files) < 20:
            self.create(self.rng.choice(["", "a/", "b/c/"]))
        elif roll < 0.6:
            path = self.rng.choice(files)
            path.write_text(self.text(path.name), encoding="utf-8")
        elif roll < 0.75:
            self.rng.choice(files).unlink()
        elif roll < 0.9:
            path = self.rng.choice(files)
            path.rename(path.with_name(f"renamed-{self.n}-{path.name}"))
            self.n += 1
        else:  # a folder of files made elsewhere and moved in at once
            outside = self.root.parent / f"incoming-{self.n}"
            for i in range(3):
                outside.mkdir(exist_ok=True)
                (outside / f"moved-{i}.md").write_text(self.text(f"moved {i}"), encoding="utf-8")
            shutil.move(str(outside), str(self.root / f"moved-in-{self.n}"))
            self.n += 1

    def truth(self) -> dict[str, str]:
        return {
            p.relative_to(self.root).as_posix(): normalize_text(p.read_text(encoding="utf-8"))
            for p in self.files()
        }


def _config(tmp: Path, folder: Path) -> Path:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        f"""
state_dir: {tmp / "state"}
sources:
  - {{kind: folder, name: docs, path: {folder}, settle_ms: 50}}
embedder: {{class: "tests.runtime.embedders:SelfKilling", args: {{dim: 64}}}}
batcher: {{max_batch_size: 8, max_delay_ms: 5, adaptive: false}}
index: {{checkpoint_every: {INDEX["checkpoint_every"]}, seal_rows: {INDEX["seal_rows"]}}}
""",
        encoding="utf-8",
    )
    return cfg


def _applied(server: Server) -> int:
    return int(server.status()["counts"]["applied"])


def _writing(writer: Writer, stop: threading.Event, pause_s: float) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            writer.step()
            time.sleep(pause_s)  # a writer's pace, not a wait for the system under test

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigkill_mid_stream_and_restart_ends_with_the_index_equal_to_the_folder(
    tmp_path: Path,
    start_server: Callable[..., Server],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    writer = Writer(folder, seed=7)
    for _ in range(150):
        writer.create(writer.rng.choice(["", "a/", "b/c/"]))
    cfg = _config(tmp_path, folder)

    # 1. The first run dies inside its 6th commit, while the initial load is under way.
    monkeypatch.setenv("KILLTEST_AT_CALL", "6")
    monkeypatch.setenv("KILLTEST_AFTER_US", "300")
    first = start_server("run", str(cfg))
    first.proc.wait(60)
    assert first.proc.returncode == -signal.SIGKILL, first.log.read_text()[-2000:]
    monkeypatch.delenv("KILLTEST_AT_CALL")

    # 2. The second run is killed by the test while changes stream in.
    second = start_server("run", str(cfg))
    second.wait_ready()
    stop = threading.Event()
    thread = _writing(writer, stop, pause_s=0.005)
    at = _applied(second)
    wait_for(lambda: _applied(second) > at + 40, 60, "the restarted job to apply changes")
    status = second.status()
    assert status["recovery"]["resumed_from_epoch"] is not None
    assert status["sources"]["docs"]["kind"] == "folder"
    second.proc.send_signal(signal.SIGKILL)
    second.proc.wait(10)
    stop.set()
    thread.join()

    # 3. While it is down: more edits, deletes and renames.
    for _ in range(60):
        writer.step()

    # 4. The third run catches up, with live changes still coming for a while.
    third = start_server("run", str(cfg))
    third.wait_ready()
    stop = threading.Event()
    thread = _writing(writer, stop, pause_s=0.01)
    time.sleep(1.0)  # let changes stream in while the restarted job catches up
    stop.set()
    thread.join()
    truth = writer.truth()

    def settled() -> bool:
        s = third.status()
        docs = s["sources"]["docs"]
        return bool(
            s["ingest_lag"]["caught_up"]
            and docs["queued"] == 0
            and docs["unsettled"] == 0
            and s["index"]["live_docs"] == len(truth)
        )

    wait_for(settled, 90, "the job to catch up with the folder")
    status = third.status()
    assert status["sources"]["docs"]["files"] == len(truth)
    assert status["sources"]["docs"]["last_error"] is None
    assert status["counts"]["dead_lettered"] == 0
    assert third.stop() == 0

    index = LsmIndex(64, lsm_spec(IndexSettings(**INDEX)), path=tmp_path / "state" / "index")
    try:
        rows = index.export()
        chunk_ids = [hit.chunk_id for hit, _ in rows]
        assert len(chunk_ids) == len(set(chunk_ids)), "nothing applied twice"
        docs: dict[str, str] = {}
        for hit, _ in rows:
            assert hit.doc_id not in docs, f"{hit.doc_id} twice"
            docs[hit.doc_id] = hit.text
        assert set(docs) - set(truth) == set(), "no removed or renamed-away file is back"
        assert set(truth) - set(docs) == set(), "no file lost"
        assert docs == truth, "each at its current text"
        assert writer.n > 300
    finally:
        index.close()
