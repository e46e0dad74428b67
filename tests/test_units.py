from __future__ import annotations

import pytest

from driftwatch.units import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("1.5h", 5400), ("28d", 2419200), ("2w", 1209600)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("5", "needs a unit"),
        ("0d", "positive"),
        ("-1h", "positive"),
        ("infd", "positive"),
        ("xd", "could not convert"),
    ],
)
def test_parse_duration_rejects(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_duration(text)
