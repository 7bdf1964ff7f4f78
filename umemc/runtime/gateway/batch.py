"""Items kept and handed over together: the first one kept arms a timer, and after `delay` seconds everything kept
by then goes to `drain` in one call (at once where no event loop runs, or once `most` are waiting). The gateway's
answered requests (ledger.py) and access log lines (access.py) are kept this way: done together, their work costs a
fraction of what it costs done request by request between the network's work."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batch(Generic[T]):
    def __init__(self, delay: float, drain: Callable[[list[T]], None], most: int | None = None):
        self.delay, self.drain, self.most = delay, drain, most
        self.items: list[T] = []
        self.timer: asyncio.TimerHandle | None = None

    def add(self, item: T) -> None:
        self.items.append(item)
        if self.most is not None and len(self.items) >= self.most:
            self.run()
        elif self.timer is None:
            try:
                self.timer = asyncio.get_running_loop().call_later(self.delay, self.run)
            except RuntimeError:  # no event loop (a part tested alone): at once
                self.run()

    def run(self) -> None:
        """Everything kept so far, drained now (the timer, if armed, disarmed)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        items, self.items = self.items, []
        self.drain(items)
