"""The gateway's scheduler: per-model slots (max_concurrency in flight, a bounded FIFO queue),
on-demand cold starts with admission and eviction, drains, TTL unloads, leases.

Everything runs on one event loop. A request for a ready model with a free slot and nobody queued
takes the fast path (no lock, no await). Everything else queues and wakes the pump, which makes
each decision under `lock` (shared with lease grants) and records it at once (a starting model
and the victims being evicted keep counting in the ledger until they are gone), so no two
decisions can spend the same bytes. Requests for a model that is starting all wait for that one
start: interleaved A B C A B C loads start each model once."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import itertools
import math
import os
import secrets
import sys
import time
import xmlrpc.client
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...contract import (
    ContractError,
    EnforcerStatus,
    GatewayDoc,
    GatewayModel,
    GatewayState,
    LeaseDoc,
    ModelDoc,
    PlanDoc,
    dump,
    read,
    read_optional,
)
from ...policy import Budget, Decision, Held, Lease, Need, decide
from ..events import EventLog
from ..supervisor import Supervisor
from .lifecycle import SERVING as SERVING_PHASES
from .lifecycle import Lifecycle, Phase

LIVE = ("RUNNING", "STARTING", "BACKOFF", "STOPPING")
SERVING = ("RUNNING", "STARTING")  # STARTING: supervisord's startsecs have not passed, yet it may answer
POLL_S = 0.5  # supervisord's process list and the enforcer's status file
HEALTH_POLL_S = 0.1
STATUS_FRESH_S = 5.0
CONNECT_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)


class Refused(Exception):
    """A request the gateway answers itself: a code (which the HTTP layer maps to a status), an
    OpenAI-shaped message, and when to try again."""

    def __init__(self, message: str, code: str, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.code, self.retry_after = message, code, retry_after


@dataclass
class Model:
    name: str
    plan: ModelDoc
    state: str = "STOPPED"  # the process, as supervisord names it
    life: Lifecycle = field(default_factory=Lifecycle)  # what the gateway does with it (lifecycle.py)
    in_flight: int = 0
    waiters: deque[tuple[float, asyncio.Future[None]]] = field(default_factory=deque)
    last_used: float = 0.0  # wall clock of the last request finished (or of becoming ready)
    drain_since: float = 0.0  # requests queued before this are still served: one batch, then out
    starting: asyncio.Task[None] | None = None
    evicted: bool = False  # stopped by the gateway: a hot one comes back when it fits
    usage: int = 0  # live bytes from the enforcer's status
    given_up: bool = False
    failure: str | None = None
    no_drain: set[str] = field(default_factory=set)  # victims whose drain timed out: not again until idle
    draining_for: list[str] = field(default_factory=list)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    cold_starts: int = 0
    restarts: int = 0
    latency_ewma: float = 1.0
    health_failures: int = 0  # health probes failed in a row while ready

    @property
    def ready(self) -> bool:
        """Healthy and serving: READY, or DRAINING its last batch."""
        return self.life.serving

    @property
    def draining(self) -> bool:
        return self.life.phase is Phase.DRAINING

    @property
    def evicting(self) -> bool:
        return self.life.phase is Phase.STOPPING

    @property
    def unhealthy(self) -> str | None:
        return self.life.why if self.life.phase is Phase.UNHEALTHY else None

    @property
    def touched(self) -> float:
        """When the scheduler itself last moved it: older supervisord answers are older news."""
        return self.life.since

    @property
    def port(self) -> int | None:
        port: int | None = self.plan.port
        return port

    @property
    def max_concurrency(self) -> int:
        return int(self.plan.max_concurrency)

    @property
    def cold(self) -> bool:
        return bool(self.plan.mode == "cold")

    @property
    def live(self) -> bool:
        return self.state in LIVE or self.starting is not None

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or bool(self.waiters)

    def held(self) -> Held:
        return Held(
            self.name,
            self.plan.priority,
            self.cold,
            max(self.usage, self.plan.quota_hard_bytes),
            self.plan.gpu_quota_hard_bytes,
            self.busy or self.starting is not None,
            self.ready and self.starting is None,
            self.last_used,
            self.evicting or self.draining,
        )


class Scheduler:
    def __init__(self, bundle: Path):
        self.bundle = bundle
        self.plan = read(PlanDoc, bundle / "plan.json")
        if self.plan.gateway is None:
            raise ContractError(f"{bundle / 'plan.json'}: this stack has no gateway (gateway.enabled = false)")
        self.gw: GatewayDoc = self.plan.gateway
        self.state_dir = (bundle / "../state").resolve()
        self.supervisor = Supervisor(Path(self.plan.supervisor.socket.replace("%(here)s", str(bundle))))
        cap = self.plan.capacity
        self.budget = Budget(int(cap.budget_bytes), None if cap.gpu_budget_bytes is None else int(cap.gpu_budget_bytes))
        self.models = {n: Model(n, m) for n, m in self.plan.models.items()}
        self.routes = {n: n for n in self.models}
        for n, m in self.plan.models.items():
            self.routes.update({alias: n for alias in m.aliases})
        self.leases: dict[str, Lease] = {}
        self.lock = asyncio.Lock()
        self.events = EventLog(self.state_dir / "events.db")
        self.pressure: float | None = None
        self.supervisord_pid: int | None = None
        self._published_busy: set[str] = set()  # models gateway.json says are busy (or about to be)
        self._kick = asyncio.Event()
        self._seq = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self.probe: Any = None  # async (model) -> healthy?, given by the app (its HTTP client)
        self.metrics: Any = None  # the app's metrics: cold starts, evictions (optional)
        self.closing = False
        self._state_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(*CONNECT_ERRORS):
            self.supervisord_pid = int(await asyncio.to_thread(self.supervisor.call, "supervisor.getPID"))
        self._load_leases()
        with contextlib.suppress(*CONNECT_ERRORS):
            await self.refresh()
        self._tasks = [
            asyncio.create_task(self._pump()),
            asyncio.create_task(self._housekeeping()),
            asyncio.create_task(self._health_watch()),
        ]

    def refuse_queued(self) -> None:
        self.closing = True
        for m in self.models.values():
            self._fail_waiters(m, Refused("the gateway is shutting down", "shutting_down", 5))

    async def close(self) -> None:
        self.refuse_queued()
        for t in self._tasks:
            t.cancel()
        for m in self.models.values():
            if m.starting is not None:
                m.starting.cancel()
        await asyncio.gather(
            *self._tasks, *(m.starting for m in self.models.values() if m.starting), return_exceptions=True
        )
        self.events.close()

    def kick(self) -> None:
        self._kick.set()

    # -- request slots --------------------------------------------------------------------------
    def route(self, name: str) -> Model:
        target = self.routes.get(name)
        if target is None:
            known = ", ".join(sorted(self.routes))
            raise Refused(f"model {name!r} is not in this stack (known: {known})", "model_not_found")
        return self.models[target]

    @contextlib.asynccontextmanager
    async def slot(self, m: Model) -> AsyncIterator[None]:
        """Hold one of the model's max_concurrency slots while the request runs."""
        await self.acquire(m)
        start = time.monotonic()
        try:
            yield
        finally:
            m.latency_ewma = 0.8 * m.latency_ewma + 0.2 * (time.monotonic() - start)
            self.release(m)

    async def acquire(self, m: Model) -> None:
        if m.name not in self._published_busy:
            self.write_state(time.time(), arriving=m.name)  # the enforcer's pressure guard must know first
        if m.ready and not m.draining and m.in_flight < m.max_concurrency and not m.waiters:
            m.in_flight += 1
            return
        if self.closing:
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
        if len(m.waiters) >= self.gw.queue:
            raise Refused(
                f"model {m.name}: {m.in_flight} requests in flight and {len(m.waiters)} queued "
                f"(max_concurrency {m.max_concurrency}, queue {self.gw.queue})",
                "queue_full",
                self._queue_retry_after(m),
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (time.monotonic(), fut)
        m.waiters.append(entry)
        self.kick()
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.gw.queue_timeout_s)
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
        self._check_drained(m)
        self.kick()

    def release(self, m: Model) -> None:
        m.in_flight -= 1
        m.last_used = time.time()
        self._dispatch(m)
        self._check_drained(m)
        if not m.busy:
            for other in self.models.values():
                other.no_drain.discard(m.name)
            self.kick()  # an idle model may be what a waiting cold start needs

    def _dispatch(self, m: Model) -> None:
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

    def _check_drained(self, m: Model) -> None:
        if m.draining and m.in_flight == 0 and (not m.waiters or m.waiters[0][0] > m.drain_since):
            m.drained.set()

    def _fail_waiters(self, m: Model, exc: Refused) -> None:
        while m.waiters:
            _, fut = m.waiters.popleft()
            if not fut.done():
                fut.set_exception(exc)

    def _queue_retry_after(self, m: Model) -> int:
        return max(1, math.ceil(m.latency_ewma * (len(m.waiters) + 1) / m.max_concurrency))

    def _timed_out(self, m: Model) -> Refused:
        waited = self.gw.queue_timeout_s
        if m.ready:
            return Refused(
                f"model {m.name}: no slot within {waited:g} s ({m.in_flight} in flight, {len(m.waiters)} queued)",
                "queue_timeout",
                self._queue_retry_after(m),
            )
        decision = self.decide_model(m)
        if m.starting is not None:
            why = (
                f"waiting for {', '.join(m.draining_for)} to finish their requests"
                if m.draining_for
                else "still starting"
            )
        elif m.failure or not decision.fits:
            why = m.failure or decision.reason(self.need_for(m))
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

    # -- admission ------------------------------------------------------------------------------
    def need_for(self, m: Model) -> Need:
        p = m.plan
        return Need(m.name, p.quota_hard_bytes, p.gpu_quota_hard_bytes, p.priority, m.cold, True)

    def held(self, exclude: str | None = None) -> list[Held]:
        return [m.held() for m in self.models.values() if m.live and m.name != exclude]

    def live_leases(self) -> list[Lease]:
        now = time.time()
        return [lease for lease in self.leases.values() if lease.expires > now]

    def decide(self, need: Need, exclude: str | None = None) -> Decision:
        decision = decide(need, self.held(exclude), self.live_leases(), self.budget)
        pol = self.plan.policy
        if decision.fits and self.pressure is not None:
            freed = sum(self.models[v].usage for v in decision.victims) / max(1, self.plan.capacity.usable_bytes)
            if self.pressure - freed >= pol.load_below:
                decision = Decision(
                    False,
                    blocked_by=[
                        {"kind": "pressure", "pressure": round(self.pressure, 4), "load_below": pol.load_below}
                    ],
                    free_ram=decision.free_ram,
                    free_gpu=decision.free_gpu,
                )
        return decision

    def decide_model(self, m: Model) -> Decision:
        need = self.need_for(m)
        if m.live:
            return Decision(True, free_ram=0)
        decision = self.decide(need, exclude=m.name)
        if m.no_drain & set(decision.drain):
            return Decision(
                False,
                blocked_by=[
                    {
                        "kind": "worker",
                        "name": v,
                        "priority": self.models[v].plan.priority,
                        "bytes": self.models[v].held().ram,
                        "why": "requests in flight (drain timed out)",
                    }
                    for v in decision.drain
                ],
                free_ram=decision.free_ram,
                free_gpu=decision.free_gpu,
            )
        return decision

    async def _pump(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            async with self.lock:
                try:
                    self._pump_once()
                except Exception as exc:  # noqa: BLE001 - the pump must outlive a bug in one decision
                    print(f"umemc-gateway: pump: {exc!r}", file=sys.stderr, flush=True)

    def _pump_once(self) -> None:
        waiting = sorted((m for m in self.models.values() if m.waiters), key=lambda m: m.waiters[0][0])
        for m in waiting:
            self._dispatch(m)
            if m.ready or m.starting is not None or m.evicting or not m.waiters:
                continue  # served, starting, or being stopped (it is started afresh once down)
            if m.live:  # supervisord runs it (a restart after a crash, or started outside the gateway)
                self._begin_start(m, Decision(True))
                continue
            decision = self.decide_model(m)
            if decision.fits:
                for v in decision.evict:
                    self.models[v].life.to(Phase.STOPPING, f"evicted for {m.name}")
                for v in decision.drain:
                    victim = self.models[v]
                    victim.life.to(Phase.DRAINING, f"evicted for {m.name} once its requests are done")
                    victim.drain_since = time.monotonic()
                    victim.drained.clear()
                    self._check_drained(victim)
                self._begin_start(m, decision)

    def _begin_start(self, m: Model, decision: Decision) -> None:
        m.life.to(Phase.STARTING)
        m.starting = asyncio.create_task(self._start(m, decision))

    async def _start(self, m: Model, decision: Decision) -> None:
        t0 = time.monotonic()
        try:
            m.draining_for = decision.drain
            if decision.drain and not await self._drain(decision.drain):
                m.no_drain |= set(decision.drain)
                self.events.add(
                    "drain_timeout", m.name, victims=decision.drain, drain_timeout_s=self.gw.drain_timeout_s
                )
                return
            await asyncio.gather(*(self._stop(self.models[v], "evict", for_model=m.name) for v in decision.victims))
            await self._ensure_started(m)
            await self._wait_healthy(m)
            m.life.to(Phase.READY)
            m.failure, m.last_used, m.evicted = None, time.time(), False
            self.mark_healthy(m)
            m.cold_starts += 1
            seconds = round(time.monotonic() - t0, 3)
            self.events.add("cold_start", m.name, seconds=seconds, evicted=decision.victims, waiting=len(m.waiters))
            if self.metrics is not None:
                self.metrics.cold_start(m.name, seconds)
        except Refused as exc:
            m.failure = exc.message
            self.events.add("cold_start_failed", m.name, reason=exc.message)
            self._fail_waiters(m, exc)
        except CONNECT_ERRORS as exc:
            m.failure = f"supervisord did not answer: {exc}"
            self._fail_waiters(m, Refused(f"model {m.name} could not start: {m.failure}", "start_failed", 5))
        finally:
            for v in decision.victims:  # a drain that timed out, a start abandoned: the victims serve on
                victim = self.models[v]
                if victim.life.phase in (Phase.DRAINING, Phase.STOPPING):
                    victim.life.to(Phase.READY, "its eviction was abandoned")
                self._dispatch(victim)
            if m.life.phase is Phase.STARTING:
                m.life.to(Phase.DOWN, m.failure or "the start was abandoned")
            m.starting, m.draining_for = None, []
            self._dispatch(m)
            self.kick()

    async def _drain(self, names: list[str]) -> bool:
        """Wait until the victims have served their batch; False when drain_timeout passes first."""
        waits = [self.models[n].drained.wait() for n in names]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.gw.drain_timeout_s)
        except TimeoutError:
            return False
        return True

    async def _ensure_started(self, m: Model) -> None:
        """Start it unless supervisord already runs it; one being stopped is started once it is down."""
        deadline = time.monotonic() + 60
        while m.state == "STOPPING" and time.monotonic() < deadline:
            await asyncio.sleep(HEALTH_POLL_S)
            m.state = (await asyncio.to_thread(self.supervisor.processes)).get(m.name, {}).get("statename", "UNKNOWN")
        if m.state not in ("RUNNING", "STARTING", "BACKOFF"):
            await asyncio.to_thread(self.supervisor.start, m.name, False)  # spawns now: STARTING on return
            m.state = "STARTING"

    async def _wait_healthy(self, m: Model) -> None:
        deadline = time.monotonic() + self.gw.start_timeout_s
        while time.monotonic() < deadline:
            info = (await asyncio.to_thread(self.supervisor.processes)).get(m.name, {})
            m.state = info.get("statename", "UNKNOWN")
            failed = m.state in ("FATAL", "EXITED", "STOPPED", "UNKNOWN") or (
                m.state == "BACKOFF" and info.get("spawnerr")
            )
            if failed:
                raise Refused(
                    f"worker {m.name} failed to start: it is {m.state}"
                    + (f" ({info['spawnerr']})" if info.get("spawnerr") else "")
                    + f"; see {self.state_dir / 'logs' / (m.name + '.err.log')}",
                    "start_failed",
                    10,
                )
            if m.state in ("STARTING", "RUNNING") and self.probe is not None and await self.probe(m):
                return
            await asyncio.sleep(HEALTH_POLL_S)
        raise Refused(
            f"worker {m.name} did not become healthy within {self.gw.start_timeout_s:g} s", "start_timeout", 10
        )

    async def _stop(self, m: Model, why: str, **detail: Any) -> None:
        m.life.to(Phase.STOPPING, why)
        try:
            usage = m.usage
            failed = await asyncio.to_thread(self.supervisor.try_stop, m.name, True)
            if failed is not None and failed != "not running":
                self.events.add(f"{why}_failed", m.name, by="gateway", reason=failed, **detail)
                raise Refused(f"could not stop {m.name} to make room: {failed}", "stop_failed", 5)
            m.life.to(Phase.DOWN, why)
            m.state, m.usage = "STOPPED", 0
            m.evicted = why == "evict"
            self.events.add(why, m.name, by="gateway", usage_bytes=usage, priority=m.plan.priority, **detail)
            if self.metrics is not None:
                self.metrics.eviction(m.name, why)
        finally:
            if m.life.phase is Phase.STOPPING:  # the stop failed: it still runs
                m.life.to(Phase.READY, "the stop failed")
            self.kick()  # requests that arrived for it meanwhile start it again

    # -- leases ---------------------------------------------------------------------------------
    async def grant(
        self, holder: str, ram: int, gpu: int, priority: int, ttl: float, model: str | None = None
    ) -> tuple[Lease | None, Decision, Need]:
        need = Need("lease", ram, gpu, priority, False, False)
        async with self.lock:
            decision = self.decide(need)
            if not decision.fits:
                return None, decision, need
            lease = Lease(f"l-{secrets.token_hex(6)}", holder, ram, gpu, priority, time.time() + ttl, model)
            self.leases[lease.id] = lease
            for v in decision.evict:
                self.models[v].life.to(Phase.STOPPING, f"evicted for lease {lease.id}")
        self.events.add(
            "lease_grant",
            None,
            id=lease.id,
            holder=holder,
            bytes=ram,
            ttl_s=ttl,
            evicted=decision.evict,
            for_model=model,
        )
        try:
            await asyncio.gather(*(self._stop(self.models[v], "evict", for_lease=lease.id) for v in decision.evict))
        except Refused:
            self.release_lease(lease.id, "lease_release")  # its room could not be made: it never held
            raise
        return lease, decision, need

    def _load_leases(self) -> None:
        """Leases outlive a restart of the gateway (they are in RUN/state/gateway.json), not a
        restart of the stack: only those written under this same supervisord come back."""
        doc = read_optional(GatewayState, self.state_dir / "gateway.json")
        if doc is None or self.supervisord_pid is None or doc.supervisord_pid != self.supervisord_pid:
            return
        now = time.time()
        for x in doc.leases:
            if x.expires > now:
                self.leases[x.id] = Lease(x.id, x.holder, x.bytes, x.gpu_bytes, x.priority, x.expires, x.model)

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.events.add(why, None, id=lease.id, holder=lease.holder, bytes=lease.ram)
            self.kick()
        return lease

    def extend_lease(self, lease_id: str, ttl: float) -> Lease | None:
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires <= time.time():
            return None
        lease = Lease(lease.id, lease.holder, lease.ram, lease.gpu, lease.priority, time.time() + ttl, lease.model)
        self.leases[lease.id] = lease
        return lease

    # -- health -----------------------------------------------------------------------------------
    def mark_unhealthy(self, m: Model, why: str) -> None:
        """A ready worker that stopped answering (SIGSTOP, a deadlock): no new request goes to it; the
        queue waits for it to answer its health URL again (or for it to be restarted)."""
        if m.ready:
            m.life.to(Phase.UNHEALTHY, why)
            self.events.add("unhealthy", m.name, reason=why, state=m.state)
        self.kick()

    def mark_healthy(self, m: Model, was: str | None = None) -> None:
        m.health_failures = 0
        if was is not None:
            self.events.add("recovered", m.name, was=was)

    async def _health_watch(self) -> None:
        """Every health_interval: probe each ready, idle-or-busy worker (2 s timeout); two failures in a
        row mark it unhealthy."""
        while True:
            await asyncio.sleep(self.gw.health_interval_s)
            ready = [m for m in self.models.values() if m.ready and m.starting is None and not m.evicting]
            if self.probe is None or not ready:
                continue
            results = await asyncio.gather(*(self.probe(m) for m in ready))
            for m, ok in zip(ready, results, strict=True):
                if ok:
                    self.mark_healthy(m)
                    continue
                m.health_failures += 1
                if m.health_failures >= 2 and m.ready:
                    self.mark_unhealthy(m, f"its health URL did not answer {m.health_failures} times in a row")

    # -- housekeeping ---------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.housekeeping_once()
            except CONNECT_ERRORS as exc:  # supervisord restarting or going down: next time
                print(f"umemc-gateway: {exc}", file=sys.stderr, flush=True)

    async def housekeeping_once(self) -> None:
        await self.refresh()
        now = time.time()
        for lease in [x for x in self.leases.values() if x.expires <= now]:
            self.release_lease(lease.id, "lease_expire")
        await self._unload_idle(now)
        await self._restore_hot()
        self.write_state(now)

    async def refresh(self) -> None:
        """supervisord's states and the enforcer's live usage."""
        asked = time.monotonic()
        infos = await asyncio.to_thread(self.supervisor.processes)
        status = self._enforcer_status()
        changed = False
        for m in self.models.values():
            info = infos.get(m.name, {})
            state = info.get("statename", "UNKNOWN")
            if m.starting is None and not m.evicting and m.touched < asked:  # else newer than this answer
                if m.life.phase in (*SERVING_PHASES, Phase.UNHEALTHY) and state not in SERVING:
                    m.life.to(Phase.DOWN, f"supervisord says {state}")  # crashed, killed, evicted by the enforcer
                    changed = True
                m.state = state
                if m.state in SERVING and not m.ready and self.probe is not None and await self.probe(m):
                    was = m.unhealthy
                    m.life.to(Phase.READY, "answers its health URL")  # started by `up`, restarted, recovered
                    m.last_used, changed = time.time(), True
                    self.mark_healthy(m, was)
            live = None if status is None else status.models.get(m.name)
            m.usage = live.rss_bytes + live.gpu_bytes if live is not None and m.live else 0
            m.given_up = live is not None and live.given_up and state not in LIVE
            m.restarts = 0 if live is None else live.restarts
        self.pressure = None if status is None else status.pressure
        if changed:
            self.kick()

    def _enforcer_status(self) -> EnforcerStatus | None:
        doc = read_optional(EnforcerStatus, self.state_dir / "enforcer.json")
        return doc if doc is not None and time.time() - doc.time < STATUS_FRESH_S else None

    async def _unload_idle(self, now: float) -> None:
        for m in self.models.values():
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
                    await self._stop(m, "ttl_unload", idle_s=round(now - m.last_used, 1), ttl_s=ttl)

    async def _restore_hot(self) -> None:
        """A hot worker the gateway evicted comes back once it fits without evicting anything."""
        for m in self.models.values():
            if m.plan.mode != "hot" or not m.evicted or m.live or m.waiters or m.given_up:
                continue
            async with self.lock:
                decision = self.decide_model(m)
                if not decision.fits or decision.victims:
                    continue
                self._begin_start(m, decision)
            self.events.add("restore", m.name, reason="hot worker evicted earlier fits again")

    def write_state(self, now: float, arriving: str | None = None) -> None:
        """RUN/state/gateway.json: what is in flight or queued (the enforcer's pressure guard spares
        those workers; `arriving` is a request about to be counted) and the leases, for `umemc status`."""
        if self.closing:
            return
        models = {
            m.name: GatewayModel(
                in_flight=m.in_flight,
                queued=len(m.waiters) + (m.name == arriving),
                ready=m.ready,
                starting=m.starting is not None,
                health="unhealthy" if m.unhealthy else "ok",
                unhealthy=m.unhealthy,
            )
            for m in self.models.values()
        }
        doc = GatewayState(
            time=now,
            pid=os.getpid(),
            supervisord_pid=self.supervisord_pid,
            models=models,
            leases=[lease_doc(x) for x in self.leases.values()],
        )
        path = self.state_dir / "gateway.json"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(dump(doc))
            os.replace(tmp, path)
        except OSError as exc:
            # a full or read-only state dir never fails a request: the enforcer sees a stale file (its
            # pressure guard then spares no one it cannot see), `status` loses in-flight counts
            if str(exc) != self._state_error:
                print(f"umemc-gateway: cannot write {path}: {exc}", file=sys.stderr, flush=True)
            self._state_error = str(exc)
            return
        self._state_error = None
        self._published_busy = {n for n, x in models.items() if x.in_flight or x.queued}

    # -- views ----------------------------------------------------------------------------------
    def committed(self) -> tuple[int, int]:
        held, leases = self.held(), self.live_leases()
        return sum(h.ram for h in held) + sum(x.ram for x in leases), sum(h.gpu for h in held) + sum(
            x.gpu for x in leases
        )

    def status(self) -> dict[str, Any]:
        ram, gpu = self.committed()
        now = time.time()
        return {
            "gateway": {"pid": os.getpid(), "host": self.gw.host, "port": self.gw.port},
            "budget": {
                "budget_bytes": self.budget.ram,
                "committed_bytes": ram,
                "free_bytes": self.budget.ram - ram,
                "gpu_budget_bytes": self.budget.gpu,
                "gpu_committed_bytes": gpu,
            },
            "pressure": self.pressure,
            "models": {
                m.name: {
                    "state": m.state,
                    "ready": m.ready,
                    "mode": m.plan.mode,
                    "priority": m.plan.priority,
                    "in_flight": m.in_flight,
                    "queued": len(m.waiters),
                    "max_concurrency": m.max_concurrency,
                    "starting": m.starting is not None,
                    "draining": m.draining,
                    "usage_bytes": m.usage,
                    "quota_hard_bytes": m.plan.quota_hard_bytes,
                    "cold_starts": m.cold_starts,
                    "idle_s": round(now - m.last_used, 1) if m.ready else None,
                    "ttl_s": m.plan.ttl_s,
                    "aliases": m.plan.aliases,
                    "failure": m.failure,
                    "given_up": m.given_up,
                    "unhealthy": m.unhealthy,
                }
                for m in self.models.values()
            },
            "leases": [lease_json(x) for x in self.leases.values()],
        }


def lease_doc(lease: Lease) -> LeaseDoc:
    return LeaseDoc(
        id=lease.id,
        holder=lease.holder,
        bytes=lease.ram,
        gpu_bytes=lease.gpu,
        priority=lease.priority,
        model=lease.model,
        expires=round(lease.expires, 3),
        expires_in_s=round(max(0.0, lease.expires - time.time()), 1),
    )


def lease_json(lease: Lease) -> dict[str, Any]:
    return lease_doc(lease).model_dump(mode="json")
