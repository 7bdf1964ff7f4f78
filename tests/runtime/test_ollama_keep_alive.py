"""Ollama's keep_alive as a client sends it: a number of seconds or a duration, negative for "until evicted". What
no expiry can be said for (past Ollama's own longest duration, 2^63-1 ns) is refused with a 400 for that client,
never turned into a 500 of `GET /api/ps` for everyone while the model runs."""

from __future__ import annotations

import math

import pytest

from umemc.runtime.gateway.ollama import KEEP_ALIVE_MAX_S, keep_alive_of
from umemc.runtime.gateway.relay import Refused


def test_durations_seconds_and_forever() -> None:
    assert [keep_alive_of(x) for x in (None, 0, "5m", 300, "-1", -1, "1h")] == [None, 0, 300, 300, math.inf,
                                                                               math.inf, 3600]  # fmt: skip
    assert KEEP_ALIVE_MAX_S == 9223372036  # (2**63 - 1) ns in whole seconds
    assert keep_alive_of(KEEP_ALIVE_MAX_S) == 9223372036


@pytest.mark.parametrize("raw", [1e300, 2**63, "1000000000000s", 9223372037])
def test_past_ollamas_longest_duration_is_refused(raw: object) -> None:
    with pytest.raises(Refused) as got:
        keep_alive_of(raw)
    assert (str(got.value), got.value.code) == (
        f"keep_alive must be at most 9223372036 s (Ollama's longest duration; -1 keeps the model loaded until it is "
        f"evicted; got {raw!r})",
        "invalid_json",
    )
