"""Sizes and durations as a person writes them in a stack file, and back."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from fractions import Fraction

KiB = 1024
MiB = 1024**2
GiB = 1024**3

# Binary units are powers of 1024, decimal ones powers of 1000, as in IEC 80000-13.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

_DURATION_UNITS = {"ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60), "h": Decimal(3600)}
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)\s*$")

SIZE_HINT = 'write bytes as an integer or a string with a unit: "512MiB", "8GiB", "1.5GB"'
DURATION_HINT = 'write a number with a unit: "100ms", "30s", "10m", "1h"'


def parse_size(text: str) -> int:
    """'8GiB' -> 8589934592. Raises ValueError with a message fit for a person."""
    match = _SIZE_RE.fullmatch(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    value = Fraction(match.group(1)) * _SIZE_UNITS[unit]  # exact, however many digits
    if value.denominator != 1:
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def parse_duration(text: str) -> float:
    """'100ms' -> 0.1 (seconds)."""
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r}")
    return float(Decimal(match.group(1)) * _DURATION_UNITS[match.group(2)])


def mul_ceil(n: int, factor: float) -> int:
    """n × factor rounded up, in exact decimal arithmetic (no float drift on large byte counts)."""
    return int((Decimal(n) * Decimal(repr(factor))).to_integral_value(ROUND_CEILING))


def mul_floor(n: int, factor: float) -> int:
    return int((Decimal(n) * Decimal(repr(factor))).to_integral_value(ROUND_FLOOR))


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def unit_for(*figures: int | None) -> tuple[str, int]:
    """The unit a table of these figures reads in: GiB where the largest is at least 1 GiB, else MiB (a small
    model's figures would all read 0.0 to 0.2 GiB)."""
    largest = max((abs(f) for f in figures if f is not None), default=0)
    return ("GiB", GiB) if largest >= GiB else ("MiB", MiB)


def in_unit(n: int | None, size: int) -> str:
    """Bytes in the table's unit (unit_for), one decimal."""
    return "-" if n is None else f"{n / size:.1f}"


def gib(n: int | None) -> str:
    """Bytes as GiB with one decimal, the unit every report uses."""
    if n is None:
        return "-"
    return f"{n / GiB:.1f}"


def with_gib(n: int) -> str:
    """Exact bytes for scripts, GiB for people: '4160749568 bytes (3.88 GiB)'."""
    return f"{n} bytes ({n / GiB:.2f} GiB)"


def human(n: int) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1 (for explanations)."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"
