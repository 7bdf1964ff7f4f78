"""A memory series that spans a whole window in bounded space: one sample every window/POINTS seconds (never
more often than the enforcer's own 1 Hz bookkeeping), so a leak watch of six hours keeps 1,800 points, not
21,600, and one of five minutes keeps one a second. The leak rule and the box's trend read it."""

from __future__ import annotations

from collections import deque

POINTS = 1800


class Series:
    def __init__(self, window_s: float, points: int = POINTS, min_period_s: float = 1.0):
        self.window = float(window_s)
        self.period = max(min_period_s, self.window / points)
        self.items: deque[tuple[float, int]] = deque(maxlen=points + 2)

    def add(self, now: float, value: int) -> None:
        """Keep `value` if a period has passed since the last kept one; drop what the window no longer holds
        (one point before it stays, so a full window is spanned)."""
        if self.items and now - self.items[-1][0] < self.period:
            return
        self.items.append((now, value))
        while len(self.items) > 2 and now - self.items[1][0] >= self.window:
            self.items.popleft()

    def spans_window(self) -> bool:
        return len(self.items) >= 3 and self.items[-1][0] - self.items[0][0] >= self.window

    def points(self) -> list[tuple[float, int]]:
        return list(self.items)

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)
