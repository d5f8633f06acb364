"""Context assembly: merge adjacent chunks, drop near-duplicates, diversify, fit a budget."""

from __future__ import annotations

import pytest

from streamrag.chunking import TokenSplitter
from streamrag.errors import ConfigError
from streamrag.index.base import Hit
from streamrag.serve.context import Passage, load_reranker, merge_adjacent, select
from streamrag.serve.tokens import ApproxCounter, ServerCounter, server_root


def hit(doc: str, pos: int, text: str, score: float, *, t: int = 1_000, offset: int = 0) -> Hit:
    return Hit(
        score,
        hash((doc, pos)) & 0xFFFF,
        "acme",
        doc,
        "ops",
        pos,
        text,
        t,
        "in.jsonl",
        offset,
        7,
        "e",
    )


def test_adjacent_chunks_of_one_version_merge_and_keep_their_citation() -> None:
    text = " ".join(f"w{i}" for i in range(40))
    parts = TokenSplitter(max_tokens=16, overlap_tokens=4).split(text)
    assert len(parts) >= 3
    hits = [hit("doc", i, p, 0.5 + i / 100) for i, p in enumerate(parts)]
    hits.append(hit("doc", 0, parts[0], 0.4, t=500, offset=3))  # an older version: apart
    passages = merge_adjacent(hits)
    assert [p.text for p in passages] == [text, parts[0]]
    c = passages[0].citation
    assert c.positions == tuple(range(len(parts)))
    assert c.doc_id == "doc"
    assert c.event_time == 1_000
    assert c.version == "1000:0"
    assert c.score == max(h.score for h in hits)
    assert passages[1].citation.version == "500:3"


def test_chunks_with_a_gap_stay_apart_and_paragraphs_join_without_overlap() -> None:
    hits = [
        hit("d", 0, "first paragraph", 0.9),
        hit("d", 2, "third", 0.8),
        hit("d", 1, "second", 0.7),
    ]
    assert [p.text for p in merge_adjacent(hits)] == ["first paragraph\n\nsecond\n\nthird"]
    apart = merge_adjacent([hit("d", 0, "zero", 0.9), hit("d", 5, "five", 0.8)])
    assert [p.text for p in apart] == ["zero", "five"]


def passage(doc: str, text: str, score: float) -> Passage:
    return merge_adjacent([hit(doc, 0, text, score)])[0]


def test_near_duplicates_drop_and_mmr_prefers_new_information() -> None:
    rotate = "to rotate the database password create a new credential in the vault"
    passages = [
        passage("a", rotate, 0.90),
        passage("b", rotate.capitalize() + ".", 0.89),  # the same words: a near-duplicate
        passage("c", "rotate the database password then restart the service", 0.88),
        passage("d", "the backup runs nightly and keeps thirty days", 0.70),
    ]
    ctx = select(passages, k=4, budget=1000, counter=ApproxCounter(), mmr_lambda=0.5)
    # Diversity first: the backup passage (new information) before the second rotate one.
    assert [p.citation.doc_id for p in ctx.passages] == ["a", "d", "c"]
    assert ctx.dropped["duplicate"] == 1
    # Relevance only: the order of the scores, the duplicate still dropped.
    ranked = select(passages, k=3, budget=1000, counter=ApproxCounter(), mmr_lambda=1.0)
    assert [p.citation.doc_id for p in ranked.passages] == ["a", "c", "d"]
    assert ranked.dropped["duplicate"] == 1


def test_the_budget_is_never_exceeded_and_the_first_passage_is_cut_to_fit() -> None:
    counter = ApproxCounter()
    long = passage("long", " ".join(["word"] * 300), 0.9)
    short = passage("short", "a short passage that fits", 0.8)
    ctx = select([long, short], k=5, budget=50, counter=counter)
    assert ctx.truncated
    assert ctx.total_tokens <= 50
    assert counter.count_many([ctx.passages[0].text])[0] == ctx.tokens[0]
    assert ctx.passages[0].citation.doc_id == "long"
    assert ctx.dropped["budget"] == 1  # short no longer fits after the cut
    roomy = select([long, short], k=5, budget=1000, counter=counter)
    assert [p.citation.doc_id for p in roomy.passages] == ["long", "short"]
    assert not roomy.truncated
    assert roomy.summary()["tokens"] == roomy.total_tokens <= 1000


@pytest.mark.parametrize(
    "text",
    [
        "Rotate the MariaDB password for inventory: create the credential, then restart.",
        "def handler(event, context):\n    return {'statusCode': 200}",
        "ERROR 2024-05-01T12:00:00Z svc=billing code=E4021 retry=3/5",
        "kubectl rollout restart deployment/inventory-api -n production --context=eu-west-1",
        "SELECT id, email FROM users WHERE created_at > NOW() - INTERVAL '30 days';",
    ],
)
def test_the_approximation_is_close_to_a_real_tokenizer_for_english_and_code(
    text: str, local_llm
) -> None:  # type: ignore[no-untyped-def]
    server = ServerCounter(local_llm.base_url)
    exact = server.count_many([text])[0]
    server.close()
    estimate = ApproxCounter().count_many([text])[0]
    assert 0.9 * exact <= estimate <= 1.5 * exact


def test_server_root() -> None:
    assert server_root("https://api.deepseek.com/v1") == "https://api.deepseek.com"
    assert server_root("http://h:1") == "http://h:1"


def reverse(query: str, hits: list[Hit]) -> list[Hit]:
    """A reranker for the test: the index's order, reversed."""
    return hits[::-1]


class DropOps:
    def rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        return [h for h in hits if h.doc_id != "ops"]


def test_rerankers_are_found_by_import_path() -> None:
    hits = [hit("ops", 0, "x", 0.9), hit("hr", 0, "y", 0.5)]
    assert [
        h.doc_id for h in load_reranker("tests.serve.test_context:reverse").rerank("q", hits)
    ] == [
        "hr",
        "ops",
    ]
    assert [
        h.doc_id for h in load_reranker("tests.serve.test_context:DropOps").rerank("q", hits)
    ] == ["hr"]
    with pytest.raises(ConfigError, match="import path"):
        load_reranker("no-colon")
    with pytest.raises(ConfigError, match="cannot import"):
        load_reranker("tests.serve.test_context:missing")
