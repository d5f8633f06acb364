"""The newest-version-wins rule against a sort: what every index and the pipeline apply."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamrag.index.versions import is_newer, newest_per_doc

changes = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.integers(0, 3)),
    max_size=30,
)


@given(changes)
def test_newest_per_doc_is_the_greatest_version_first_seen(
    rows: list[tuple[str, int, int]],
) -> None:
    keys = [("t", doc) for doc, _, _ in rows]
    times = [t for _, t, _ in rows]
    offsets = [o for _, _, o in rows]
    got = newest_per_doc(keys, times, offsets)
    # Oracle: per document, the greatest (event_time, offset); on a tie the first row.
    want: dict[tuple[str, str], int] = {}
    for key in keys:
        best = max((times[j], offsets[j], -j) for j in range(len(keys)) if keys[j] == key)
        want[key] = -best[2]
    assert got == want
    assert list(got) == list(dict.fromkeys(keys))  # documents in first-seen order


@given(st.tuples(st.integers(), st.integers()), st.tuples(st.integers(), st.integers()))
def test_is_newer_is_strictly_greater_on_event_time_then_offset(
    a: tuple[int, int], b: tuple[int, int]
) -> None:
    assert is_newer(a, None)
    assert is_newer(a, b) == (a[0] > b[0] or (a[0] == b[0] and a[1] > b[1]))
    assert not (is_newer(a, b) and is_newer(b, a))
    assert not is_newer(a, a)
