"""Field types shared by the stack models: sizes and durations with units."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from ..chars import CONTROL
from ..units import DURATION_HINT, SIZE_HINT, parse_duration, parse_size

MAX_SIZE = 2**60  # 1 EiB: far beyond any machine, far below 64-bit overflow
MAX_DURATION_S = 365 * 24 * 3600


def toml_string(value: str) -> str:
    """A TOML basic string holding `value` whole (what a generated stack file writes)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + CONTROL.sub(lambda m: f"\\u{ord(m.group()):04X}", escaped) + '"'


def toml_repr(value: Any) -> str:
    """A value as it was written in TOML, for `(got …)` in messages (a long string cut, so a message stays
    readable)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        quoted = toml_string(value)
        return f'{quoted[:61]}…"' if len(quoted) > 66 else quoted
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise PydanticCustomError("size", "must not be negative (got {got})", {"got": value})
        if value > MAX_SIZE:
            raise PydanticCustomError(
                "size", "too large (got {got}; at most {most} bytes)", {"got": value, "most": MAX_SIZE}
            )
        return value
    if isinstance(value, str):
        try:
            size = parse_size(value)
        except ValueError:
            raise PydanticCustomError(
                "size", "not a size (got {got})", {"got": toml_repr(value), "hint": SIZE_HINT}
            ) from None
        if size > MAX_SIZE:
            raise PydanticCustomError(
                "size", "too large (got {got}; at most {most} bytes)", {"got": toml_repr(value), "most": MAX_SIZE}
            )
        return size
    raise PydanticCustomError("size", "must be a size (got {got})", {"got": toml_repr(value), "hint": SIZE_HINT})


def _duration(value: Any) -> float:
    if isinstance(value, str):
        try:
            seconds = parse_duration(value)
        except ValueError:
            pass
        else:
            if seconds > MAX_DURATION_S:
                raise PydanticCustomError(
                    "duration", "too long (got {got}; at most 365 days)", {"got": toml_repr(value)}
                )
            return seconds
    raise PydanticCustomError(
        "duration", "not a duration (got {got})", {"got": toml_repr(value), "hint": DURATION_HINT}
    )


Size = Annotated[
    int,
    BeforeValidator(_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT]i?[bB]|[bB])?\s*$"},
            ],
            "description": 'bytes, or a string with a unit: "512MiB", "8GiB", "1.5GB"',
        }
    ),
]

Duration = Annotated[
    float,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*(ms|s|m|h)\s*$",
            "description": 'a duration with a unit: "100ms", "30s", "10m", "1h"',
        }
    ),
]


def _sysctl_value(value: Any) -> int | str:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return value
    raise PydanticCustomError("sysctl", "must be an integer or a string (got {got})", {"got": toml_repr(value)})


SysctlValue = Annotated[int | str, BeforeValidator(_sysctl_value)]
