"""The admission's figures on live state, read and never written: what a start needs, what each running model holds
as the one eviction policy sees it (umemc.budget.policy), what the policy decides for a start or a lease, what is
committed, which of interchangeable models answers a shared name, what bringing a model back costs, how long one
may stay idle, and why a start is refused. It changes nothing and writes no event: the scheduler, the process and
housekeeping act on what it says, under the scheduler's lock."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ...budget.policy import Budget, Decision, Held, Need, attach, decide
from .lifecycle import Phase
from .model import Model, Refused

if TYPE_CHECKING:
    from ...contract import GatewayDoc
    from .lease_book import LeaseBook
    from .slots import Slots
    from .sync import StateSync

# What bringing back a model never started on demand is taken to cost: its size read at this rate (a page-cached
# or NVMe read is faster, a cold disk slower); a measured start (the event log's cold_start) replaces it.
ASSUMED_LOAD_BYTES_PER_S = 1 << 30


class Admission:
    """Given the parts it reads (shared by reference, owned elsewhere): the models, their slots, the lease book,
    the sync's pressure, the budget, the gateway's settings and the victims whose drain timed out."""

    def __init__(
        self,
        models: dict[str, Model],
        slots: Slots,
        book: LeaseBook,
        sync: StateSync,
        budget: Budget,
        gw: GatewayDoc,
        undrainable: set[str],
    ):
        self.models, self.slots, self.book, self.sync = models, slots, book, sync
        self.budget, self.gw, self.undrainable = budget, gw, undrainable

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

    def idle_limit(self, m: Model) -> float | None:
        """How long the model may stay idle before it is unloaded: a client's keep_alive, else a cold model's ttl;
        None: no limit."""
        limit = m.keep_alive_s if m.keep_alive_s is not None else m.plan.ttl_s if m.cold else None
        return None if limit is None or math.isinf(limit) else limit

    def refusal(self, m: Model) -> tuple[Need, Decision] | None:
        """A model that is down and that the eviction policy cannot admit even by stopping every lower-priority
        worker, with what it needs and the decision; None where it may be admitted, or where a start or a stop in
        flight may change the answer (nothing is on its way in or out)."""
        unsettled = (Phase.STARTING, Phase.DRAINING, Phase.STOPPING)
        if m.live or any(x.life.phase in unsettled for x in self.models.values()):
            return None
        need = self.need_for(m)
        decision = self.decide(need, exclude=m.name)
        return None if decision.fits else (need, decision)

    def timed_out(self, m: Model) -> Refused:
        """What a request that waited the queue timeout for this model is told, and when to try again."""
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
