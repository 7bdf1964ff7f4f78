"""What the gateway does when asked rather than when a request waits: the lease flow (a grant admitted like a cold
start and on disk before the client hears of it, a release, an extension, and what priority would have been
granted), the enforcer's pressure (the one eviction policy's victim stopped, or waited for while it has requests),
and a person's or a client's start, stop and load of a model. Each decision is the admission's figures
(admission.py) under the scheduler's lock; the starts and stops are the process's (process.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...budget.policy import Decision, Lease, Need, pressure_victim
from .core import Admit, Evicted, Parts, Write
from .lifecycle import Phase
from .model import ANSWERING, CONNECT_ERRORS, Model, Refused

if TYPE_CHECKING:
    from .process import Process


class Actions:
    def __init__(self, parts: Parts, process: Process):
        self.parts, self.process = parts, process
        self._deferred: str | None = None  # the pressure victim waited for (one evict_deferred event)
        self._background: set[asyncio.Task[None]] = set()

    # -- leases: from the request to the ledger, one way ------------------------------------------
    async def grant_lease(
        self, holder: str, ram: int, gpu: int, priority: int, ttl: float, model: str | None, worker: str | None
    ) -> tuple[Lease | None, Decision, Need]:
        """Admit a lease like a cold start (a worker's lease raises its allowance: the same need as memory of its
        own); record it and have it on disk before the client hears of it; stop what it evicts. None: refused."""
        p = self.parts
        need = Need("lease", ram=ram, gpu=gpu, priority=priority, cold=False, drain=False)
        async with p.lock:
            if p.book.full:
                raise Refused("64 leases are live: release one first (GET /umemc/leases lists them)", "too_many_leases")
            decision = p.admission.decide(need)
            if not decision.fits:
                return None, decision, need
            lease = p.book.add(holder, ram, gpu, priority, ttl, model, worker)
            if not p.sync.write_state(time.time(), how=Write.DURABLE):  # a gateway killed after 201 finds it
                p.book.drop(lease.id)
                raise Refused(
                    f"the lease could not be recorded ({p.sync.state_error}): it is not granted", "state_unwritable", 10
                )
            for v in decision.evict:
                p.models[v].life.to(Phase.STOPPING, f"evicted for lease {lease.id}")
        p.events.add(
            "lease_grant", None, id=lease.id, holder=holder, bytes=ram, ttl_s=ttl, evicted=decision.evict,
            for_model=model,
        )  # fmt: skip
        try:
            await asyncio.gather(
                *(
                    self.process.stop(
                        p.models[v],
                        "evict",
                        for_lease=lease.id,
                        holder=holder,
                        **p.admission.eviction_detail(p.models[v], priority),
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
            decision = self.parts.admission.decide(replace(need, priority=priority))
            if decision.fits:
                return priority, decision
        return None

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        p = self.parts
        lease = p.book.drop(lease_id)
        if lease is not None:
            p.events.add(why, None, id=lease.id, holder=lease.holder, bytes=lease.ram)
            p.sync.write_state(time.time(), how=Write.DURABLE)  # a released lease does not come back
            p.kick()
        return lease

    def extend_lease(self, lease_id: str, ttl: float) -> Lease | None:
        lease = self.parts.book.extend(lease_id, ttl)
        if lease is not None:
            self.parts.sync.write_state(time.time(), how=Write.DURABLE)  # the client is told its new expiry
        return lease

    # -- the enforcer's pressure ----------------------------------------------------------------------
    async def relieve_pressure(self, pressure: float) -> dict[str, Any]:
        """The enforcer measured pressure above evict_above and asks: stop the worker the one
        eviction policy names (lowest priority, then least recently used). When that worker has
        requests in flight or queued, wait for them (`evict_deferred`) rather than cut them off or
        take a higher priority instead. The stop runs in the background: the enforcer never waits."""
        p = self.parts
        try:  # a fresh view first: a worker the enforcer stopped a moment ago (a give-up) is no victim
            infos: dict[str, dict[str, Any]] | None = await self.process.processes()
        except CONNECT_ERRORS:
            infos = None  # supervisord did not answer: the last poll's view
        async with p.lock:
            if infos is not None:
                for each in p.models.values():
                    p.sync.observe(each, infos.get(each.name))
            serving = (Phase.READY, Phase.UNHEALTHY)
            # what supervisord runs and nobody is already starting or stopping
            running = [m for m in p.models.values() if m.state in ANSWERING and m.life.phase in (*serving, Phase.DOWN)]
            victim = pressure_victim([p.admission.held_by(m) for m in running])
            if victim is None:
                return {"action": "none"}
            m = p.models[victim.name]
            if victim.busy:
                if self._deferred != m.name:
                    p.events.add("evict_deferred", m.name, pressure=pressure, reason="requests in flight")
                self._deferred = m.name
                return {"action": "deferred", "model": m.name}
            self._deferred = None
            m.life.to(Phase.STOPPING, "pressure")
        pol = p.policy
        detail = {"reason": "pressure", "pressure": pressure, "evict_above": pol.evict_above,
                  "load_below": pol.load_below}  # fmt: skip
        task = asyncio.create_task(self.process.stop(m, "evict", Evicted.STAY_DOWN, **detail))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return {"action": "evicting", "model": m.name}

    # -- a person's or a client's start, stop and load -----------------------------------------------
    async def start_now(self, m: Model) -> str:
        """Start a model that is down, under the same admission as a request for it (evicting what the policy
        names), without a request. Returns what was done, in words."""
        p = self.parts
        async with p.lock:
            if m.live:
                return f"{m.name} is already {m.status_word}"
            decision = p.admission.decide_model(m)
            if not decision.fits:
                why = decision.reason(p.admission.need_for(m))
                raise Refused(f"model {m.name} cannot start now: {why}", "not_admissible")
            p.events.add("action", m.name, action="start", evicts=decision.victims)
            self.process.asked(m)
            self.process.launch(m, decision)
        return f"starting {m.name}" + (f", evicting {', '.join(decision.victims)}" if decision.victims else "")

    async def load(self, m: Model, admit: Admit) -> None:
        """Make a model ready without a request for it (a client's load: Ollama's empty chat, the router's
        /models/load): the same admission and start as a request's, waited for; its slot is let go at once."""
        await self.parts.slots.acquire(m, admit)
        self.parts.slots.release(m)

    async def stop_now(self, m: Model, *, drain: bool) -> str:
        """Stop a running model at a person's request: drain first (its requests in flight and queued are served,
        none taken after), or at once (refused while it has requests). It stays down until asked for again."""
        p = self.parts
        if not m.live or m.evicting:
            return f"{m.name} is not running"
        if m.starting is not None:
            raise Refused(f"model {m.name} is starting: stop it once it is up", "busy")
        q = p.slots[m.name]
        if not drain and q.busy:
            raise Refused(
                f"model {m.name} has {q.in_flight} request(s) in flight and {q.queued} queued: stop drains them first",
                "busy",
            )
        p.events.add("action", m.name, action="stop" if drain else "evict")
        if drain and q.busy:
            self.process.drain(m, "asked to stop")
            if not await p.slots.wait_drained([m.name], p.gw.drain_timeout_s):
                m.life.to(Phase.READY, "its drain timed out")
                p.slots.undrain(m)
                raise Refused(
                    f"model {m.name} still had requests after {p.gw.drain_timeout_s:g} s (gateway.drain_timeout): "
                    "not stopped",
                    "busy",
                )
        await self.process.stop(m, "unload", Evicted.STAY_DOWN)
        return f"stopped {m.name}"
