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


@pytest.mark.parametrize("text", ["", "100", "1.5 fortnights", "ms", "-1s"])
def test_parse_duration_rejects_with_the_text(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_duration(text)
    assert str(err.value) == f"not a duration: {text!r}"


def test_figures_as_people_read_them() -> None:
    from umemc.units import KiB, duration_text, gib, human

    assert [gib(None), gib(3 * GiB // 2), gib(0)] == ["-", "1.5", "0.0"]
    assert [human(1023), human(KiB), human(3 * MiB // 2), human(-2 * GiB)] == [
        "1023 B",
        "1.00 KiB",
        "1.50 MiB",
        "-2.00 GiB",
    ]
    assert [duration_text(0.1), duration_text(0.0025), duration_text(1), duration_text(90.5)] == [
        "100ms",
        "2.5ms",
        "1s",
        "90.5s",
    ]
