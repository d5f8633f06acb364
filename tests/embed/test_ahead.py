"""Embedding ahead in a worker process: the same vectors, only ever a head start.

Every test runs a real worker (``python -m streamrag.embed.ahead_worker``).
"""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from streamrag.config import load_settings
from streamrag.cpus import process_cpus
from streamrag.embed.ahead import LOCK_FREE, EmbedAhead, agreed_share
from streamrag.embed.ahead_worker import read_frame, write_frame
from streamrag.embed.base import check_vectors
from streamrag.embed.hashing import HashingEmbedder
from streamrag.runtime.build import build_ahead
from streamrag.runtime.metrics import Metrics
from streamrag.runtime.replay import index_digest
from streamrag.runtime.service import Service
from streamrag.testing import CountingEmbedder, ManualClock, change_line
from tests.embed.ahead_embedders import (
    POISON,
    OtherVersion,
    Poisoned,
    Recording,
    Waiting,
)

READY_S = 60.0  # a bound for a worker to start: a cold interpreter on a busy machine


def _texts(n: int, tag: str = "t") -> list[str]:
    words = ["alpha", "beta", "gamma", "delta", "kappa", "omega"]
    return [f"{tag}{i} " + " ".join(words[(i + j) % 6] for j in range(i % 9 + 1)) for i in range(n)]


@pytest.fixture
def started() -> Any:
    made: list[EmbedAhead] = []

    def start(embedder: Any = None, **kwargs: Any) -> EmbedAhead:
        ahead = EmbedAhead(embedder or HashingEmbedder(dim=32), **kwargs)
        made.append(ahead)
        assert ahead.start()
        assert ahead.wait_ready(READY_S), ahead.refused
        return ahead

    yield start
    for ahead in made:
        ahead.close()


def test_the_worker_makes_the_vectors_this_process_makes(started: Any) -> None:
    emb = HashingEmbedder(dim=64)
    ahead = started(emb, request_size=100)
    texts = _texts(450)
    assert ahead.submit(texts) == 450
    got = ahead.take(texts, timeout_s=READY_S)
    assert got is not None
    here = check_vectors(emb.embed_many(texts), len(texts), 64, "here")
    assert np.array_equal(got.vectors, here)  # bit for bit: stream = batch holds
    assert got.seconds > 0
    assert ahead.ready_for(texts)


def test_what_was_not_sent_is_not_taken_and_held_texts_are_bounded(started: Any) -> None:
    ahead = started(limit=300, request_size=100)
    texts = _texts(400)
    assert ahead.take(["never sent"]) is None
    assert not ahead.ready_for(["never sent"])
    assert ahead.submit(texts[:300]) == 300
    assert ahead.submit(texts[300:]) == 0  # 300 held: not sent
    assert ahead.take(texts[300:], timeout_s=READY_S) is None
    assert ahead.take(texts[250:350], timeout_s=READY_S) is None  # one missing: none taken
    assert ahead.take(texts[:300], timeout_s=READY_S) is not None
    ahead.discard(texts[:100])  # committed: room for 100 more
    assert ahead.submit(texts[300:]) == 100
    assert ahead.take(texts[300:], timeout_s=READY_S) is not None


def test_a_text_waiting_for_two_changes_is_held_until_both_commit(started: Any) -> None:
    ahead = started(limit=10)
    same = ["the same words in two documents"]
    assert ahead.submit(same) == 1
    assert ahead.submit(same) == 1  # held already: not sent again
    ahead.discard(same)
    assert ahead.take(same, timeout_s=READY_S) is not None  # the second still waits for it
    ahead.discard(same)
    assert ahead.take(same) is None


def test_a_call_the_worker_refuses_is_left_to_the_commit(started: Any) -> None:
    ahead = started(Poisoned(dim=32), request_size=10)
    good, bad = _texts(10, "g"), [*_texts(9, "b"), f"a {POISON} text"]
    ahead.submit(good + bad)
    assert ahead.take(bad, timeout_s=READY_S) is None
    assert ahead.take(good, timeout_s=READY_S) is not None
    assert ahead.ready  # a refused call does not end the worker


def test_an_embedder_that_does_not_pickle_stays_in_process() -> None:
    class Local(HashingEmbedder):
        pass

    ahead = EmbedAhead(Local(dim=32))
    assert not ahead.start()
    assert ahead.refused is not None
    assert "cannot be sent to a worker process" in ahead.refused
    assert ahead.submit(["x"]) == 0


def test_a_worker_with_another_embedder_is_refused() -> None:
    ahead = EmbedAhead(OtherVersion(dim=32))
    try:
        assert ahead.start()
        assert not ahead.wait_ready(READY_S)
        assert ahead.refused is not None
        assert "-elsewhere" in ahead.refused
        assert ahead.submit(["x"]) == 0
    finally:
        ahead.close()


def test_the_worker_is_started_again_after_it_died(started: Any) -> None:
    clock = ManualClock(0)
    ahead = started(clock=clock, restart_s=30.0)
    texts = _texts(50)
    pid = ahead.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    ahead.submit(texts)  # may or may not reach it before it is gone
    assert ahead.take(texts, timeout_s=READY_S) is None
    assert ahead.wait_ready(0.0) is False
    assert ahead.pid is None
    assert not ahead.start()  # not again within restart_s
    clock.advance_ms(30_000)
    assert ahead.start()
    assert ahead.wait_ready(READY_S)
    assert ahead.pid not in (None, pid)
    ahead.submit(texts)
    assert ahead.take(texts, timeout_s=READY_S) is not None


def _stat_state(pid: int) -> str | None:
    """The process's state letter, None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_no_worker_outlives_a_killed_job() -> None:
    script = (
        "import sys, time\n"
        "from streamrag.embed.ahead import EmbedAhead\n"
        "from streamrag.embed.hashing import HashingEmbedder\n"
        "a = EmbedAhead(HashingEmbedder(dim=16)); a.start()\n"
        f"assert a.wait_ready({READY_S})\n"
        "print(a.pid, flush=True)\n"
        "sys.stdin.read()\n"  # holds until the test kills it
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as job:
        assert job.stdout is not None
        worker = int(job.stdout.readline())
        assert _stat_state(worker) not in (None, "Z")
        job.send_signal(signal.SIGKILL)
        job.wait()
    deadline = time.monotonic() + READY_S
    while _stat_state(worker) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for the worker to see its pipe close, bounded
    assert _stat_state(worker) in (None, "Z")


@pytest.mark.parametrize("dies", ["while it answers", "halfway through a request"])
def test_a_worker_whose_job_is_gone_ends_without_a_traceback(dies: str) -> None:
    # A SIGKILLed job leaves its worker writing into a closed pipe, or reading half a
    # frame; the worker shares the job's log, where a traceback would read as the
    # job's own failure.
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    worker = subprocess.Popen(
        [sys.executable, "-m", "streamrag.embed.ahead_worker", str(req_r), str(ans_w)],
        pass_fds=(req_r, ans_w),
        stderr=subprocess.PIPE,
    )
    os.close(req_r)
    os.close(ans_w)
    embedder = pickle.dumps(HashingEmbedder(dim=16))
    try:
        with os.fdopen(req_w, "wb") as requests, os.fdopen(ans_r, "rb") as answers:
            write_frame(requests, msgspec.msgpack.encode({"path": sys.path, "embedder": embedder}))
            assert b"ready" in (read_frame(answers) or b"")
            answers.close()  # the job is gone: nobody reads what the worker answers
            frames = [
                msgspec.msgpack.encode({"id": i, "texts": _texts(20, f"r{i}")}) for i in range(2)
            ]
            if dies == "while it answers":
                # Both requests go in one write, below the pipe's atomic size, while the
                # worker still waits for the first: it cannot have ended before the second
                # is in the pipe. The second is never read: the first answer fails.
                both = b"".join(len(f).to_bytes(4, "little") + f for f in frames)
                assert len(both) <= select.PIPE_BUF
                requests.write(both)
            else:
                requests.write(len(frames[0]).to_bytes(4, "little") + frames[0][:10])
        _, err = worker.communicate(timeout=READY_S)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate()  # closes the stderr pipe whatever failed above
    assert b"Traceback" not in err, err.decode()


# -- in the pipeline -------------------------------------------------------------------


def _service(tmp_path: Path, name: str, lines: list[str], **overrides: Any) -> Service:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("\n".join(lines) + "\n")
    settings = load_settings(
        overrides={
            "source.path": str(src),
            "state_dir": str(tmp_path / name),
            "chunking.max_tokens": 8,
            "chunking.overlap_tokens": 2,
            "chunking.tokens": "words",
            "batcher.max_batch_size": 32,
            **overrides,
        },
        environ={},
    )
    return Service(settings)


def _stream(n: int, poison_at: int | None = None) -> list[str]:
    """Upserts of ``n // 2`` documents, each twice (the later version newer), and deletes."""
    out = []
    for i in range(n):
        doc = f"d{i % (n // 2)}"
        text = " ".join(_texts(3, f"{doc}v{i // (n // 2)}x"))
        if i == poison_at:
            text += f" {POISON}"
        out.append(change_line(doc, 1_000 + i, text))
        if i % 17 == 0:
            out.append(change_line(f"d{i // 2}", 1_000 + i, op="delete"))
    return out


def _run_ahead(service: Service) -> EmbedAhead:
    ahead = service.pipeline.embedding.ahead
    assert ahead is not None
    assert ahead.start()
    assert ahead.wait_ready(READY_S), ahead.refused
    service.pipeline.run_until_caught_up()
    return ahead


def _taken(service: Service, outcome: str) -> float:
    return float(service.metrics.embed_ahead.labels(outcome=outcome)._value.get())


def test_a_replay_with_the_worker_equals_one_without(tmp_path: Path) -> None:
    lines = _stream(1200)
    random.Random(3).shuffle(lines)  # versions late, before and after their deletes
    emb = f"{Recording.__module__}:Recording"
    worked = _service(
        tmp_path, "ahead", lines, **{"embedder.class": emb, "embedder.ahead": "process"}
    )
    alone = _service(tmp_path, "alone", lines, **{"embedder.class": emb, "embedder.ahead": "off"})
    _run_ahead(worked)
    alone.pipeline.run_until_caught_up()
    assert index_digest(worked.index) == index_digest(alone.index)
    for count in ("ingested", "applied", "dead_lettered", "stale"):  # not cut-dependent
        assert worked.status()["counts"][count] == alone.status()["counts"][count], count
    here = worked.embedder.pids  # type: ignore[attr-defined]
    embedded = worked.status()["counts"]["chunks_embedded"]
    assert _taken(worked, "ahead") > embedded / 2  # most came from the worker
    assert len(here) < embedded / 2  # ... and were not embedded here
    worked.stop()
    alone.stop()


def test_a_poisoned_text_is_dead_lettered_and_the_rest_committed(tmp_path: Path) -> None:
    lines = _stream(600, poison_at=450)
    random.Random(7).shuffle(lines)
    emb = f"{Poisoned.__module__}:Poisoned"
    service = _service(tmp_path, "p", lines, **{"embedder.class": emb, "embedder.ahead": "process"})
    _run_ahead(service)
    counts = service.status()["counts"]
    assert counts["dead_lettered"] == counts["poison"] == 1
    assert counts["ingested"] == counts["applied"] + counts["dead_lettered"]
    letters = list(service.pipeline.dead_letters.read())
    assert [x.stage for x in letters] == ["embed"]
    assert POISON in letters[0].raw
    assert _taken(service, "ahead") > 0
    assert _taken(service, "missed") > 0  # the poisoned call, embedded here and bisected
    service.stop()


def test_the_job_commits_everything_while_its_worker_is_killed(tmp_path: Path) -> None:
    lines = _stream(1200)
    service = _service(
        tmp_path, "k", lines, **{"embedder.class": "hashing", "embedder.ahead": "process"}
    )
    reference = _service(tmp_path, "r", lines, **{"embedder.class": "hashing"})
    reference.pipeline.run_until_caught_up()
    ahead = service.pipeline.embedding.ahead
    assert ahead is not None
    assert ahead.start()
    assert ahead.wait_ready(READY_S)
    pipeline = service.pipeline
    pipeline.poll()
    pid = ahead.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # with texts sent and not yet taken
    pipeline.run_until_caught_up()
    assert index_digest(service.index) == index_digest(reference.index)
    assert _taken(service, "missed") > 0
    service.stop()
    reference.stop()


def test_auto_takes_a_worker_for_an_embedder_that_holds_the_lock_only() -> None:
    metrics, clock = Metrics(), ManualClock(0)

    def ahead(mode: str, embedder: Any) -> EmbedAhead | None:
        settings = load_settings(overrides={"embedder.ahead": mode}, environ={})
        return build_ahead(settings, embedder, clock, metrics)

    if len(process_cpus()) < 2:
        assert ahead("auto", HashingEmbedder()) is None  # no second CPU to embed on
        return
    said = ahead("auto", HashingEmbedder())
    assert said is not None
    assert not said.measure  # it says it holds the lock
    unsaid = ahead("auto", CountingEmbedder())
    assert unsaid is not None
    assert unsaid.measure  # measured at the first backlog
    assert ahead("auto", Releasing()) is None  # it says it does not
    assert ahead("off", HashingEmbedder()) is None
    forced = ahead("process", Releasing())
    assert forced is not None
    assert not forced.measure


class Releasing(HashingEmbedder):
    holds_gil = False


@pytest.mark.parametrize(
    ("shares", "agreed", "made"),
    [
        ([0.5, 0.1, 0.05], 0.075, 3),  # a busy host's outlier is outvoted
        ([0.1, 0.2, 0.9], 0.15, 2),  # two agree: no third measurement
        ([0.9, 0.2, 1.0], 0.95, 3),
    ],
)
def test_one_noisy_measurement_does_not_decide_the_lock(
    shares: list[float], agreed: float, made: int
) -> None:
    left = iter(shares)
    calls: list[float] = []

    def measure() -> float:
        calls.append(next(left))
        return calls[-1]

    assert agreed_share(measure) == pytest.approx(agreed)
    assert len(calls) == made


@pytest.mark.skipif(len(process_cpus()) < 2, reason="measures what a second CPU does")
def test_the_lock_is_measured_for_an_embedder_that_does_not_say() -> None:
    texts = _texts(64)
    python = EmbedAhead(CountingEmbedder(), measure=True)  # says nothing of the lock
    assert python.holds_lock(texts)
    assert python.lock_free is not None
    assert python.lock_free < LOCK_FREE
    waiting = EmbedAhead(Waiting(), measure=True)
    assert not waiting.holds_lock(texts)
    assert waiting.refused is not None
    assert "released" in waiting.refused
    assert not waiting.start()


@pytest.mark.skipif(len(process_cpus()) < 2, reason="measures what a second CPU does")
def test_auto_embeds_ahead_for_a_python_embedder_that_does_not_say(tmp_path: Path) -> None:
    lines = _stream(1200)
    emb = "streamrag.testing:CountingEmbedder"  # Python (hashing) that says nothing of the lock
    service = _service(tmp_path, "u", lines, **{"embedder.class": emb})
    pipeline = service.pipeline
    ahead = pipeline.embedding.ahead
    assert ahead is not None
    pipeline.poll()  # a backlog: measured, then started
    assert ahead.started
    assert ahead.wait_ready(READY_S)
    pipeline.run_until_caught_up()
    assert _taken(service, "ahead") > 0
    service.stop()


def test_a_worker_that_gets_ready_is_sent_the_changes_that_waited(tmp_path: Path) -> None:
    lines = _stream(600)
    service = _service(
        tmp_path,
        "w",
        lines,
        **{"embedder.class": "hashing", "embedder.ahead": "process", "source.max_read_bytes": 8192},
    )
    pipeline = service.pipeline
    ahead = pipeline.embedding.ahead
    assert ahead is not None
    pipeline.poll()  # starts the worker (eager); nothing is sent before it is ready
    assert ahead.started
    assert ahead.wait_ready(READY_S)
    waited = pipeline.batcher.pending_chunks
    assert waited > 0
    pipeline.run_until_caught_up()
    assert _taken(service, "missed") == 0  # what waited went to the worker with the next read
    assert _taken(service, "ahead") == service.status()["counts"]["chunks_embedded"]
    service.stop()


def test_a_signal_to_the_job_s_process_group_leaves_the_worker_to_its_job(started: Any) -> None:
    ahead = started()
    pid = ahead.pid
    assert pid is not None
    os.kill(pid, signal.SIGINT)  # what a Ctrl-C sends the whole group
    os.kill(pid, signal.SIGTERM)  # ... and a supervisor
    texts = _texts(20)
    ahead.submit(texts)
    assert ahead.take(texts, timeout_s=READY_S) is not None
    assert ahead.pid == pid


def test_a_live_job_with_a_worker_ends_with_the_index_a_replay_makes(tmp_path: Path) -> None:
    lines = _stream(2400)
    random.Random(5).shuffle(lines)
    live = _service(
        tmp_path, "live", lines, **{"embedder.class": "hashing", "source.max_read_bytes": 16384}
    )
    replayed = _service(tmp_path, "replayed", lines, **{"embedder.class": "hashing"})
    replayed.pipeline.run_until_caught_up()
    ahead = live.pipeline.embedding.ahead
    assert ahead is not None
    assert ahead.start()
    assert ahead.wait_ready(READY_S)  # (started by the first backlog otherwise)
    live.start()  # the reader and committer threads
    deadline = time.monotonic() + READY_S
    while not live.pipeline.caught_up and time.monotonic() < deadline:
        time.sleep(0.01)  # waits for the job to catch up, bounded
    assert live.pipeline.caught_up
    live.stop()
    assert index_digest(live.index) == index_digest(replayed.index)
    assert _taken(live, "ahead") > 0
    replayed.stop()
