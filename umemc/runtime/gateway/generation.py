"""The stack's generation budget (policy.max_generating): five models decoding at once share one memory bus
and each runs slower than alone, so at most N units of generation are in flight across the whole stack.
A request takes its model's generation_weight units while its worker answers; the others wait in one
queue ordered by the model's priority, then by arrival (FIFO within a priority). Unlimited when
max_generating is not set: then acquire and release cost nothing.

While the box throttles for heat (the enforcer's status says why), the budget is policy.max_generating_throttled
where the stack sets one: a hot memory bus runs every model slower. Requests already generating finish; fewer start
until it cools."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ...contract import GenerationDoc


@dataclass(order=True)
class _Waiter:
    key: tuple[int, int]  # (-priority, arrival): heapq pops the highest priority, then the oldest
    units: float = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class GenerationBudget:
    def __init__(self, capacity: int | None, throttled: int | None = None):
        self.capacity = self.normal = capacity
        self.throttled = throttled  # the capacity while the box throttles (None: no other)
        self.throttling: str | None = None  # why it throttles now, where the budget is lowered for it
        self.in_use = 0.0
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()
        self.waited_s = 0.0  # total time requests spent waiting for the budget (metrics)
        self.waits = 0

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._queue if not w.future.done())

    def _fits(self, units: float) -> bool:
        assert self.capacity is not None
        # a request heavier than the whole budget still runs, alone, rather than never
        return self.in_use + units <= self.capacity or self.in_use == 0

    def hold(self, units: float, priority: int) -> contextlib.AbstractAsyncContextManager[float]:
        """Hold `units` of the budget while the block runs; yields the seconds waited for them (an unlimited budget:
        nothing to hold, and no generator made per request)."""
        return _UNLIMITED if self.capacity is None else self._hold(units, priority)

    @contextlib.asynccontextmanager
    async def _hold(self, units: float, priority: int) -> AsyncIterator[float]:
        t0 = time.monotonic()
        if not self._queue and self._fits(units):
            self.in_use += units
        else:
            waiter = _Waiter((-priority, next(self._arrivals)), units, asyncio.get_running_loop().create_future())
            heapq.heappush(self._queue, waiter)
            try:
                await waiter.future
            except asyncio.CancelledError:
                if waiter.future.done() and not waiter.future.cancelled():
                    self._release(units)  # granted in the same instant the client went away
                raise
        waited = time.monotonic() - t0
        if waited > 0.001:
            self.waits += 1
            self.waited_s += waited
        try:
            yield waited
        finally:
            self._release(units)

    def throttle(self, why: str | None) -> bool:
        """The box throttles (`why`) or not (None): the capacity for it. True when the capacity changed."""
        if self.throttled is None:
            return False
        self.throttling = why
        capacity = self.normal if why is None else self.throttled
        if capacity == self.capacity:
            return False
        self.capacity = capacity
        self._dispatch()
        return True

    def _release(self, units: float) -> None:
        self.in_use = max(0.0, self.in_use - units)
        self._dispatch()

    def _dispatch(self) -> None:
        """Waiters that fit now, highest priority first (all of them where the budget became unlimited)."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # a client that went away while waiting
                heapq.heappop(self._queue)
                continue
            if self.capacity is not None and not self._fits(head.units):
                return
            heapq.heappop(self._queue)
            self.in_use += head.units
            head.future.set_result(None)

    def status(self) -> GenerationDoc:
        """What gateway.json and /umemc/status say of it."""
        return GenerationDoc(max=self.capacity, in_use=self.in_use, waiting=self.waiting, throttling=self.throttling)


class _Unlimited(contextlib.AbstractAsyncContextManager[float]):
    async def __aenter__(self) -> float:
        return 0.0

    async def __aexit__(self, *exc: object) -> None:
        return None


_UNLIMITED = _Unlimited()
