from __future__ import annotations

import pytest

from umemc.units import GiB, MiB, parse_duration, parse_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("512MiB", 512 * MiB),
        ("8GiB", 8 * GiB),
        ("1.5GB", 1_500_000_000),
        ("0.5GiB", GiB // 2),
        ("100", 100),
        ("64 KiB", 65536),
        ("2tib", 2 * 1024**4),
        ("107.5GiB", 115_427_246_080),
        ("1B", 1),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "1.5", "8 gigs", "-1GiB", "1.5B", "0.1KB1"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@pytest.mark.parametrize("text,expected", [("100ms", 0.1), ("30s", 30.0), ("10m", 600.0), ("1.5h", 5400.0)])
def test_parse_duration(text: str, expected: float) -> None:
    assert parse_duration(text) == expected
