"""streamrag as users run it: a process that tails a file and answers over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamrag.testing import change_line
from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.slow


def _append(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


@pytest.fixture
def live(tmp_path: Path, start_server: Callable[..., Server]) -> tuple[Server, Path]:
    data = tmp_path / "changes.jsonl"
    _append(
        data,
        *(
            change_line(f"seed-{i}", "2024-01-01T00:00:00Z", f"seed document {i}")
            for i in range(50)
        ),
    )
    cfg = tmp_path / "streamrag.yaml"
    cfg.write_text(
        f"source:\n  path: {data}\n  poll_interval_ms: 5\nstate_dir: {tmp_path / 'state'}\n"
        "embedder:\n  class: hashing\nbatcher:\n  max_delay_ms: 20\n"
    )
    server = start_server("run", str(cfg))
    server.wait_ready()
    wait_for(lambda: server.status()["counts"]["applied"] == 50, 30, "the seed documents")
    return server, data


def _docs(server: Server, query: str, doc_id: str) -> list[str]:
    return [
        r["text"] for r in server.retrieve(query=query, k=5, filters={"doc_id": doc_id})["results"]
    ]


def _run_once_fast(tmp_path: Path, data: Path, state: Path) -> dict[str, Any]:
    """Restart the job over ``state`` with a fast embedder, ``run --once``; its final status."""
    fast = tmp_path / "fast.yaml"
    fast.write_text(
        f"source: {{path: {data}}}\nstate_dir: {state}\n"
        "embedder: {class: hashing, args: {dim: 64}}\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "streamrag", "run", str(fast), "--once"],
        cwd=root,
        capture_output=True,
        timeout=120,
        check=True,
    )
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def test_appended_changes_become_searchable(live: tuple[Server, Path]) -> None:
    server, data = live
    epoch = server.status()["epoch"]
    _append(data, change_line("new-1", "2024-02-01T00:00:00Z", "zebra migration handbook"))
    hit = wait_for(lambda: _docs(server, "zebra migration", "new-1"), 10, "the new document")
    assert hit == ["zebra migration handbook"]
    assert server.status()["epoch"] > epoch

    # An update replaces the old text; an older version arriving late changes nothing.
    _append(data, change_line("new-1", "2024-03-01T00:00:00Z", "giraffe migration handbook"))
    wait_for(
        lambda: _docs(server, "x", "new-1") == ["giraffe migration handbook"], 10, "the update"
    )
    _append(
        data,
        change_line("new-1", "2024-01-15T00:00:00Z", "stale zebra draft"),
        change_line("marker", "2024-03-02T00:00:00Z", "marker after the stale draft"),
    )
    wait_for(lambda: _docs(server, "marker", "marker"), 10, "the marker")
    assert _docs(server, "zebra", "new-1") == ["giraffe migration handbook"]

    # A delete removes the document.
    _append(data, change_line("new-1", "2024-04-01T00:00:00Z", op="delete"))
    wait_for(lambda: _docs(server, "giraffe", "new-1") == [], 10, "the delete")
    status = server.status()
    assert status["index"]["deleted_docs"] == 1
    assert status["counts"]["stale"] >= 1
    assert server.stop() == 0  # Ctrl-C shuts down cleanly


def test_malformed_lines_go_to_the_dead_letter_store(
    live: tuple[Server, Path], tmp_path: Path
) -> None:
    server, data = live
    bad = [
        "{oops",
        json.dumps({"doc_id": "x", "event_time": "2024-01-01"}),
        json.dumps({"doc_id": "y", "event_time": 1}),
    ]
    _append(data, *bad, change_line("after-bad", "2024-02-01T00:00:00Z", "still flowing"))
    wait_for(lambda: _docs(server, "still flowing", "after-bad"), 10, "the line after bad ones")
    status = server.status()
    counts = status["counts"]
    assert counts["dead_lettered"] == 3
    assert counts["ingested"] == counts["applied"] + counts["dead_lettered"] + counts["pending"]
    assert counts["ingested"] == 54
    letters = [json.loads(x) for x in Path(status["dead_letter_path"]).read_text().splitlines()]
    assert [d["raw"] for d in letters] == bad
    assert all(d["source"] == str(data) and d["stage"] == "decode" for d in letters)
    assert "not a JSON object" in letters[0]["reason"]
    assert "no time zone" in letters[1]["reason"]
    assert "non-empty 'text'" in letters[2]["reason"]
    offsets = [d["offset"] for d in letters]
    raw = data.read_bytes()
    assert [raw[o : raw.index(b"\n", o)].decode() for o in offsets] == bad
    metrics = server.http.get("/metrics").text
    assert 'streamrag_dead_letters_total{stage="decode"} 3.0' in metrics


def test_cli_query_and_status_talk_to_the_server(live: tuple[Server, Path]) -> None:
    import subprocess
    import sys

    server, _ = live
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamrag",
            "query",
            "seed document 7",
            "-k",
            "2",
            "--url",
            server.url,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    body = json.loads(out)
    assert body["results"][0]["doc_id"] == "seed-7"
    status = subprocess.run(
        [sys.executable, "-m", "streamrag", "status", "--url", server.url],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert json.loads(status)["counts"]["applied"] == 50


def test_sigterm_commits_pending_changes_and_exits_cleanly(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    import signal

    data = tmp_path / "slow.jsonl"
    _append(
        data, *(change_line(f"p-{i}", "2024-01-01T00:00:00Z", f"pending {i}") for i in range(3))
    )
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(  # a deadline far away: the changes stay pending until shutdown
        f"source: {{path: {data}}}\nstate_dir: {tmp_path / 'st'}\n"
        "embedder: {class: hashing}\nbatcher: {max_delay_ms: 600000}\n"
    )
    server = start_server("run", str(cfg))
    server.wait_ready()
    wait_for(lambda: server.status()["counts"]["pending"] == 3, 30, "three pending changes")
    assert server.status()["epoch"] == 0
    assert server.stop(signal.SIGTERM) == 0
    assert "stopped at epoch 1: 3 changes applied" in server.log.read_text()


def test_a_second_sigterm_exits_at_once_and_the_restart_loses_nothing(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    import signal

    data = tmp_path / "many.jsonl"
    _append(
        data, *(change_line(f"m-{i}", "2024-01-01T00:00:00Z", f"pending {i}") for i in range(300))
    )
    state = tmp_path / "st"
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(  # pending until shutdown, then a flush that takes about 15 s
        f"source: {{path: {data}}}\nstate_dir: {state}\nbatcher: {{max_delay_ms: 600000}}\n"
        'embedder: {class: "tests.runtime.embedders:Slow", args: {dim: 64, texts_per_s: 20}}\n'
        "stop_timeout_s: 600\n"  # this test wants the long flush, to interrupt it
    )
    server = start_server("run", str(cfg))
    server.wait_ready()
    wait_for(lambda: server.status()["counts"]["pending"] == 300, 30, "300 pending changes")
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "stopping, committing" in server.log.read_text(), 30, "the graceful stop")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(10) == 128 + signal.SIGTERM
    assert "SIGTERM again, exiting now" in server.log.read_text()

    # A restart (same vectors, a fast embedder) finds everything and applies it once.
    status = _run_once_fast(tmp_path, data, state)
    assert status["counts"]["ingested"] == 300
    assert status["counts"]["applied"] == 300
    assert status["index"]["live_docs"] == 300


def test_serves_an_empty_input_and_picks_up_a_file_created_later(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    folder = tmp_path / "inbox"
    folder.mkdir()
    server = start_server(
        "serve",
        "--set",
        f"source.path={folder}",
        "--set",
        f"state_dir={tmp_path / 'st'}",
        "--set",
        "embedder.class=hashing",
    )
    server.wait_ready()
    assert server.status()["counts"]["ingested"] == 0
    empty = server.retrieve(query="anything")
    assert (empty["epoch"], empty["results"]) == (0, [])
    _append(folder / "first.jsonl", change_line("late-file", "2024-01-01T00:00:00Z", "hello"))
    wait_for(lambda: _docs(server, "hello", "late-file"), 10, "the document in the new file")


def test_serve_says_where_it_serves_and_that_its_source_is_missing(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    missing = tmp_path / "not-there.jsonl"
    server = start_server(
        "serve",
        "--set",
        f"source.path={missing}",
        "--set",
        f"state_dir={tmp_path / 'state'}",
        "--set",
        "embedder.class=hashing",
    )
    server.wait_ready()
    log = wait_for(
        lambda: "does not exist" in server.log.read_text() and server.log.read_text(),
        10,
        "the warning",
    )
    assert f"serving http://127.0.0.1:{server.port}" in log
    assert str(missing) in log
    assert server.status()["source"] == {"path": str(missing), "exists": False}
    # Once the file appears it is read.
    _append(missing, change_line("late-file", "2024-01-01T00:00:00Z", "arrived later"))
    wait_for(lambda: _docs(server, "arrived later", "late-file"), 10, "the first document")
    assert server.status()["source"]["exists"] is True
    assert server.stop() == 0


def test_sigterm_with_a_backlog_stops_in_bounded_time_and_loses_nothing(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    import signal
    import time

    data = tmp_path / "backlog.jsonl"
    _append(
        data, *(change_line(f"b-{i}", "2024-01-01T00:00:00Z", f"backlog {i}") for i in range(2000))
    )
    state = tmp_path / "st"
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(  # 2,000 changes at 50 texts/s: 40 s of embedding
        f"source: {{path: {data}}}\nstate_dir: {state}\nstop_timeout_s: 2\n"
        "batcher: {max_batch_size: 32}\n"
        'embedder: {class: "tests.runtime.embedders:Slow", args: {dim: 64, texts_per_s: 50}}\n'
    )
    server = start_server("run", str(cfg))
    server.wait_ready()
    wait_for(lambda: server.status()["epoch"] >= 3, 60, "a few commits")
    before = server.status()["counts"]["applied"]
    stopped = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(30)
    took = time.monotonic() - stopped
    assert code == 0
    assert took < 15  # the stop deadline (2 s), one embed call and a checkpoint; not ~35 s
    log = server.log.read_text()
    assert "stopped at epoch" in log

    # The restart reads again what was not committed and applies every change once.
    status = _run_once_fast(tmp_path, data, state)
    assert status["counts"]["applied"] == 2000
    assert status["counts"]["ingested"] == 2000
    assert status["index"]["live_docs"] == 2000
    assert status["recovery"]["resumed_from_epoch"] is not None
    assert status["recovery"]["ingested_before"] >= before


def test_the_counts_add_up_at_every_moment_around_restarts(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    """ingested == applied + dead_lettered + pending in every status a client reads."""
    import signal

    data = tmp_path / "stream.jsonl"
    lines = [change_line(f"s-{i}", "2024-01-01T00:00:00Z", f"change {i}") for i in range(3000)]
    lines[100:100] = ["{broken", json.dumps({"doc_id": "no-text", "event_time": 1})]
    _append(data, *lines)
    cfg = tmp_path / "slow.yaml"
    cfg.write_text(  # slow enough that changes wait in the batcher at every commit
        f"source: {{path: {data}, max_read_bytes: 20000}}\nstate_dir: {tmp_path / 'st'}\n"
        "batcher: {max_batch_size: 64, max_delay_ms: 50}\nstop_timeout_s: 1\n"
        'embedder: {class: "tests.runtime.embedders:Slow", args: {dim: 64, texts_per_s: 2000}}\n'
    )
    samples: list[dict[str, int]] = []

    def sample(server: Server, until: Callable[[dict[str, Any]], bool], seconds: float) -> None:
        import time

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                c = server.status()["counts"]
            except Exception:  # not serving yet
                continue
            samples.append(c)
            if until(c):
                return

    for restart in ("kill", "term", "none"):
        server = start_server("run", str(cfg))
        sample(server, lambda c: c["ingested"] > 0, 60)  # from the first answer on
        sample(
            server, lambda c: c["applied"] > 1000 or (c["pending"] == 0 and c["ingested"] > 0), 30
        )
        if restart == "kill":
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
        elif restart == "term":
            assert server.stop(signal.SIGTERM) == 0
        else:
            sample(server, lambda c: c["applied"] + c["dead_lettered"] == 3002, 120)
    wrong = [
        c for c in samples if c["ingested"] != c["applied"] + c["dead_lettered"] + c["pending"]
    ]
    # Enough moments with changes in flight to mean something. How many status reads fit
    # in a run depends on the host (122 alone, 75 on a busy one): count those in flight.
    assert sum(1 for c in samples if c["pending"] > 0) >= 30
    assert wrong == [], f"{len(wrong)} of {len(samples)} samples do not add up: {wrong[:3]}"
    assert samples[-1]["applied"] == 3000
    assert samples[-1]["dead_lettered"] == 2
