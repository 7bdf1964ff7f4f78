"""gateway.capture keeps each answer's first bytes only: its record must still say how long the answer was and that
it was cut (a streamed answer is kept piece by piece, as far as the limit, and was said whole before)."""

from __future__ import annotations

from umemc.runtime.gateway.relay import Seen
from umemc.runtime.gateway.request_capture import Captures


def test_a_streamed_answer_longer_than_the_limit_is_said_cut() -> None:
    seen = Seen(head_limit=8)
    for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
        seen.keep(piece)
    captures = Captures(keep=2, limit=8)
    captures.add("m", "POST", "/v1/chat/completions", 200, b"{}", bytes(seen.head), seen.sent)
    entry = captures.json()["entries"][0]
    assert (entry["answer"], entry["answer_bytes"], entry["answer_cut"]) == ("data: 1\n", 32, True)
    assert (entry["request"], entry["request_bytes"], entry["request_cut"]) == ("{}", 2, False)


def test_a_short_answer_is_whole() -> None:
    seen = Seen(head_limit=64)
    seen.keep(b'{"ok": true}')
    captures = Captures(keep=1, limit=64)
    captures.add("m", "GET", "/v1/models", 200, b"", bytes(seen.head), seen.sent)
    entry = captures.json()["entries"][0]
    assert (entry["answer"], entry["answer_bytes"], entry["answer_cut"]) == ('{"ok": true}', 12, False)
