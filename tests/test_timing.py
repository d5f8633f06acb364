from __future__ import annotations

import pytest

from streamrag.timing import US_PER_S, format_timestamp, parse_timestamp


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2024-05-01T14:00:00+02:00", 1_714_564_800 * US_PER_S),
        ("2024-05-01T12:00:00.25Z", 1_714_564_800 * US_PER_S + 250_000),
        ("1969-12-31T23:59:59Z", -US_PER_S),
        (1_714_564_800, 1_714_564_800 * US_PER_S),
        (1.5, 1_500_000),
    ],
)
def test_parse_timestamp(text: object, expected: int) -> None:
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize(
    ("bad", "hint"),
    [
        ("2024-05-01T12:00:00", "no time zone"),
        ("yesterday", "not ISO-8601"),
        (True, "boolean"),
        ([1], "found list"),
        (1e308, "outside years"),
        (float("nan"), "outside years"),
        (10**30, "outside years"),
    ],
)
def test_parse_timestamp_rejects_with_a_fix(bad: object, hint: str) -> None:
    with pytest.raises(ValueError, match=hint):
        parse_timestamp(bad)


def test_format_roundtrip() -> None:
    for ts in (0, 1_714_564_800_123_456, -5 * US_PER_S):
        assert parse_timestamp(format_timestamp(ts)) == ts
