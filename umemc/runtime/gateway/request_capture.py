"""The latest requests and answers, kept for debugging when the stack asks (gateway.capture = N): bodies only, each
cut at gateway.capture_bytes, at most N entries (the oldest goes first), so the gateway's memory for them is bounded
by N x 2 x capture_bytes. Never a header, so never the token. Off by default: prompts are users' data."""

from __future__ import annotations

import time
from collections import deque
from typing import Any


class Captures:
    def __init__(self, keep: int, limit: int):
        self.keep, self.limit = keep, limit
        self.entries: deque[dict[str, Any]] = deque(maxlen=max(keep, 1))

    @property
    def on(self) -> bool:
        return self.keep > 0

    def add(
        self, model: str, method: str, path: str, status: int, request: bytes, answer: bytes, answered: int = 0
    ) -> None:
        """`answer`: the answer's first bytes as kept; `answered`: how many the client got in all (a streamed answer
        is kept only as far as the limit, and its capture must still say it was cut)."""
        if not self.on:
            return
        self.entries.append(
            {
                "time": time.time(),
                "model": model,
                "method": method,
                "path": path,
                "status": status,
                **_body("request", request, self.limit),
                **_body("answer", answer, self.limit, max(answered, len(answer))),
            }
        )

    def json(self) -> dict[str, Any]:
        return {"enabled": self.on, "keep": self.keep, "bytes": self.limit, "entries": list(self.entries)}


def _body(name: str, data: bytes, limit: int, size: int | None = None) -> dict[str, Any]:
    whole = len(data) if size is None else size
    return {name: data[:limit].decode(errors="replace"), f"{name}_bytes": whole, f"{name}_cut": whole > limit}
