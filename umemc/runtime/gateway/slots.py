"""Request slots: per model, max_concurrency requests in flight and a bounded FIFO queue; the fast
path (a ready model with a free slot and nobody queued: no lock, no await); drains serve the batch
queued before them. The slots own all of this (`Queue`, one per model): nothing else writes it."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from ...contract import GatewayDoc, ModelDoc, PeerDoc
from .core import Admit, SlotCalls
from .model import Model, Refused, Remote


@dataclass
class Queue:
    """A model's requests: in flight, waiting (FIFO: when each came, and the future that grants it its slot), and
    its drain (the batch queued before `drain_since` is still served; `drained` is set once it is)."""

    in_flight: int = 0
    waiters: deque[tuple[float, asyncio.Future[None]]] = field(default_factory=deque)
    last_used: float = 0.0  # wall clock of the last request finished (or of becoming ready)
    drain_since: float | None = None  # monotonic; None when not draining
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    latency_ewma: float = 1.0

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or bool(self.waiters)

    @property
    def queued(self) -> int:
        return len(self.waiters)


WAIT_GRACE_S = 0.2  # a wait shorter than this runs nothing beside it


async def _beside(main: Coroutine[Any, Any, None], side: Callable[[], Awaitable[None]]) -> None:
    """Await `main`; once it has taken WAIT_GRACE_S, run `side` beside it until it ends (side's end or failure
    does not end main; main's end, failure or cancellation ends side)."""
    task = asyncio.ensure_future(main)
    try:
        done, _ = await asyncio.wait({task}, timeout=WAIT_GRACE_S)
        if done:
            return task.result()
        beside = asyncio.ensure_future(side())
        try:
            await asyncio.shield(task)
        finally:
            beside.cancel()
            await asyncio.gather(beside, return_exceptions=True)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    task.result()


class Slot:
    """One request's hold on a slot of its model (Slots.slot): a plain object, not a generator (it is made for every
    request)."""

    __slots__ = ("slots", "m", "admit", "while_waiting", "start")

    def __init__(
        self, slots: Slots, m: Model, admit: Admit, while_waiting: Callable[[], Awaitable[None]] | None
    ) -> None:
        self.slots, self.m, self.admit, self.while_waiting = slots, m, admit, while_waiting
        self.start = 0.0

    async def __aenter__(self) -> float:
        slots, m = self.slots, self.m
        asked = time.monotonic()
        if self.while_waiting is None or (m.ready and not slots.queues[m.name].waiters):
            await slots.acquire(m, self.admit)
        else:
            await _beside(slots.acquire(m, self.admit), self.while_waiting)
        self.start = time.monotonic()
        return self.start - asked

    async def __aexit__(self, *exc: object) -> None:
        q = self.slots.queues[self.m.name]
        q.latency_ewma = 0.8 * q.latency_ewma + 0.2 * (time.monotonic() - self.start)
        self.slots.release(self.m)


class Slots:
    """Owns the routes (names and aliases) and every model's Queue."""

    def __init__(
        self,
        models: dict[str, Model],
        docs: dict[str, ModelDoc],
        gw: GatewayDoc,
        calls: SlotCalls,
        peers: dict[str, PeerDoc] | None = None,
    ):
        self.models, self.gw, self.calls = models, gw, calls
        self.peers = peers or {}  # the models the other nodes of the stack serve (peers.py)
        self.queues: dict[str, Queue] = {}
        self.routes: dict[str, str] = {}
        self.groups: dict[str, list[str]] = {}  # a shared name (models' `serves`) -> the models that share it
        self.reroute(docs)

    def reroute(self, docs: dict[str, ModelDoc]) -> None:
        """The names (and aliases, and shared names) these models answer to; a queue for each new one (a removed
        model's stays until its requests in flight are through: nothing routes to it)."""
        served = {n: m for n, m in docs.items() if m.part_of is None}  # a split model's part answers nobody
        self.routes = {n: n for n in served}
        self.groups = {}
        for n in docs:
            self.queues.setdefault(n, Queue())
        for n, m in served.items():
            self.routes.update({alias: n for alias in m.aliases})
            for shared in m.serves:
                self.groups.setdefault(shared, []).append(n)

    def route(self, name: str) -> Model:
        target = self.routes.get(name)
        if target is not None:
            return self.models[target]
        if name in self.groups:
            return self.calls.choose(self.groups[name])
        peer = lookup(self.peers, name)
        if peer is not None:  # another node serves it: the request goes to that node's gateway
            raise Remote(name, peer)
        known = ", ".join(sorted([*self.routes, *self.groups, *self.peers]))
        raise Refused(f"model {name!r} is not in this stack (known: {known})", "model_not_found")

    def __getitem__(self, name: str) -> Queue:
        return self.queues[name]

    def touch(self, m: Model) -> None:
        """It became ready: its idle time counts from now."""
        self.queues[m.name].last_used = time.time()

    def slot(
        self, m: Model, admit: Admit = Admit.QUEUE, while_waiting: Callable[[], Awaitable[None]] | None = None
    ) -> Slot:
        """Hold one of the model's max_concurrency slots while the request runs; yields the seconds it waited for
        it (a cold start included). Admit.REFUSE_NOW: a model that cannot be admitted is refused at once instead
        of queued. `while_waiting` runs beside a wait that lasts past WAIT_GRACE_S (a streamed request's progress),
        and is cancelled once the slot is granted or refused."""
        return Slot(self, m, admit, while_waiting)

    async def acquire(self, m: Model, admit: Admit = Admit.QUEUE) -> None:
        q = self.queues[m.name]
        if m.ready and not m.draining and q.in_flight < m.max_concurrency and not q.waiters:
            q.in_flight += 1
            return
        self._refuse(m, q, admit)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (time.monotonic(), fut)
        q.waiters.append(entry)
        self.calls.kick()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.gw.queue_timeout_s)
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return  # granted in the same instant
            self._forget(m, entry)
            raise self.calls.timed_out(m) from None
        except asyncio.CancelledError:
            self._forget(m, entry)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(m)  # granted just as the client went away
            raise

    def _refuse(self, m: Model, q: Queue, admit: Admit) -> None:
        """A request that cannot wait for this model: the gateway is closing, the model is unhealthy or given up,
        it cannot be admitted (asked not to queue then), or its queue is full."""
        if self.calls.closing():
            raise Refused("the gateway is shutting down", "shutting_down", 5)
        if m.unhealthy is not None:
            raise Refused(
                f"worker {m.name} is not answering ({m.unhealthy}); requests are refused until its "
                "health URL answers again",
                "worker_unhealthy",
                10,
            )
        if m.given_up:
            raise Refused(
                f"worker {m.name} was left stopped after repeated hard-limit kills "
                "(see `umemc events`); restart the stack to try again",
                "worker_given_up",
            )
        if admit is Admit.REFUSE_NOW and (refusal := self.calls.refusal_now(m)) is not None:
            raise refusal
        if len(q.waiters) >= self.gw.queue:
            raise Refused(
                f"model {m.name}: {q.in_flight} requests in flight and {len(q.waiters)} queued "
                f"(max_concurrency {m.max_concurrency}, queue {self.gw.queue})",
                "queue_full",
                self.retry_after(m),
            )

    def _forget(self, m: Model, entry: tuple[float, asyncio.Future[None]]) -> None:
        with contextlib.suppress(ValueError):
            self.queues[m.name].waiters.remove(entry)
        if not entry[1].done():
            entry[1].cancel()
        self.check_drained(m)
        self.calls.kick()

    def release(self, m: Model) -> None:
        q = self.queues[m.name]
        q.in_flight -= 1
        q.last_used = time.time()
        self.dispatch(m)
        self.check_drained(m)
        if not q.busy:
            self.calls.idle(m)

    def dispatch(self, m: Model) -> None:
        """Grant free slots to waiters, first come first served. A draining model still serves
        the requests that were queued before the drain began (they came for it), no later ones."""
        q = self.queues[m.name]
        while m.ready and q.waiters and q.in_flight < m.max_concurrency:
            queued_at, fut = q.waiters[0]
            if m.draining and q.drain_since is not None and queued_at > q.drain_since:
                return
            q.waiters.popleft()
            if fut.done():
                continue
            q.in_flight += 1
            fut.set_result(None)

    def drain(self, m: Model) -> None:
        """From now it serves the requests queued before, takes none after (the caller put it in DRAINING);
        `drained` is set once they are done."""
        q = self.queues[m.name]
        q.drain_since = time.monotonic()
        q.drained.clear()
        self.check_drained(m)

    def undrain(self, m: Model) -> None:
        """Its drain is over (it was stopped, or its eviction abandoned): it takes requests again once ready."""
        self.queues[m.name].drain_since = None
        self.dispatch(m)

    def check_drained(self, m: Model) -> None:
        q = self.queues[m.name]
        if q.drain_since is not None and q.in_flight == 0 and (not q.waiters or q.waiters[0][0] > q.drain_since):
            q.drained.set()

    async def wait_drained(self, names: list[str], timeout: float) -> bool:
        """Until these models have served their batch; False when `timeout` passes first."""
        waits = [self.queues[n].drained.wait() for n in names]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
        except TimeoutError:
            return False
        return True

    def fail_waiters(self, m: Model, exc: Refused) -> None:
        q = self.queues[m.name]
        while q.waiters:
            _, fut = q.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def retry_after(self, m: Model) -> int:
        """When a request refused for a full queue may try again: its queue served at the model's latency."""
        q = self.queues[m.name]
        return max(1, math.ceil(q.latency_ewma * (len(q.waiters) + 1) / m.max_concurrency))


def lookup(peers: dict[str, PeerDoc], name: str) -> PeerDoc | None:
    """The node serving NAME (a model's name or one of its aliases), where another node does."""
    peer = peers.get(name)
    if peer is not None:
        return peer
    return next((p for p in peers.values() if name in p.aliases), None)
