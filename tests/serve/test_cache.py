"""The semantic answer cache: hits, guards, scopes, epochs and LRU-K eviction."""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrag.changes import Op
from streamrag.index.base import CommitBatch, CommitResult, DocOp, SearchFilter
from streamrag.runtime.epochs import EpochLog
from streamrag.runtime.metrics import Metrics
from streamrag.serve.cache import CacheScope, SemanticCache, hamming, normalize, simhash64

A = CacheScope(SearchFilter(tenant="acme"), (5, "extractive"))
B = CacheScope(SearchFilter(tenant="globex"), (5, "extractive"))


def unit(seed: int, near: npt.NDArray[np.float32] | None = None, cos: float = 1.0):  # type: ignore[no-untyped-def]
    """A unit vector; with ``near``, one at cosine ``cos`` from it."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(16).astype(np.float32)
    v /= np.linalg.norm(v)
    if near is None:
        return v
    v -= (v @ near) * near
    v /= np.linalg.norm(v)
    out = cos * near + np.sqrt(1 - cos**2) * v
    return (out / np.linalg.norm(out)).astype(np.float32)


def commit(log: EpochLog, epoch: int, *docs: DocOp) -> None:
    batch = CommitBatch(
        docs=list(docs),
        chunk_ids=np.zeros(0, np.int64),
        positions=np.zeros(0, np.int32),
        texts=[],
        hashes=[],
        vectors=np.zeros((0, 16), np.float32),
    )
    log.record(batch, CommitResult(epoch, len(docs), 0, 0))


def upsert(tenant: str, doc_id: str, domain: str = "ops", t: int = 1_000) -> DocOp:
    return DocOp(tenant, doc_id, Op.UPSERT, t, 0, "in.jsonl", domain=domain)


def cache(**kw) -> tuple[SemanticCache, EpochLog, Metrics]:  # type: ignore[no-untyped-def]
    log = EpochLog()
    metrics = Metrics()
    kw.setdefault("max_hamming", 6)
    kw.setdefault("min_similarity", 0.95)
    return SemanticCache(log, metrics=metrics, **kw), log, metrics


def metric(m: Metrics, name: str) -> float:
    value = m.registry.get_sample_value(name.split("{")[0], _labels(name))
    return 0.0 if value is None else value


def _labels(name: str) -> dict[str, str]:
    if "{" not in name:
        return {}
    inner = name.split("{", 1)[1].rstrip("}")
    return dict(p.split("=") for p in inner.replace('"', "").split(","))


Q = "How do I rotate the database password?"


def test_exact_hit_on_normalized_text() -> None:
    c, _, m = cache()
    v = unit(1)
    c.put(Q, v, A, 3, [("acme", "runbook-1")], {"answer": "rotate it"})
    hit = c.lookup_exact("  how do i ROTATE the database password ", A, 3)
    assert hit is not None
    assert hit.kind == "exact"
    assert hit.value == {"answer": "rotate it"}
    assert hit.epoch == 3
    assert c.lookup_exact("how do i rotate the database passwords", A, 3) is None
    assert metric(m, 'streamrag_answer_cache_lookups_total{result="exact"}') == 1
    assert metric(m, "streamrag_answer_cache_hit_ratio") == 1.0


def test_near_duplicate_hit_needs_close_fingerprints_and_embeddings() -> None:
    c, _, m = cache()
    v = unit(1)
    c.put(Q, v, A, 3, [], "answer")
    paraphrase = "how can I rotate the database password"
    assert hamming(simhash64(normalize(Q)), simhash64(normalize(paraphrase))) <= 6
    hit = c.lookup_near(paraphrase, unit(2, v, 0.97), A, 3)
    assert hit is not None
    assert hit.kind == "near"
    assert hit.similarity == pytest.approx(0.97)
    # The same words but embeddings too far apart: the similarity guard refuses.
    assert c.lookup_near(paraphrase, unit(3, v, 0.90), A, 3) is None
    assert metric(m, 'streamrag_answer_cache_guard_rejections_total{reason="similarity"}') == 1
    # Close embeddings but different words: never a candidate.
    assert c.lookup_near("how do I rotate the kafka certificate", v, A, 3) is None
    assert metric(m, 'streamrag_answer_cache_lookups_total{result="miss"}') == 2
    assert metric(m, 'streamrag_answer_cache_lookups_total{result="near"}') == 1


@pytest.mark.parametrize(
    ("cached", "asked", "reason"),
    [
        ("is the vpn required for remote work", "is the vpn not required for work", "negation"),
        ("which services use mfa", "which services don't use mfa", "negation"),
        ("which services do not use mfa", "which services use mfa", "negation"),
        ("vacation days after 2 years", "vacation days after 5 years", "numbers"),
    ],
)
def test_a_negated_question_never_hits(cached: str, asked: str, reason: str) -> None:
    # Guards are the last line: let fingerprints and embeddings pass everything.
    c, _, m = cache(max_hamming=63, min_similarity=0.0)
    v = unit(1)
    c.put(cached, v, A, 3, [], "yes")
    assert c.lookup_near(asked, v, A, 3) is None
    assert metric(m, f'streamrag_answer_cache_guard_rejections_total{{reason="{reason}"}}') == 1
    # The same question, worded a little differently, does hit.
    assert c.lookup_near(f"please tell me {cached}", v, A, 3) is not None


def test_tenant_a_never_gets_tenant_b_answers() -> None:
    c, _, _ = cache(max_hamming=16, min_similarity=0.0)
    v = unit(1)
    c.put(Q, v, B, 3, [("globex", "secret-runbook")], "globex's answer")
    assert c.lookup_exact(Q, A, 3) is None
    assert c.lookup_near(Q, v, A, 3) is None
    assert c.lookup_exact(Q, B, 3) is not None
    # Other filters, k or generator are other scopes too.
    ops_only = CacheScope(SearchFilter(tenant="globex", domains=frozenset({"ops"})), (5, "x"))
    assert c.lookup_exact(Q, ops_only, 3) is None


def test_an_update_to_a_retrieved_document_invalidates_on_the_next_epoch() -> None:
    c, log, m = cache()
    v = unit(1)
    c.put(Q, v, A, 3, [("acme", "runbook-1"), ("acme", "faq-2")], "old answer")
    commit(log, 4, upsert("globex", "runbook-1"))  # another tenant's document of that name
    assert c.lookup_exact(Q, A, 4) is not None
    commit(log, 5, DocOp("acme", "faq-2", Op.DELETE, 2_000, 9, "in.jsonl"))
    assert c.lookup_exact(Q, A, 5) is None
    assert c.lookup_near(Q, v, A, 5) is None  # gone, not only hidden
    assert len(c) == 0
    assert metric(m, "streamrag_answer_cache_invalidations_total") == 1


def test_a_new_document_the_query_could_see_invalidates() -> None:
    c, log, _ = cache()
    in_ops = CacheScope(
        SearchFilter(tenant="acme", domains=frozenset({"ops"}), start_us=0, end_us=10_000)
    )
    c.put(Q, unit(1), in_ops, 3, [("acme", "runbook-1")], "answer")
    commit(log, 4, upsert("acme", "hr-9", domain="hr"))  # outside the domain filter
    commit(log, 5, upsert("acme", "ops-9", domain="ops", t=50_000))  # outside the time range
    assert c.lookup_exact(Q, in_ops, 5) is not None
    commit(log, 6, upsert("acme", "ops-10", domain="ops", t=5_000))  # could rank now
    assert c.lookup_exact(Q, in_ops, 6) is None


def test_as_of_answers_ignore_versions_after_their_time() -> None:
    c, log, _ = cache()
    past = CacheScope(SearchFilter(tenant="acme", as_of_us=5_000))
    c.put(Q, unit(1), past, 3, [], "as it was")
    commit(log, 4, upsert("acme", "new-doc", t=9_000))
    assert c.lookup_exact(Q, past, 4) is not None
    commit(log, 5, upsert("acme", "late-doc", t=4_000))
    assert c.lookup_exact(Q, past, 5) is None


def test_unknown_epochs_invalidate_and_pinned_epochs_never_go_stale() -> None:
    c, log, _ = cache()
    pinned = CacheScope(SearchFilter(tenant="acme", epoch=3))
    c.put(Q, unit(1), A, 3, [], "latest")
    c.put(Q, unit(1), pinned, 3, [("acme", "runbook-1")], "at epoch 3")
    commit(log, 4, upsert("acme", "runbook-1"))
    assert c.lookup_exact(Q, pinned, 4) is not None
    # Epoch 5 was never recorded (a rollback makes one): nothing can vouch for it.
    commit(log, 6, upsert("globex", "x"))
    assert c.lookup_exact(Q, A, 6) is None


def test_an_entry_checked_once_is_not_checked_again() -> None:
    c, log, _ = cache()
    c.put(Q, unit(1), A, 3, [("acme", "a")], "answer")
    commit(log, 4, upsert("acme", "b", domain="x"))
    hit = c.lookup_exact(Q, A, 3)  # an older epoch than checked: still fine
    assert hit is not None


def test_lru_k_keeps_answers_asked_again_over_one_offs() -> None:
    c, _, m = cache(max_entries=3, lru_k=2)
    for q in ("alpha question", "beta question"):
        c.put(q, None, A, 1, [], q)
        assert c.lookup_exact(q, A, 1) is not None  # a second use
    c.put("one-off gamma", None, A, 1, [], "g")
    c.put("one-off delta", None, A, 1, [], "d")  # full: evicts gamma, used once
    assert c.lookup_exact("one-off gamma", A, 1) is None
    assert c.lookup_exact("alpha question", A, 1) is not None
    assert c.lookup_exact("beta question", A, 1) is not None
    assert metric(m, "streamrag_answer_cache_evictions_total") == 1
    assert metric(m, "streamrag_answer_cache_entries") == 3

    lru, _, _ = cache(max_entries=2, lru_k=1)  # K = 1 is plain LRU
    lru.put("first", None, A, 1, [], 1)
    lru.put("second", None, A, 1, [], 2)
    lru.lookup_exact("first", A, 1)
    lru.put("third", None, A, 1, [], 3)
    assert lru.lookup_exact("second", A, 1) is None
    assert lru.lookup_exact("first", A, 1) is not None


class ReferenceLRUK:
    """Naive LRU-K: evict the entry whose K-th most recent use is oldest; entries used
    fewer than K times first, least recently used first."""

    def __init__(self, capacity: int, k: int) -> None:
        self.capacity, self.k = capacity, k
        self.uses: dict[str, deque[int]] = {}
        self.tick = 0

    def use(self, key: str) -> None:
        self.tick += 1
        self.uses[key].append(self.tick)

    def get(self, key: str) -> bool:
        if key not in self.uses:
            return False
        self.use(key)
        return True

    def put(self, key: str) -> None:
        if key in self.uses:
            del self.uses[key]
        while len(self.uses) >= self.capacity:
            victim = min(
                self.uses,
                key=lambda q: (
                    len(self.uses[q]) >= self.k,
                    self.uses[q][0] if len(self.uses[q]) >= self.k else self.uses[q][-1],
                ),
            )
            del self.uses[victim]
        self.uses[key] = deque(maxlen=self.k)
        self.use(key)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=80),
    capacity=st.integers(1, 4),
    k=st.integers(1, 3),
)
def test_lru_k_matches_a_naive_reference(
    ops: list[tuple[bool, int]], capacity: int, k: int
) -> None:
    c, _, _ = cache(max_entries=capacity, lru_k=k)
    ref = ReferenceLRUK(capacity, k)
    for is_put, n in ops:
        q = f"question number {'abcdefgh'[n]}"
        if is_put:
            c.put(q, None, A, 1, [], n)
            ref.put(q)
        else:
            assert (c.lookup_exact(q, A, 1) is not None) == ref.get(q)
    assert len(c) == len(ref.uses)
