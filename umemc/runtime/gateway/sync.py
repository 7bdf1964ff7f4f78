"""Keeping in step with the rest of the stack: supervisord's process states and the enforcer's live
figures (polled), worker health (probed), TTL unloads and hot restores, and RUN/state/gateway.json."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

from ...contract import (
    EnforcerStatus,
    GatewayModel,
    GatewayState,
    GenerationDoc,
    dump,
    read_optional,
)
from ...records import write_atomic
from .core import Evicted, Host, Write
from .leases import LeaseBook, lease_doc
from .lifecycle import SERVING, Phase
from .model import ANSWERING, CONNECT_ERRORS, LIVE, Model, ProcState, Refused

POLL_S = 0.5  # supervisord's process list and the enforcer's status file
STATUS_FRESH_S = 5.0


class StateSync:
    """Owns what the gateway learns from the rest of the stack (supervisord's pid, the enforcer's latest
    status and pressure) and what it publishes (gateway.json: which models are busy, the leases)."""

    def __init__(self, host: Host, book: LeaseBook):
        self.host, self.book = host, book
        self.supervisord_pid: int | None = None
        self.enforcer: EnforcerStatus | None = None  # its latest fresh status file
        self.pressure: float | None = None
        self.published_busy: set[str] = set()  # models gateway.json says are busy (or about to be)
        self.state_error: str | None = None

    def mark_unhealthy(self, m: Model, why: str) -> None:
        """A ready worker that stopped answering (SIGSTOP, a deadlock): no new request goes to it; the
        queue waits for it to answer its health URL again (or for it to be restarted)."""
        if m.ready:
            m.life.to(Phase.UNHEALTHY, why)
            self.host.events.add("unhealthy", m.name, reason=why, state=m.state)
        self.host.kick()

    def worker_lost(self, m: Model, why: str) -> None:
        """A request found the worker gone between two polls: it is DOWN until supervisord restarts it."""
        if m.ready:
            m.life.to(Phase.DOWN, why)
        self.host.kick()

    def mark_healthy(self, m: Model, was: str | None = None) -> None:
        m.health_failures = 0
        if was is not None:
            self.host.events.add("recovered", m.name, was=was)

    async def health_watch(self) -> None:
        """Every health_interval: probe each ready, idle-or-busy worker (2 s timeout); two failures in a
        row mark it unhealthy."""
        while True:
            await asyncio.sleep(self.host.gw.health_interval_s)
            ready = [m for m in self.host.models.values() if m.ready and m.starting is None and not m.evicting]
            if self.host.probe is None or not ready:
                continue
            results = await asyncio.gather(*(self.host.probe(m) for m in ready))
            for m, ok in zip(ready, results, strict=True):
                if ok:
                    self.mark_healthy(m)
                    continue
                m.health_failures += 1
                if m.health_failures >= 2 and m.ready:
                    self.mark_unhealthy(m, f"its health URL did not answer {m.health_failures} times in a row")

    # -- housekeeping ---------------------------------------------------------------------------
    async def housekeeping(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.housekeeping_once()
            except CONNECT_ERRORS as exc:  # supervisord restarting or going down: next time
                print(f"umemc-gateway: {exc}", file=sys.stderr, flush=True)

    async def housekeeping_once(self) -> None:
        await self.refresh()
        now = time.time()
        status = self.enforcer
        gpu = 0 if status is None else sum(w.gpu_bytes for w in status.models.values())
        self.host.memory.record(
            now, {m.name: m.usage for m in self.host.models.values()}, gpu, self.pressure, self.host.committed()[0]
        )
        self.book.expire(now)
        await self._unload_idle(now)
        await self._restore_hot()
        self.write_state(now)

    async def refresh(self) -> None:
        """supervisord's states and the enforcer's live usage."""
        asked = time.monotonic()
        infos = await asyncio.to_thread(self.host.supervisor.processes)
        status = self._enforcer_status()
        changed = False
        probe = self.host.probe
        for m in self.host.models.values():
            info = infos.get(m.name, {})
            state = ProcState.of(info)
            if m.starting is None and not m.evicting and m.touched < asked:  # else newer than this answer
                if m.life.phase in (*SERVING, Phase.UNHEALTHY) and state not in ANSWERING:
                    m.life.to(Phase.DOWN, f"supervisord says {state}")  # crashed, killed, evicted by the enforcer
                    changed = True
                m.state = state
                if m.state in ANSWERING and not m.ready and probe is not None and await probe(m):
                    was = m.unhealthy
                    m.life.to(Phase.READY, "answers its health URL")  # started by `up`, restarted, recovered
                    m.last_used, changed = time.time(), True
                    self.mark_healthy(m, was)
            live = None if status is None else status.models.get(m.name)
            m.usage = live.rss_bytes + live.gpu_bytes if live is not None and m.live else 0
            m.given_up = live is not None and live.given_up and state not in LIVE
            m.restarts = 0 if live is None else live.restarts
        self.pressure = None if status is None else status.pressure
        self.enforcer = status
        if changed:
            self.host.kick()

    def _enforcer_status(self) -> EnforcerStatus | None:
        doc = read_optional(EnforcerStatus, self.host.run.status)
        return doc if doc is not None and time.time() - doc.time < STATUS_FRESH_S else None

    async def _unload_idle(self, now: float) -> None:
        for m in self.host.models.values():
            ttl = m.plan.ttl_s
            if (
                m.cold
                and ttl is not None
                and m.ready
                and not m.busy
                and m.starting is None
                and not m.draining
                and now - m.last_used >= ttl
            ):
                with contextlib.suppress(Refused):  # recorded as ttl_unload_failed; tried again next round
                    await self.host.stop(
                        m, "ttl_unload", Evicted.STAY_DOWN, idle_s=round(now - m.last_used, 1), ttl_s=ttl
                    )

    async def _restore_hot(self) -> None:
        """A hot worker the gateway evicted comes back once it fits without evicting anything."""
        host = self.host
        for m in host.models.values():
            if m.plan.mode != "hot" or not m.evicted or m.live or m.waiters or m.given_up:
                continue
            async with host.lock:
                decision = host.decide_model(m)
                if not decision.fits or decision.victims:
                    continue
                host.begin_start(m, decision)
            self.host.events.add("restore", m.name, reason="hot worker evicted earlier fits again")

    def announce(self, model: str) -> None:
        """A request for `model` is about to be counted: gateway.json says so first, unless it already
        says the model is busy."""
        if model not in self.published_busy:
            self.write_state(time.time(), arriving=model)

    def write_state(self, now: float, arriving: str | None = None, how: Write = Write.BEST_EFFORT) -> bool:
        """RUN/state/gateway.json: what is in flight or queued (the enforcer's pressure guard spares
        those workers; `arriving` is a request about to be counted) and the leases, for `umemc status`.
        Write.DURABLE: fsynced before it returns (a granted lease is on disk before the client hears 201).
        False when it could not be written."""
        if self.host.closing:
            return False
        models = {
            m.name: GatewayModel(
                in_flight=m.in_flight,
                queued=len(m.waiters) + (m.name == arriving),
                ready=m.ready,
                starting=m.starting is not None,
                health="unhealthy" if m.unhealthy else "ok",
                unhealthy=m.unhealthy,
                tokens_per_s=m.tokens_per_s,
            )
            for m in self.host.models.values()
        }
        doc = GatewayState(
            time=now,
            pid=os.getpid(),
            supervisord_pid=self.supervisord_pid,
            models=models,
            leases=[lease_doc(x) for x in self.book.leases.values()],
            generation=GenerationDoc(**self.host.generation.status()),
        )
        path = self.host.run.gateway_state
        try:
            write_atomic(path, dump(doc), durable=how is Write.DURABLE)
        except OSError as exc:
            # a full or read-only state dir never fails a request: the enforcer sees a stale file (its
            # pressure guard then spares no one it cannot see), `status` loses in-flight counts
            if str(exc) != self.state_error:
                print(f"umemc-gateway: cannot write {path}: {exc}", file=sys.stderr, flush=True)
            self.state_error = str(exc)
            return False
        self.state_error = None
        self.published_busy = {n for n, x in models.items() if x.in_flight or x.queued}
        return True
