"""History over HTTP on a realistic stream: the change log of a git repository.

The test builds a git repository of its own — forty pages edited over ten
years, with deletes, re-creations, renames (one of them a mass rename), several
changes at the same second, and commits whose author time is weeks older than
their parent's (as a rebased branch leaves them) — and turns its history into a
change stream in commit order: event time = author time, so the stream is
naturally late. streamrag ingests it as a server, and then ``as_of`` at the
midpoint of every version interval, asked over HTTP, must return exactly that
version's text (or nothing, between a delete and the next version).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, wait_for

pytestmark = pytest.mark.slow

YEAR_S = 365 * 86_400
T0 = 1_420_070_400  # 2015-01-01T00:00:00Z
WORDS = [
    *("install", "configure", "restart", "rotate", "backup", "restore", "deploy"),
    *("rollback", "monitor", "alert", "disk", "memory", "network", "cache", "queue"),
    *("index", "replica", "shard", "token", "secret", "certificate"),
]


@dataclass(frozen=True)
class Event:
    doc_id: str
    op: str
    time_s: int
    text: str | None
    offset: int = 0


def _git(repo: Path, *args: str, when: int | None = None) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null")
    if when is not None:
        env["GIT_AUTHOR_DATE"] = f"@{when} +0000"
        env["GIT_COMMITTER_DATE"] = f"@{when} +0000"
    out = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def _page(rng: random.Random, title: str) -> str:
    lines = [f"# {title}", ""]
    for _ in range(rng.randrange(2, 7)):
        lines.append("- " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 12))))
    return "\n".join(lines) + "\n"


def _build_repo(repo: Path, seed: int = 7) -> None:
    """Commits over ten years: edits, deletes, re-creations, renames, back-dated commits."""
    rng = random.Random(seed)
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "pages").mkdir()
    alive: list[str] = []
    gone: list[str] = []
    now = T0
    for n in range(420):
        now += rng.randrange(1, 2 * 86_400) * (n % 3 != 0)  # every third commit: same second
        when = now
        if rng.random() < 0.12:
            when = now - rng.randrange(86_400, 40 * 86_400)  # a rebased commit: older author time
        roll = rng.random()
        if n == 250:  # a mass rename: a folder of pages moves at once
            moved = [p for p in alive if p.startswith("pages/a")]
            (repo / "pages" / "archive").mkdir(exist_ok=True)
            for p in moved:
                new = p.replace("pages/", "pages/archive/")
                _git(repo, "mv", p, new)
                alive[alive.index(p)] = new
        elif not alive or roll < 0.15 or len(alive) < 12:
            if gone and rng.random() < 0.4:
                name = gone.pop(rng.randrange(len(gone)))  # re-created under its old name
            else:
                name = f"pages/{rng.choice('abcdefgh')}{n}.md"
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(_page(rng, name))
            alive.append(name)
        elif roll < 0.22 and len(alive) > 12:
            name = alive.pop(rng.randrange(len(alive)))
            _git(repo, "rm", "-q", name)
            gone.append(name)
        elif roll < 0.27:
            old = alive.pop(rng.randrange(len(alive)))
            new = f"pages/{rng.choice('abcdefgh')}{n}-moved.md"
            _git(repo, "mv", old, new)
            alive.append(new)
        else:
            for name in rng.sample(alive, min(len(alive), rng.randrange(1, 4))):
                text = (repo / name).read_text().splitlines()
                text[rng.randrange(2, len(text))] = "- " + " ".join(
                    rng.choice(WORDS) for _ in range(rng.randrange(4, 12))
                )
                (repo / name).write_text("\n".join(text) + "\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", f"change {n}", when=when)


def _stream(repo: Path) -> list[Event]:
    """The history as changes, in commit order; a rename is a delete and an upsert."""
    log = _git(repo, "log", "--reverse", "--format=@%H %at", "--name-status", "-M")
    events: list[Event] = []
    commit, when = "", 0
    for line in log.splitlines():
        if line.startswith("@"):
            commit, at = line[1:].split()
            when = int(at)
            continue
        if not line.strip():
            continue
        status, *paths = line.split("\t")
        if status.startswith("R"):
            events.append(Event(paths[0], "delete", when, None))
            paths = paths[1:]
        if status == "D":
            events.append(Event(paths[0], "delete", when, None))
        else:
            text = _git(repo, "show", f"{commit}:{paths[-1]}")
            events.append(Event(paths[-1], "upsert", when, text))
    return events


def _write(path: Path, events: list[Event]) -> list[Event]:
    """Write the stream as JSONL; returns the events with their byte offsets."""
    out, at = [], 0
    with path.open("wb") as fh:
        for e in events:
            rec = {"doc_id": e.doc_id, "op": e.op, "event_time": e.time_s}
            if e.text is not None:
                rec["text"] = e.text
            raw = (json.dumps(rec) + "\n").encode()
            fh.write(raw)
            out.append(Event(e.doc_id, e.op, e.time_s, e.text, at))
            at += len(raw)
    return out


def _intervals(events: list[Event]) -> list[tuple[Event, float]]:
    """Every version with the midpoint of its interval (versions with an empty one left out)."""
    by_doc: dict[str, list[Event]] = {}
    for e in events:
        by_doc.setdefault(e.doc_id, []).append(e)
    out = []
    for versions in by_doc.values():
        versions.sort(key=lambda e: (e.time_s, e.offset))
        for i, e in enumerate(versions):
            end = versions[i + 1].time_s if i + 1 < len(versions) else e.time_s + 2 * YEAR_S
            if end > e.time_s:
                out.append((e, (e.time_s + end) / 2))
    return out


def test_as_of_every_version_midpoint_over_http(
    tmp_path: Path, start_server: Callable[..., Server]
) -> None:
    repo = tmp_path / "repo"
    _build_repo(repo)
    events = _write(tmp_path / "changes.jsonl", _stream(repo))
    late = sum(1 for a, b in itertools.pairwise(events) if b.time_s < a.time_s)
    assert late > 20  # the stream really arrives out of event-time order
    cfg = tmp_path / "streamrag.yaml"
    cfg.write_text(
        f"source:\n  path: {tmp_path / 'changes.jsonl'}\n  poll_interval_ms: 5\n"
        f"state_dir: {tmp_path / 'state'}\n"
        "embedder:\n  class: hashing\n"
        "batcher:\n  max_batch_size: 64\n"
        "index:\n  retention_s: 630720000\n  seal_rows: 512\n"
    )
    server = start_server("run", str(cfg))
    server.wait_ready()
    wait_for(
        lambda: (
            server.status()["counts"]["applied"] == len(events)
            and server.status()["ingest_lag"]["caught_up"]
        ),
        120,
        "the whole history",
    )
    status = server.status()
    assert status["counts"]["past_versions"] > 0  # late versions were filed in the past

    wrong = []
    intervals = _intervals(events)
    assert len(intervals) > 500
    for version, mid in intervals:
        body = server.retrieve(
            query=version.doc_id, k=50, filters={"doc_id": version.doc_id}, as_of=mid
        )
        hits = body["results"]
        if version.op == "delete":
            if hits:
                wrong.append((version, mid, "exists"))
            continue
        got = {(h["offset"], h["event_time"]) for h in hits}
        texts = [h["text"] for h in sorted(hits, key=lambda h: h["position"])]
        if {o for o, _ in got} != {version.offset} or not texts:
            wrong.append((version, mid, sorted(got)))
        elif not all(t.strip() in version.text for t in texts):
            wrong.append((version, mid, "text"))
    assert wrong == [], f"{len(wrong)} of {len(intervals)} version midpoints answered wrongly"
    # Before a document's first version it does not exist.
    first = min(events, key=lambda e: e.time_s)
    before = server.retrieve(
        query="x", k=5, filters={"doc_id": first.doc_id}, as_of=first.time_s - 1
    )
    assert before["results"] == []
    assert server.stop() == 0
