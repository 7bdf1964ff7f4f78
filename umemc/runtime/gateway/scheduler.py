"""The gateway's scheduler: per-model slots (max_concurrency in flight, a bounded FIFO queue),
on-demand cold starts with admission and eviction, drains, TTL unloads, leases.

Everything runs on one event loop. A request for a ready model with a free slot and nobody queued
takes the fast path (no lock, no await). Everything else queues and wakes the pump, which makes
each decision under `lock` (shared with lease grants) and records it at once (a starting model
and the victims being evicted keep counting in the ledger until they are gone), so no two
decisions can spend the same bytes. Requests for a model that is starting all wait for that one
start: interleaved A B C A B C loads start each model once.

The parts, each owning its state: model.py (a model, its refusal), lifecycle.py (its state machine),
slots.py (routes, slots and queues), leases.py (the lease book), sync.py (polls, health, TTL,
gateway.json); this module holds the admission decisions and the starts and stops they make, and
composes the parts (each is given this scheduler as its `core.Host`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...contract import (
    PLAN_FILE,
    ContractError,
    EnforcerStatus,
    GatewayDoc,
    PlanDoc,
    read,
)
from ...policy import Budget, Decision, Held, Lease, Need, attach, decide, pressure_victim
from ..events import EventLog
from ..rundir import RunDir
from ..supervisor import STARTED, Supervisor
from .core import Admit, Evicted, Write
from .generation import GenerationBudget
from .history import Memory, Requests
from .kvslots import slot_action, slot_detail, slot_file
from .leases import LeaseBook, lease_doc, lease_json
from .lifecycle import Phase
from .model import ANSWERING, CONNECT_ERRORS, LIVE, Model, ProcState, Refused
from .slots import Slots
from .sync import StateSync

HEALTH_POLL_S = 0.1
EXITED_GRACE_S = 3.0  # supervisord restarts an exited autorestart program at once

__all__ = ["Admit", "Model", "Refused", "Scheduler", "lease_doc", "lease_json", "LIVE", "ANSWERING"]


class Scheduler:
    def __init__(self, bundle: Path):
        self.bundle = bundle
        self.plan = read(PlanDoc, bundle / PLAN_FILE)
        if self.plan.gateway is None:
            raise ContractError(f"{bundle / PLAN_FILE}: this stack has no gateway (gateway.enabled = false)")
        self.gw: GatewayDoc = self.plan.gateway
        self.run = RunDir.of_bundle(bundle)
        self.supervisor = Supervisor(self.run.socket())
        cap = self.plan.capacity
        self.generation = GenerationBudget(self.plan.policy.max_generating)
        self.budget = Budget(
            int(cap.budget_bytes),
            None if cap.gpu_budget_bytes is None else int(cap.gpu_budget_bytes),
            usable=int(cap.usable_bytes),
            load_below=self.plan.policy.load_below,
        )
        self.models = {n: Model(n, m) for n, m in self.plan.models.items()}
        self.lock = asyncio.Lock()
        self.events = EventLog(self.run.events)
        self.run_start = self.events.last_id("up")  # metrics count this run's events
        for name, event in self.events.latest(self.run_start, "cold_start").items():  # a restarted gateway's
            if name in self.models and isinstance(event.detail.get("seconds"), (int, float)):
                self.models[name].last_cold_start_s = event.detail["seconds"]
        self.slots = Slots(self)
        self.book = LeaseBook(self)
        self.sync = StateSync(self, self.book)
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.probe: Any = None  # async (model) -> healthy?, given by the app (its HTTP client)
        self.metrics: Any = None  # the app's metrics: cold starts, evictions (optional)
        self.memory = Memory()  # what the status page draws (history.py)
        self.answered = Requests()
        self.closing = False
        self._deferred: str | None = None  # the pressure victim waited for (one evict_deferred event)
        self._background: set[asyncio.Task[None]] = set()

    # -- what the parts own, as the app and the metrics read it ---------------------------------------
    @property
    def leases(self) -> dict[str, Lease]:
        return self.book.leases

    @property
    def pressure(self) -> float | None:
        return self.sync.pressure

    @property
    def enforcer(self) -> EnforcerStatus | None:
        return self.sync.enforcer

    @property
    def state_error(self) -> str | None:
        return self.sync.state_error

    def route(self, name: str) -> Model:
        return self.slots.route(name)

    def slot(self, m: Model, admit: Admit = Admit.QUEUE) -> contextlib.AbstractAsyncContextManager[float]:
        return self.slots.slot(m, admit)

    def dispatch(self, m: Model) -> None:
        self.slots.dispatch(m)

    def fail_waiters(self, m: Model, exc: Refused) -> None:
        self.slots.fail_waiters(m, exc)

    def live_leases(self) -> list[Lease]:
        return self.book.live()

    async def grant(
        self,
        holder: str,
        ram: int,
        gpu: int,
        priority: int,
        ttl: float,
        model: str | None = None,
        worker: str | None = None,
    ) -> tuple[Lease | None, Decision, Need]:
        return await self.book.grant(holder, ram, gpu, priority, ttl, model, worker)

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        return self.book.release(lease_id, why)

    def extend_lease(self, lease_id: str, ttl: float) -> Lease | None:
        return self.book.extend(lease_id, ttl)

    def announce(self, model: str) -> None:
        self.sync.announce(model)

    def write_state(self, now: float, arriving: str | None = None, how: Write = Write.BEST_EFFORT) -> bool:
        return self.sync.write_state(now, arriving, how)

    def mark_unhealthy(self, m: Model, why: str) -> None:
        self.sync.mark_unhealthy(m, why)

    def worker_lost(self, m: Model, why: str) -> None:
        self.sync.worker_lost(m, why)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        with contextlib.suppress(*CONNECT_ERRORS):
            pid = int(await asyncio.to_thread(self.supervisor.call, "supervisor.getPID"))
            self.sync.supervisord_pid = pid
        self.book.load(self.sync.supervisord_pid)
        with contextlib.suppress(*CONNECT_ERRORS):
            await self.sync.refresh()
        self._tasks = [
            asyncio.create_task(self._pump()),
            asyncio.create_task(self.sync.housekeeping()),
            asyncio.create_task(self.sync.health_watch()),
        ]

    def refuse_queued(self) -> None:
        self.closing = True
        for m in self.models.values():
            self.slots.fail_waiters(m, Refused("the gateway is shutting down", "shutting_down", 5))

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

    # -- admission ------------------------------------------------------------------------------
    def need_for(self, m: Model) -> Need:
        p = m.plan
        return Need(
            m.name, ram=p.quota_hard_bytes, gpu=p.gpu_quota_hard_bytes, priority=p.priority, cold=m.cold, drain=True
        )

    def held(self, exclude: str | None = None) -> list[Held]:
        return [m.held() for m in self.models.values() if m.live and m.name != exclude]

    def decide(self, need: Need, exclude: str | None = None) -> Decision:
        """The one policy on live figures: the budget ledger and, once the enforcer has measured it, the
        pressure rule (a start only while pressure, less what its evictions free, is below load_below)."""
        budget = self.budget
        if self.pressure is not None:
            budget = replace(budget, pressure=self.pressure)
        else:  # nothing measured yet: the ledger alone decides
            budget = replace(budget, usable=0)
        return decide(need, self.held(exclude), self.live_leases(), budget)

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
            self.slots.dispatch(m)
            if m.ready or m.starting is not None or m.evicting or not m.waiters:
                continue  # served, starting, or being stopped (it is started afresh once down)
            if m.live:  # supervisord runs it (a restart after a crash, or started outside the gateway)
                self.begin_start(m, Decision(True))
                continue
            decision = self.decide_model(m)
            if decision.fits:
                self.launch(m, decision)

    def launch(self, m: Model, decision: Decision) -> None:
        """Start an admitted model: its idle victims marked for stopping, its busy ones draining, then the start."""
        for v in decision.evict:
            self.models[v].life.to(Phase.STOPPING, f"evicted for {m.name}")
        for v in decision.drain:
            self.drain(self.models[v], f"evicted for {m.name} once its requests are done")
        self.begin_start(m, decision)

    def drain(self, m: Model, why: str) -> None:
        """It serves the requests queued before now, takes none after; `drained` is set once they are done."""
        m.life.to(Phase.DRAINING, why)
        m.drain_since = time.monotonic()
        m.drained.clear()
        self.slots.check_drained(m)

    def begin_start(self, m: Model, decision: Decision) -> None:
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
            await asyncio.gather(
                *(
                    self.stop(self.models[v], "evict", for_model=m.name, for_priority=m.plan.priority)
                    for v in decision.victims
                )
            )
            await self._ensure_started(m)
            await self._wait_healthy(m)
            if m.saved_slots:
                await self._restore_slots(m)
            m.life.to(Phase.READY)
            m.failure, m.last_used, m.evicted = None, time.time(), False
            self.sync.mark_healthy(m)
            m.cold_starts += 1
            seconds = m.last_cold_start_s = round(time.monotonic() - t0, 3)
            self.events.add("cold_start", m.name, seconds=seconds, evicted=decision.victims, waiting=len(m.waiters))
            if self.metrics is not None:
                self.metrics.cold_start(m.name, seconds)
        except Refused as exc:
            m.failure = exc.message
            self.events.add("cold_start_failed", m.name, reason=exc.message)
            self.slots.fail_waiters(m, exc)
        except CONNECT_ERRORS as exc:
            m.failure = f"supervisord did not answer: {exc}"
            self.slots.fail_waiters(m, Refused(f"model {m.name} could not start: {m.failure}", "start_failed", 5))
        finally:
            for v in decision.victims:  # a drain that timed out, a start abandoned: the victims serve on
                victim = self.models[v]
                if victim.life.phase in (Phase.DRAINING, Phase.STOPPING):
                    victim.life.to(Phase.READY, "its eviction was abandoned")
                self.slots.dispatch(victim)
            if m.life.phase is Phase.STARTING:
                m.life.to(Phase.DOWN, m.failure or "the start was abandoned")
            m.starting, m.draining_for = None, []
            self.slots.dispatch(m)
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
        while m.state is ProcState.STOPPING and time.monotonic() < deadline:
            await asyncio.sleep(HEALTH_POLL_S)
            m.state = ProcState.of((await asyncio.to_thread(self.supervisor.processes)).get(m.name))
        if m.state not in STARTED:
            # spawns now (STARTING on return), or supervisord's own restart after a crash already does
            await asyncio.to_thread(self.supervisor.ensure_started, m.name)
            m.state = ProcState.STARTING

    async def _wait_healthy(self, m: Model) -> None:
        deadline = time.monotonic() + self.gw.start_timeout_s
        exited_since: float | None = None
        while time.monotonic() < deadline:
            info = (await asyncio.to_thread(self.supervisor.processes)).get(m.name, {})
            m.state = ProcState.of(info)
            # EXITED is where a crashed worker waits for supervisord's autorestart (a moment): not a failure
            # unless it stays there
            exited_since = (exited_since or time.monotonic()) if m.state is ProcState.EXITED else None
            lingering = exited_since is not None and time.monotonic() - exited_since > EXITED_GRACE_S
            # BACKOFF after "Exited too quickly" is supervisord retrying (startretries): wait for it; another
            # spawn error (a missing command) does not heal
            retrying = "Exited too quickly" in str(info.get("spawnerr") or "")
            failed = (
                m.state in (ProcState.FATAL, ProcState.STOPPED, ProcState.UNKNOWN)
                or lingering
                or (m.state is ProcState.BACKOFF and bool(info.get("spawnerr")) and not retrying)
            )
            if failed:
                raise Refused(
                    f"worker {m.name} failed to start: it is {m.state}"
                    + (f" ({info['spawnerr']})" if info.get("spawnerr") else "")
                    + f"; see {self.run.log(m.name)}",
                    "start_failed",
                    10,
                )
            if m.state in ANSWERING and self.probe is not None and await self.probe(m):
                return
            await asyncio.sleep(HEALTH_POLL_S)
        raise Refused(
            f"worker {m.name} did not become healthy within {self.gw.start_timeout_s:g} s", "start_timeout", 10
        )

    async def stop(self, m: Model, why: str, evicted: Evicted = Evicted.RESTORE, **detail: Any) -> None:
        """Stop a worker (eviction, TTL unload). A hot worker evicted to admit another comes back when
        it fits again (Evicted.RESTORE); one evicted for pressure stays down, or it would oscillate. A
        llama-server that was serving has its slots' KV saved first (umemc.runtime.gateway.kvslots)."""
        if m.state in ANSWERING and m.plan.kv_slots and m.port is not None:  # (already marked STOPPING)
            await self._save_slots(m)
        m.life.to(Phase.STOPPING, why)
        try:
            usage = m.usage
            failed = await asyncio.to_thread(self.supervisor.try_stop, m.name, True)
            if failed is not None and failed != "not running":
                self.events.add(f"{why}_failed", m.name, by="gateway", reason=failed, **detail)
                raise Refused(f"could not stop {m.name} to make room: {failed}", "stop_failed", 5)
            m.life.to(Phase.DOWN, why)
            m.state, m.usage = ProcState.STOPPED, 0
            m.evicted = why == "evict" and evicted is Evicted.RESTORE
            self.events.add(why, m.name, by="gateway", usage_bytes=usage, priority=m.plan.priority, **detail)
            if self.metrics is not None:
                self.metrics.eviction(m.name, why)
        finally:
            if m.life.phase is Phase.STOPPING:  # the stop failed: it still runs
                m.life.to(Phase.READY, "the stop failed")
            self.kick()  # requests that arrived for it meanwhile start it again

    async def _save_slots(self, m: Model) -> None:
        assert m.port is not None
        m.saved_slots = []
        for slot in range(m.plan.kv_slots):
            name = slot_file(m.name, slot)
            try:
                doc = await asyncio.to_thread(slot_action, m.port, slot, "save", name)
            except (OSError, ValueError) as exc:
                self.events.add("slot_save_failed", m.name, slot=slot, reason=str(exc))
                continue
            if int(doc.get("n_saved", 0)) == 0:
                continue  # an empty slot: nothing to bring back
            m.saved_slots.append(slot)
            self.events.add("slot_save", m.name, slot=slot, **slot_detail(doc, "save"), file=name)

    async def _restore_slots(self, m: Model) -> None:
        assert m.port is not None
        for slot in m.saved_slots:
            name = slot_file(m.name, slot)
            try:
                doc = await asyncio.to_thread(slot_action, m.port, slot, "restore", name)
            except (OSError, ValueError) as exc:
                self.events.add("slot_restore_failed", m.name, slot=slot, reason=str(exc))
                continue
            detail = slot_detail(doc, "restore")
            if m.prompt_speed and isinstance(detail["tokens"], int) and isinstance(detail["ms"], (int, float)):
                # what reading those tokens again would have taken at its last prompt speed, less the restore
                detail["saved_s"] = round(max(0.0, detail["tokens"] / m.prompt_speed - detail["ms"] / 1000), 3)
            self.events.add("slot_restore", m.name, slot=slot, **detail, file=name)
        m.saved_slots = []

    async def relieve_pressure(self, pressure: float) -> dict[str, Any]:
        """The enforcer measured pressure above evict_above and asks: stop the worker the one
        eviction policy names (lowest priority, then least recently used). When that worker has
        requests in flight or queued, wait for them (`evict_deferred`) rather than cut them off or
        take a higher priority instead. The stop runs in the background: the enforcer never waits."""
        pol = self.plan.policy
        async with self.lock:
            running = [
                m
                for m in self.models.values()
                if m.life.phase in (Phase.READY, Phase.UNHEALTHY)
                or (m.life.phase is Phase.DOWN and m.state in ANSWERING)
            ]
            victim = pressure_victim([m.held() for m in running])
            if victim is None:
                return {"action": "none"}
            m = self.models[victim.name]
            if victim.busy:
                if self._deferred != m.name:
                    self.events.add("evict_deferred", m.name, pressure=pressure, reason="requests in flight")
                self._deferred = m.name
                return {"action": "deferred", "model": m.name}
            self._deferred = None
            m.life.to(Phase.STOPPING, "pressure")
        detail = {
            "reason": "pressure",
            "pressure": pressure,
            "evict_above": pol.evict_above,
            "load_below": pol.load_below,
        }
        task = asyncio.create_task(self.stop(m, "evict", Evicted.STAY_DOWN, **detail))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return {"action": "evicting", "model": m.name}

    def _start_now(self, m: Model) -> dict[str, Any]:
        """For a model that is down: whether a start would be admitted now, and whom it would evict."""
        if m.live:
            return {"fits_now": None, "would_evict": None}
        decision = self.decide_model(m)
        return {"fits_now": decision.fits, "would_evict": decision.victims if decision.fits else []}

    # -- what a person asks from the page or the API -----------------------------------------------
    async def start_now(self, m: Model) -> str:
        """Start a model that is down, under the same admission as a request for it (evicting what the policy
        names), without a request. Returns what was done, in words."""
        async with self.lock:
            if m.live:
                return f"{m.name} is already {m.status_word}"
            decision = self.decide_model(m)
            if not decision.fits:
                raise Refused(f"model {m.name} cannot start now: {decision.reason(self.need_for(m))}", "not_admissible")
            self.events.add("action", m.name, action="start", evicts=decision.victims)
            m.evicted = False
            self.launch(m, decision)
        return f"starting {m.name}" + (f", evicting {', '.join(decision.victims)}" if decision.victims else "")

    async def stop_now(self, m: Model, drain: bool) -> str:
        """Stop a running model at a person's request: drain first (its requests in flight and queued are served,
        none taken after), or at once (refused while it has requests). It stays down until asked for again."""
        if not m.live or m.evicting:
            return f"{m.name} is not running"
        if m.starting is not None:
            raise Refused(f"model {m.name} is starting: stop it once it is up", "busy")
        if not drain and m.busy:
            raise Refused(
                f"model {m.name} has {m.in_flight} request(s) in flight and {len(m.waiters)} queued: stop drains "
                "them first",
                "busy",
            )
        self.events.add("action", m.name, action="stop" if drain else "evict")
        if drain and m.busy:
            self.drain(m, "asked to stop")
            if not await self._drain([m.name]):
                m.life.to(Phase.READY, "its drain timed out")
                self.slots.dispatch(m)
                raise Refused(
                    f"model {m.name} still had requests after {self.gw.drain_timeout_s:g} s (gateway.drain_timeout): "
                    "not stopped",
                    "busy",
                )
        await self.stop(m, "unload", Evicted.STAY_DOWN)
        return f"stopped {m.name}"

    # -- views ----------------------------------------------------------------------------------
    def committed(self) -> tuple[int, int]:
        held, leases = attach(self.held(), self.live_leases())  # a worker's own lease counts in its allowance
        return sum(h.ram for h in held) + sum(x.ram for x in leases), sum(h.gpu for h in held) + sum(
            x.gpu for x in leases
        )

    def status(self) -> dict[str, Any]:
        ram, gpu = self.committed()
        now = time.time()
        return {
            "stack": self.plan.stack,
            "rehearsal": {"scale": self.plan.scale} if self.plan.simulate else None,
            "gateway": {"pid": os.getpid(), "host": self.gw.host, "port": self.gw.port},
            "budget": {
                "budget_bytes": self.budget.ram,
                "committed_bytes": ram,
                "free_bytes": self.budget.ram - ram,
                "gpu_budget_bytes": self.budget.gpu,
                "gpu_committed_bytes": gpu,
            },
            "pressure": self.pressure,
            "generation": self.generation.status(),
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
                    "quota_soft_bytes": m.plan.quota_soft_bytes,
                    "quota_hard_bytes": m.plan.quota_hard_bytes,
                    "restarts": m.restarts,
                    "cold_starts": m.cold_starts,
                    "idle_s": round(now - m.last_used, 1) if m.ready else None,
                    "ttl_s": m.plan.ttl_s,
                    "aliases": m.plan.aliases,
                    "failure": m.failure,
                    "given_up": m.given_up,
                    "unhealthy": m.unhealthy,
                    "kind": m.kind,
                    "status": m.status_word,
                    "tokens_in": m.tokens_in,
                    "tokens_out": m.tokens_out,
                    "tokens_per_s": m.tokens_per_s,
                    "ttl_left_s": (
                        round(max(0.0, m.plan.ttl_s - (now - m.last_used)), 1)
                        if m.plan.ttl_s is not None and m.cold and m.ready and not m.busy
                        else None
                    ),
                    "last_cold_start_s": m.last_cold_start_s,
                    **self._start_now(m),
                }
                for m in self.models.values()
            },
            "leases": [lease_json(x) for x in self.leases.values()],
        }
