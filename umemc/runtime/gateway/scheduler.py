"""The gateway's scheduler: the admission decisions (cold starts, leases, pressure, a person's start and stop); the
starts and stops they decide are made by process.py, and the parts it composes own the rest.

Everything runs on one event loop. A request for a ready model with a free slot and nobody queued
takes the fast path (slots.py: no lock, no await). Everything else queues and wakes the pump, which makes
each decision under `lock` (shared with lease grants) and records it at once (a starting model
and the victims being evicted keep counting in the ledger until they are gone), so no two
decisions can spend the same bytes. Requests for a model that is starting all wait for that one
start: interleaved A B C A B C loads start each model once.

The parts, each the one owner of its state: model.py (a model: its plan, lifecycle and the stack's view of it),
slots.py (routes, slots, queues, drains), lease_book.py (the lease book, a ledger), sync.py (supervisord's and the
enforcer's view, health, gateway.json), traffic.py (tokens, the HTTP side's), housekeeping.py (the half-second
round: idle unloads, fragmented restarts, hot restores, expiries), process.py (a model's start, its stage in words, its
stop, a client's keep_alive). The slots ask the scheduler about
admission through core.Admission; the other parts are given what they use and a `kick`."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...budget.policy import Budget, Decision, Held, Lease, Need, attach, decide, pressure_victim
from ...contract import ContractError, GatewayDoc, GatewayState, ModelDoc, PlanDoc, read_optional, read_plan
from ...names import PLAN_FILE
from ..events import EventLog
from ..rundir import RunDir
from ..supervisor import Supervisor
from . import page_figures
from .core import Admit, Evicted, Write
from .generation import GenerationBudget
from .history import Memory, Requests
from .housekeeping import Housekeeping
from .lease_book import LeaseBook
from .ledger import Ledger
from .lifecycle import Lifecycle, Phase
from .model import ANSWERING, CONNECT_ERRORS, Model, Refused
from .process import Process
from .slots import Slots
from .sync import StateSync
from .traffic import Traffic

# What bringing back a model never started on demand is taken to cost: its size read at this rate (a page-cached
# or NVMe read is faster, a cold disk slower); a measured start (the event log's cold_start) replaces it.
ASSUMED_LOAD_BYTES_PER_S = 1 << 30
__all__ = ["Admit", "Model", "Refused", "Scheduler"]


class Scheduler:
    def __init__(self, plan: PlanDoc, run: RunDir, supervisor: Supervisor, events: EventLog):
        if plan.gateway is None:
            raise ContractError(f"{run.plan}: this stack has no gateway (gateway.enabled = false)")
        self.plan, self.run, self.supervisor, self.events = plan, run, supervisor, events
        self.gw: GatewayDoc = plan.gateway
        cap = plan.capacity
        self.budget = Budget(
            int(cap.budget_bytes),
            None if cap.gpu_budget_bytes is None else int(cap.gpu_budget_bytes),
            usable=int(cap.usable_bytes),
            load_below=plan.policy.load_below,
        )
        self.generation = GenerationBudget(plan.policy.max_generating, plan.policy.max_generating_throttled)
        self.models = {n: self._model(n, m) for n, m in plan.models.items()}
        self.traffic = {n: Traffic() for n in plan.models}
        self.lock = asyncio.Lock()
        self.run_start = events.last_id("up")  # metrics count this run's events
        self.slots = Slots(self.models, plan.models, self.gw, self, plan.peers)
        self.book = LeaseBook()
        self.sync = StateSync(
            self.models, supervisor, run, events, (self.slots, self.book, self.generation, self.traffic), self.kick
        )
        self.memory = Memory()  # what the status page draws (history.py)
        self.answered = Requests()
        self.figures = page_figures.Saver()  # the page's figures kept for the next gateway (page_figures.py)
        self.ledger = Ledger(self.answered)  # answered requests kept, settled together (ledger.py)
        self.metrics: Any = None  # the HTTP side's metrics: cold starts, evictions, waits (optional)
        self.undrainable: set[str] = set()  # victims whose drain timed out: not drained again until idle
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._deferred: str | None = None  # the pressure victim waited for (one evict_deferred event)
        self.housekeeping = Housekeeping(self)  # the half-second round (housekeeping.py)
        self.process = Process(self)  # what makes a model ready and stops it (process.py)
        self._background: set[asyncio.Task[None]] = set()

    def _model(self, name: str, doc: ModelDoc) -> Model:
        """A model whose every change of phase is written to the event log as it is made (a `state` event)."""

        def announce(was: str, now: str, why: str | None) -> None:
            self.events.add("state", name, by="gateway", **{"from": was, "to": now}, why=why)

        return Model(name, doc, Lifecycle(announce))

    def served(self) -> list[Model]:
        """The models clients may ask for (a split model's RPC part on this node is none)."""
        return [m for m in self.models.values() if m.plan.part_of is None]

    @classmethod
    def of_bundle(cls, bundle: Path) -> Scheduler:
        run = RunDir.of_bundle(bundle)
        plan, digest = read_plan(bundle / PLAN_FILE)
        sched = cls(plan, run, Supervisor(run.socket()), EventLog(run.events))
        sched.sync.plan_digest = digest
        return sched

    def adopt(self, plan: PlanDoc, digest: str | None = None) -> bool:
        """A new plan that differs from the one it serves only in its models (PlanDoc.frame), taken on in place:
        what it serves, its figures and the leases stay. An added model is served from now on; a removed one's
        queued requests are refused and it is no longer routed (its requests in flight finish); a changed one takes
        its new settings (supervisord restarts its worker where its program changed). False where the frame
        differs: this gateway cannot take that plan on (it is restarted instead)."""
        if plan.frame() != self.plan.frame():
            return False
        old = self.plan.models
        removed = [n for n in old if n not in plan.models]
        added = [n for n in plan.models if n not in old]
        changed = [n for n in plan.models if n in old and plan.models[n] != old[n]]
        for name in removed:
            m = self.models.pop(name)
            self.slots.fail_waiters(m, Refused(f"model {name} was removed from the stack", "model_not_found"))
            if m.starting is not None:
                m.starting.cancel()
        for name in added:
            self.models[name] = self._model(name, plan.models[name])
            self.traffic.setdefault(name, Traffic())
        for name in changed:
            m = self.models[name]
            m.plan = plan.models[name]
            self.sync.worker_lost(m, "restarted with its new settings")  # asked again once supervisord has it
        self.plan = plan
        self.slots.reroute(plan.models)
        if self.metrics is not None:
            self.metrics.adopt(self.models)
        if digest is not None:
            self.sync.plan_digest = digest
        self.events.add("plan_adopted", None, by="gateway", added=added, changed=changed, removed=removed)
        self.sync.write_state(time.time(), Write.DURABLE)
        self.kick()
        return True

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, *, background: bool = True) -> None:
        """Learn the stack's state, then run the pump (decisions for queued requests) and, in the `background`,
        the polls and health probes (tests drive those by hand: sync.refresh, housekeeping_once)."""
        with contextlib.suppress(*CONNECT_ERRORS):
            pid = int(await asyncio.to_thread(self.supervisor.call, "supervisor.getPID"))
            self.sync.supervisord_pid = pid
        self.book.load(read_optional(GatewayState, self.run.gateway_state), self.sync.supervisord_pid)
        page_figures.load(self.run.gateway_figures, self.sync.supervisord_pid, self.traffic, self.answered, self.memory)
        self._figures_seen, self._figures_at = self._figures_mark(), time.monotonic()
        with contextlib.suppress(*CONNECT_ERRORS):
            await self.sync.refresh()
        self.sync.write_state(time.time())  # what it serves is published from its first request on
        self._tasks = [asyncio.create_task(self._pump())]
        if background:
            self._tasks += [
                asyncio.create_task(self.housekeeping.run()),
                asyncio.create_task(self.sync.health_watch(self.gw.health_interval_s)),
            ]

    @property
    def closing(self) -> bool:
        return self.sync.closing

    def refuse_queued(self) -> None:
        self.sync.closing = True
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
        self.keep_figures(force=True)
        self.events.close()

    def _figures_mark(self) -> tuple[int, int, float]:
        self.ledger.settle()
        last = self.answered.items[-1].t if self.answered.items else 0.0
        return len(self.answered.items), len(self.memory.points), last

    def keep_figures(self, *, force: bool = False) -> None:
        """The figures the page and status show, kept for the next gateway of this run: when they changed, at most
        every page_figures.SAVE_S (and at once when it stops)."""
        mark = self._figures_mark()
        if mark == self._figures_seen or not (force or page_figures.due(self._figures_at)):
            return
        self.figures.save(self.run.gateway_figures, self.sync.supervisord_pid, self.traffic, self.answered,
                          self.memory)  # fmt: skip
        self._figures_seen, self._figures_at = mark, time.monotonic()

    def kick(self) -> None:
        self._kick.set()

    # -- what the slots ask (core.Admission) ----------------------------------------------------
    def idle(self, m: Model) -> None:
        self.undrainable.discard(m.name)
        if any(q.waiters for q in self.slots.queues.values()):
            self.kick()  # an idle model may be what a waiting cold start needs

    def choose(self, names: list[str]) -> Model:
        """Which of interchangeable models answers a request for their shared name: a ready one (the least busy),
        else one already starting, else the cheapest to start: admitted without evicting anything, then admitted
        at all, then the quickest to bring back (restore_cost); the stack's order breaks ties."""

        def rank(m: Model) -> tuple[int, float]:
            if m.ready and not m.draining:
                return 0, self.slots[m.name].in_flight / m.max_concurrency
            if m.starting is not None:
                return 1, 0.0
            decision = self.decide_model(m)
            return (2 if not decision.victims else 3) if decision.fits else 4, self.restore_cost(m)[0]

        return min((self.models[n] for n in names), key=rank)

    def refusal_now(self, m: Model) -> Refused | None:
        """A model that is down and that the eviction policy cannot admit even by stopping every lower-priority
        worker: say so at once (what /umemc/can-load says) rather than queue the request until queue_timeout. Only
        when nothing is on its way in or out: a start or a stop in flight changes the answer. The same decision as
        a start (the budget and the pressure rule): what `umemc check` promised, the gateway keeps, and what it
        refuses it says at once (event `refused`)."""
        unsettled = (Phase.STARTING, Phase.DRAINING, Phase.STOPPING)
        if m.live or any(x.life.phase in unsettled for x in self.models.values()):
            return None
        need = self.need_for(m)
        decision = self.decide(need, exclude=m.name)
        if decision.fits:
            return None
        self.events.add("refused", m.name, reason=decision.reason(need), blocked_by=decision.blocked_by)
        return Refused(
            f"model {m.name} cannot be loaded now: {decision.reason(need)}. "
            "Send 'X-Umemc-Wait: 1' to queue until memory frees (up to the queue timeout)",
            "not_admissible",
            30,
        )

    def timed_out(self, m: Model) -> Refused:
        waited = self.gw.queue_timeout_s
        q = self.slots[m.name]
        if m.ready:
            return Refused(
                f"model {m.name}: no slot within {waited:g} s ({q.in_flight} in flight, {q.queued} queued)",
                "queue_timeout",
                self.slots.retry_after(m),
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
        expiries = [b["expires"] - time.time() for b in decision.blocked_by if b["kind"] == "lease"]
        retry = max(1, min([math.ceil(float(e)) for e in expiries if e > 0] + [10]))
        return Refused(f"model {m.name} could not start within {waited:g} s: {why}", "insufficient_memory", retry)

    # -- admission ------------------------------------------------------------------------------
    def need_for(self, m: Model) -> Need:
        p = m.plan
        return Need(
            m.name, ram=p.quota_hard_bytes, gpu=p.gpu_quota_hard_bytes, priority=p.priority, cold=m.cold, drain=True
        )

    def held_by(self, m: Model) -> Held:
        """A running model as the one policy sees it (its queue from the slots)."""
        q = self.slots[m.name]
        return Held(
            m.name,
            m.plan.priority,
            cold=m.cold,
            ram=max(m.usage, m.plan.quota_hard_bytes),
            gpu=m.plan.gpu_quota_hard_bytes,
            busy=q.busy or m.starting is not None,
            drainable=m.ready and m.starting is None,
            last_used=q.last_used,
            evicting=m.evicting or m.draining,
            live=m.usage,
            hard=m.plan.quota_hard_bytes,
            restore_s=self.restore_cost(m)[0],
        )

    def restore_cost(self, m: Model) -> tuple[float, str]:
        """Seconds to bring the model back and where the figure comes from: its last start on demand (this run's,
        or the event log's), else its size (the estimate) at ASSUMED_LOAD_BYTES_PER_S."""
        if m.last_cold_start_s is not None:
            return m.last_cold_start_s, "measured"
        return round(m.plan.estimate_bytes / ASSUMED_LOAD_BYTES_PER_S, 3), "size"

    def eviction_detail(self, victim: Model, priority: int) -> dict[str, Any]:
        """Why this victim: its priority against the start's, and among equals what it costs to bring back."""
        seconds, source = self.restore_cost(victim)
        return {"for_priority": priority, "restore_s": seconds, "restore_from": source}

    def held(self, exclude: str | None = None) -> list[Held]:
        return [self.held_by(m) for m in self.models.values() if m.live and m.name != exclude]

    def decide(self, need: Need, exclude: str | None = None) -> Decision:
        """The one policy on live figures: the budget ledger and, once the enforcer has measured it, the
        pressure rule (a start only while pressure, less what its evictions free, is below load_below)."""
        pressure = self.sync.pressure
        # nothing measured yet: the ledger alone decides
        budget = self.budget._replace(pressure=pressure) if pressure is not None else self.budget._replace(usable=0)
        return decide(need, self.held(exclude), self.book.live(), budget)

    def decide_model(self, m: Model) -> Decision:
        if m.live:  # it holds its quota already: what is free is what is free beside everything running
            ram, gpu = self.committed()
            free_gpu = None if self.budget.gpu is None else self.budget.gpu - gpu
            return Decision(fits=True, free_ram=self.budget.ram - ram, free_gpu=free_gpu)
        decision = self.decide(self.need_for(m), exclude=m.name)
        if self.undrainable & set(decision.drain):
            return Decision(
                fits=False,
                blocked_by=[
                    {
                        "kind": "worker",
                        "name": v,
                        "priority": self.models[v].plan.priority,
                        "bytes": self.held_by(self.models[v]).ram,
                        "why": "requests in flight (drain timed out)",
                    }
                    for v in decision.drain
                ],
                free_ram=decision.free_ram,
                free_gpu=decision.free_gpu,
            )
        return decision

    def committed(self) -> tuple[int, int]:
        held, leases = attach(self.held(), self.book.live())  # a worker's own lease counts in its allowance
        ram = sum(h.ram for h in held) + sum(x.ram for x in leases)
        return ram, sum(h.gpu for h in held) + sum(x.gpu for x in leases)

    # -- the pump: requests waiting for a model that is not ready ----------------------------------
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
        waiting = [m for m in self.models.values() if self.slots[m.name].waiters]
        for m in sorted(waiting, key=lambda m: self.slots[m.name].waiters[0][0]):
            self.slots.dispatch(m)
            if m.ready or m.starting is not None or m.evicting or not self.slots[m.name].waiters:
                continue  # served, starting, or being stopped (it is started afresh once down)
            if m.live:  # supervisord runs it (a restart after a crash, or started outside the gateway)
                self.process.begin_start(m, Decision(fits=True))
                continue
            decision = self.decide_model(m)
            if decision.fits:
                self.launch(m, decision)

    # -- starts and stops -----------------------------------------------------------------------
    def launch(self, m: Model, decision: Decision) -> None:
        """Start an admitted model: its idle victims marked for stopping, its busy ones draining, then the start."""
        for v in decision.evict:
            self.models[v].life.to(Phase.STOPPING, f"evicted for {m.name}")
        for v in decision.drain:
            self.drain(self.models[v], f"evicted for {m.name} once its requests are done")
        self.process.begin_start(m, decision)

    def drain(self, m: Model, why: str) -> None:
        """It serves the requests queued before now, takes none after."""
        m.life.to(Phase.DRAINING, why)
        self.slots.drain(m)

    # -- leases: from the request to the ledger, one way ------------------------------------------
    async def grant_lease(
        self, holder: str, ram: int, gpu: int, priority: int, ttl: float, model: str | None, worker: str | None
    ) -> tuple[Lease | None, Decision, Need]:
        """Admit a lease like a cold start (a worker's lease raises its allowance: the same need as memory of its
        own); record it and have it on disk before the client hears of it; stop what it evicts. None: refused."""
        need = Need("lease", ram=ram, gpu=gpu, priority=priority, cold=False, drain=False)
        async with self.lock:
            if self.book.full:
                raise Refused("64 leases are live: release one first (GET /umemc/leases lists them)", "too_many_leases")
            decision = self.decide(need)
            if not decision.fits:
                return None, decision, need
            lease = self.book.add(holder, ram, gpu, priority, ttl, model, worker)
            if not self.sync.write_state(time.time(), how=Write.DURABLE):  # a gateway killed after 201 finds it
                self.book.drop(lease.id)
                raise Refused(
                    f"the lease could not be recorded ({self.sync.state_error}): it is not granted",
                    "state_unwritable",
                    10,
                )
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
            await asyncio.gather(
                *(
                    self.process.stop(
                        self.models[v],
                        "evict",
                        for_lease=lease.id,
                        holder=holder,
                        **self.eviction_detail(self.models[v], priority),
                    )  # fmt: skip
                    for v in decision.evict
                )
            )
        except Refused:
            self.release_lease(lease.id)  # its room could not be made: it never held
            raise
        return lease, decision, need

    def grant_at(self, need: Need) -> tuple[int, Decision] | None:
        """The lowest priority above a refused lease's at which it would be granted now (and what it would evict),
        or None where no priority would (the memory is held by leases, by busy workers or by pressure, none of
        which a priority displaces)."""
        for priority in range(need.priority + 1, 101):
            decision = self.decide(replace(need, priority=priority))
            if decision.fits:
                return priority, decision
        return None

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        lease = self.book.drop(lease_id)
        if lease is not None:
            self.events.add(why, None, id=lease.id, holder=lease.holder, bytes=lease.ram)
            self.sync.write_state(time.time(), how=Write.DURABLE)  # a released lease does not come back
            self.kick()
        return lease

    def extend_lease(self, lease_id: str, ttl: float) -> Lease | None:
        lease = self.book.extend(lease_id, ttl)
        if lease is not None:
            self.sync.write_state(time.time(), how=Write.DURABLE)  # the client is told its new expiry: keep it
        return lease

    # -- housekeeping (housekeeping.py) and what a client asks of a model's idle time -----------------
    async def housekeeping_once(self, now: float | None = None) -> None:
        await self.housekeeping.once(now)

    def idle_limit(self, m: Model) -> float | None:
        """How long the model may stay idle before it is unloaded: a client's keep_alive, else a cold model's ttl;
        None: no limit."""
        limit = m.keep_alive_s if m.keep_alive_s is not None else m.plan.ttl_s if m.cold else None
        return None if limit is None or math.isinf(limit) else limit

    # -- the enforcer's pressure, a person's actions -----------------------------------------------
    async def relieve_pressure(self, pressure: float) -> dict[str, Any]:
        """The enforcer measured pressure above evict_above and asks: stop the worker the one
        eviction policy names (lowest priority, then least recently used). When that worker has
        requests in flight or queued, wait for them (`evict_deferred`) rather than cut them off or
        take a higher priority instead. The stop runs in the background: the enforcer never waits."""
        pol = self.plan.policy
        try:  # a fresh view first: a worker the enforcer stopped a moment ago (a give-up) is no victim
            infos: dict[str, dict[str, Any]] | None = await self.process.processes()
        except CONNECT_ERRORS:
            infos = None  # supervisord did not answer: the last poll's view
        async with self.lock:
            if infos is not None:
                for each in self.models.values():
                    self.sync.observe(each, infos.get(each.name))
            serving = (Phase.READY, Phase.UNHEALTHY)
            # what supervisord runs and nobody is already starting or stopping
            running = [
                m for m in self.models.values() if m.state in ANSWERING and m.life.phase in (*serving, Phase.DOWN)
            ]
            victim = pressure_victim([self.held_by(m) for m in running])
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
        task = asyncio.create_task(self.process.stop(m, "evict", Evicted.STAY_DOWN, **detail))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return {"action": "evicting", "model": m.name}

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
            self.process.asked(m)
            self.launch(m, decision)
        return f"starting {m.name}" + (f", evicting {', '.join(decision.victims)}" if decision.victims else "")

    async def load(self, m: Model, admit: Admit) -> None:
        """Make a model ready without a request for it (a client's load: Ollama's empty chat, the router's
        /models/load): the same admission and start as a request's, waited for; its slot is let go at once."""
        await self.slots.acquire(m, admit)
        self.slots.release(m)

    async def stop_now(self, m: Model, *, drain: bool) -> str:
        """Stop a running model at a person's request: drain first (its requests in flight and queued are served,
        none taken after), or at once (refused while it has requests). It stays down until asked for again."""
        if not m.live or m.evicting:
            return f"{m.name} is not running"
        if m.starting is not None:
            raise Refused(f"model {m.name} is starting: stop it once it is up", "busy")
        q = self.slots[m.name]
        if not drain and q.busy:
            raise Refused(
                f"model {m.name} has {q.in_flight} request(s) in flight and {q.queued} queued: stop drains them first",
                "busy",
            )
        self.events.add("action", m.name, action="stop" if drain else "evict")
        if drain and q.busy:
            self.drain(m, "asked to stop")
            if not await self.slots.wait_drained([m.name], self.gw.drain_timeout_s):
                m.life.to(Phase.READY, "its drain timed out")
                self.slots.undrain(m)
                raise Refused(
                    f"model {m.name} still had requests after {self.gw.drain_timeout_s:g} s (gateway.drain_timeout): "
                    "not stopped",
                    "busy",
                )
        await self.process.stop(m, "unload", Evicted.STAY_DOWN)
        return f"stopped {m.name}"
