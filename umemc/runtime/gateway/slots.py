"""Request slots: per model, max_concurrency requests in flight and a bounded FIFO queue; the fast
path (a ready model with a free slot and nobody queued: no lock, no await); drains serve the batch
queued before them; what a request that waited too long is told."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

from ...policy import Decision
from .core import Admit, Host
from .lifecycle import Phase
from .model import Model, Refused

UNSETTLED = (Phase.STARTING, Phase.DRAINING, Phase.STOPPING)


class Slots:
    """Owns the routes (names and aliases) and every model's slots and queue."""

    def __init__(self, host: Host):
        self.host = host
        self.routes = {n: n for n in host.models}
        for n, m in host.plan.models.items():
            self.routes.update({alias: n for alias in m.aliases})

    def route(self, name: str) -> Model:
        target = self.routes.get(name)
        if target is None:
            known = ", ".join(sorted(self.routes))
            raise Refused(f"model {name!r} is not in this stack (known: {known})", "model_not_found")
        return self.host.models[target]

    @contextlib.asynccontextmanager
    async def slot(self, m: Model, admit: Admit = Admit.QUEUE) -> AsyncIterator[float]:
        """Hold one of the model's max_concurrency slots while the request runs; yields the seconds it waited for
        it (a cold start included). Admit.REFUSE_NOW: a model that cannot be admitted is refused at once instead
        of queued."""
        asked = time.monotonic()
        await self.acquire(m, admit)
        start = time.monotonic()
        if self.host.metrics is not None:
            self.host.metrics.queue_wait(m.name, start - asked)
        try:
            yield start - asked
        finally:
            m.latency_ewma = 0.8 * m.latency_ewma + 0.2 * (time.monotonic() - start)
            self.release(m)

    def _refuse_if_never(self, m: Model) -> None:
        """A model that is down and that the eviction policy cannot admit even by stopping every
        lower-priority worker: say so at once (what /umemc/can-load says) rather than queue the request
        until queue_timeout. Only when nothing is on its way in or out: a start or a stop in flight
        changes the answer. The same decision as a start (the budget and the pressure rule): what `umemc check`
        promised, the gateway keeps, and what it refuses it says at once (event `refused`)."""
        host = self.host
        if m.live or any(x.life.phase in UNSETTLED for x in host.models.values()):
            return
        need = host.need_for(m)
        decision = host.decide(need, exclude=m.name)
        if not decision.fits:
            host.events.add("refused", m.name, reason=decision.reason(need), blocked_by=decision.blocked_by)
            raise Refused(
                f"model {m.name} cannot be loaded now: {decision.reason(need)}. "
                "Send 'X-Umemc-Wait: 1' to queue until memory frees (up to the queue timeout)",
                "not_admissible",
                30,
            )

    async def acquire(self, m: Model, admit: Admit = Admit.QUEUE) -> None:
        host = self.host
        host.announce(m.name)  # the enforcer's pressure guard must know first
        if m.ready and not m.draining and m.in_flight < m.max_concurrency and not m.waiters:
            m.in_flight += 1
            return
        if host.closing:
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
        if admit is Admit.REFUSE_NOW:
            self._refuse_if_never(m)
        if len(m.waiters) >= host.gw.queue:
            raise Refused(
                f"model {m.name}: {m.in_flight} requests in flight and {len(m.waiters)} queued "
                f"(max_concurrency {m.max_concurrency}, queue {host.gw.queue})",
                "queue_full",
                self._queue_retry_after(m),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (time.monotonic(), fut)
        m.waiters.append(entry)
        host.kick()
        try:
            await asyncio.wait_for(asyncio.shield(fut), host.gw.queue_timeout_s)
        except TimeoutError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                return  # granted in the same instant
            self._forget(m, entry)
            raise self._timed_out(m) from None
        except asyncio.CancelledError:
            self._forget(m, entry)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(m)  # granted just as the client went away
            raise

    def _forget(self, m: Model, entry: tuple[float, asyncio.Future[None]]) -> None:
        with contextlib.suppress(ValueError):
            m.waiters.remove(entry)
        if not entry[1].done():
            entry[1].cancel()
        self.check_drained(m)
        self.host.kick()

    def release(self, m: Model) -> None:
        m.in_flight -= 1
        m.last_used = time.time()
        self.dispatch(m)
        self.check_drained(m)
        if not m.busy:
            for other in self.host.models.values():
                other.no_drain.discard(m.name)
            self.host.kick()  # an idle model may be what a waiting cold start needs

    def dispatch(self, m: Model) -> None:
        """Grant free slots to waiters, first come first served. A draining model still serves
        the requests that were queued before the drain began (they came for it), no later ones."""
        while m.ready and m.waiters and m.in_flight < m.max_concurrency:
            queued_at, fut = m.waiters[0]
            if m.draining and queued_at > m.drain_since:
                return
            m.waiters.popleft()
            if fut.done():
                continue
            m.in_flight += 1
            fut.set_result(None)

    def check_drained(self, m: Model) -> None:
        if m.draining and m.in_flight == 0 and (not m.waiters or m.waiters[0][0] > m.drain_since):
            m.drained.set()

    def fail_waiters(self, m: Model, exc: Refused) -> None:
        while m.waiters:
            _, fut = m.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _queue_retry_after(self, m: Model) -> int:
        return max(1, math.ceil(m.latency_ewma * (len(m.waiters) + 1) / m.max_concurrency))

    def _timed_out(self, m: Model) -> Refused:
        waited = self.host.gw.queue_timeout_s
        if m.ready:
            return Refused(
                f"model {m.name}: no slot within {waited:g} s ({m.in_flight} in flight, {len(m.waiters)} queued)",
                "queue_timeout",
                self._queue_retry_after(m),
            )
        decision = self.host.decide_model(m)
        if m.starting is not None:
            why = (
                f"waiting for {', '.join(m.draining_for)} to finish their requests"
                if m.draining_for
                else "still starting"
            )
        elif m.failure or not decision.fits:
            why = m.failure or decision.reason(self.host.need_for(m))
        else:
            why = "memory became free just now: try again"
        return Refused(
            f"model {m.name} could not start within {waited:g} s: {why}",
            "insufficient_memory",
            self._blocked_retry_after(decision),
        )

    def _blocked_retry_after(self, decision: Decision) -> int:
        expiries = [b["expires"] - time.time() for b in decision.blocked_by if b["kind"] == "lease"]
        return max(1, min([math.ceil(float(e)) for e in expiries if e > 0] + [10]))
