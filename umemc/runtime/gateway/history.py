"""What the status page draws over time, kept by the gateway in bounded rings (never a list that grows):

- `Memory`: every STEP_S, each model's live usage (the enforcer's samples of its process tree, as the gateway
  reads them from enforcer.json), the GPU-side total, the box's used share of usable memory (pressure) and the
  budget committed; the last WINDOW_S.
- `Requests`: each answered request's latency, queue wait, tokens and speeds, the last MAX_REQUESTS within
  REQUEST_WINDOW_S, summarised per model on demand (p50/p95 latency, median queue wait, tokens/s)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any, NamedTuple

STEP_S = 2.0
WINDOW_S = 3600.0
MAX_REQUESTS = 5000
REQUEST_WINDOW_S = 600.0


class Memory:
    def __init__(self, step_s: float = STEP_S, window_s: float = WINDOW_S):
        self.step_s = step_s
        self.points: deque[tuple[float, dict[str, int], int, float | None, int]] = deque(
            maxlen=int(window_s / step_s) + 1
        )

    def record(self, now: float, usage: dict[str, int], gpu: int, pressure: float | None, committed: int) -> None:
        if self.points and now - self.points[-1][0] < self.step_s:
            return
        self.points.append((now, dict(usage), gpu, pressure, committed))

    def since(self, t0: float) -> dict[str, Any]:
        """Columns (the page draws them as they are): t, and per model its usage at each t (0 while stopped)."""
        rows = [p for p in self.points if p[0] >= t0]
        names = sorted({n for p in rows for n in p[1]})
        return {
            "step_s": self.step_s,
            "t": [round(p[0], 1) for p in rows],
            "models": {n: [p[1].get(n, 0) for p in rows] for n in names},
            "gpu_bytes": [p[2] for p in rows],
            "pressure": [None if p[3] is None else round(p[3], 4) for p in rows],
            "committed_bytes": [p[4] for p in rows],
        }


class Answered(NamedTuple):
    """One request answered (made for every request: a tuple, not a frozen dataclass, whose fields are set one by
    one through object.__setattr__)."""

    t: float
    model: str
    status: int
    latency_s: float
    queue_wait_s: float
    tokens_in: int | None
    tokens_out: int | None
    tokens_per_s: float | None  # generation
    prompt_per_s: float | None


CLIENT_LEFT = 499  # the status an answer the client did not wait for is counted under (nginx's)


class Requests:
    def __init__(self, max_requests: int = MAX_REQUESTS, window_s: float = REQUEST_WINDOW_S):
        self.window_s = window_s
        self.items: deque[Answered] = deque(maxlen=max_requests)

    def add(self, answered: Answered) -> None:
        self.items.append(answered)

    def summary(self, now: float, window_s: float | None = None) -> dict[str, dict[str, Any]]:
        """Per model over the window: requests, errors (a client that went away is none: counted apart), p50/p95
        latency, median queue wait, tokens in and out, generation tokens/s (tokens out over their generation time)
        and prompt tokens/s (where the worker says)."""
        t0 = now - (window_s or self.window_s)
        by: dict[str, list[Answered]] = {}
        for a in self.items:
            if a.t >= t0:
                by.setdefault(a.model, []).append(a)
        return {name: _summary(items) for name, items in by.items()}


def _summary(items: list[Answered]) -> dict[str, Any]:
    latencies = sorted(a.latency_s for a in items)
    generated = [a for a in items if a.tokens_out and a.tokens_per_s]
    seconds = sum((a.tokens_out or 0) / (a.tokens_per_s or 1) for a in generated)
    prompts = [a.prompt_per_s for a in items if a.prompt_per_s]
    return {
        "requests": len(items),
        "errors": sum(1 for a in items if a.status >= 400 and a.status != CLIENT_LEFT),
        "left": sum(1 for a in items if a.status == CLIENT_LEFT),  # a client that went away (a closed tab)
        "p50_latency_s": round(_quantile(latencies, 0.5), 4),
        "p95_latency_s": round(_quantile(latencies, 0.95), 4),
        "median_queue_wait_s": round(statistics.median(a.queue_wait_s for a in items), 4),
        "tokens_in": sum(a.tokens_in or 0 for a in items),
        "tokens_out": sum(a.tokens_out or 0 for a in items),
        "tokens_per_s": round(sum(a.tokens_out or 0 for a in generated) / seconds, 1) if seconds > 0 else None,
        "prompt_tokens_per_s": round(statistics.median(prompts), 1) if prompts else None,
    }


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of a sorted list (the value at ceil(q * n), 1-based)."""
    rank = max(1, math.ceil(round(q * len(ordered), 9)))
    return ordered[min(len(ordered), rank) - 1]
