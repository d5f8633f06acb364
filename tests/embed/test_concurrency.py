"""One embedder shared by the ingest thread and the query workers, used by all at once.

The real MiniLM: an ingest thread counts tokens and embeds passages while two
query threads embed batches of questions of different lengths. Every call must
succeed and give the vectors the same call gives alone. (A tokenizer shared
between counting and embedding once failed about one query in forty here.)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from streamrag.embed import build_embedder
from streamrag.embed.base import Embedder

WORDS = [
    "rotate",
    "the",
    "database",
    "password",
    "vpn",
    "client",
    "keeps",
    "disconnecting",
    "parental",
    "leave",
]


def _hammer(emb: Embedder, calls: int, seconds: float) -> tuple[list[str], int]:
    """Two query threads make ``calls`` calls each (or stop after ``seconds``) while an
    ingest thread works; returns (errors, query calls checked)."""
    rng = random.Random(5)
    questions = [
        [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 12))) for _ in range(n)]
        for n in (2, 3, 4) * 4
    ]
    want = [emb.embed_many(q) for q in questions]  # each batch alone, before the threads
    count: Callable[[str], int] | None = getattr(emb, "count_tokens", None)
    errors: list[str] = []
    checked = [0]
    stop = time.monotonic() + seconds
    done = threading.Event()

    def ingest() -> None:
        r = random.Random(1)
        while not done.is_set() and time.monotonic() < stop:
            text = " ".join(r.choice(WORDS) for _ in range(r.randrange(5, 300)))
            try:
                if count is not None:
                    for _ in range(20):
                        count(text)
                emb.embed_many([text, text[: len(text) // 2]])
            except Exception as exc:
                errors.append(f"ingest: {exc!r}")

    def query(seed: int) -> None:
        r = random.Random(seed)
        for _ in range(calls):
            if time.monotonic() > stop:
                break
            i = r.randrange(len(questions))
            try:
                got = emb.embed_many(questions[i])
            except Exception as exc:
                errors.append(f"query: {exc!r}")
                continue
            if not np.allclose(got, want[i], atol=1e-4):
                errors.append(f"query {i}: vectors differ from the same call alone")
            checked[0] += 1

    threads = [threading.Thread(target=ingest)]
    threads += [threading.Thread(target=query, args=(s,)) for s in (2, 3)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    done.set()
    threads[0].join()
    return errors, checked[0]


def test_the_hashing_embedder_is_safe_to_share() -> None:
    errors, checked = _hammer(build_embedder("hashing", {"dim": 64}), 50, 60.0)
    assert errors == []
    assert checked == 100


@pytest.mark.slow
def test_minilm_is_safe_to_share_between_ingest_and_queries() -> None:
    emb = build_embedder("minilm")
    errors, checked = _hammer(emb, 150, 60.0)
    assert errors == [], f"{len(errors)} failed calls of {checked + len(errors)}: {errors[:3]}"
    assert checked == 300
