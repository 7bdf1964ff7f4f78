"""The gateway's scheduler: the pump (decisions for requests that wait), the plan taken on in place, the gateway's
start and close, and the composition of its parts, each the one owner of its state and each given what it uses,
never the scheduler: model.py (a model: its plan, lifecycle and the stack's view of it), slots.py (routes, slots,
queues, drains), lease_book.py (the lease book, a ledger), sync.py (supervisord's and the enforcer's view, health,
gateway.json), traffic.py (tokens, the HTTP side's), admission.py (the admission's figures: a reader), process.py
(a model's start, its stage in words, its stop, a client's keep_alive; whether a model that requests wait for needs
a start), actions.py (leases, the enforcer's pressure, a person's start and stop), housekeeping.py (the half-second
round: idle unloads, fragmented restarts, hot restores, expiries).

Everything runs on one event loop. A request for a ready model with a free slot and nobody queued
takes the fast path (slots.py: no lock, no await). Everything else queues and wakes the pump, which makes
each decision under `lock` (shared with lease grants) and records it at once (a starting model
and the victims being evicted keep counting in the ledger until they are gone), so no two
decisions can spend the same bytes. Requests for a model that is starting all wait for that one
start: interleaved A B C A B C loads start each model once."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path

from ...budget.policy import Budget
from ...contract import ContractError, GatewayDoc, GatewayState, ModelDoc, PlanDoc, read_optional, read_plan
from ...names import PLAN_FILE
from ..event_log import EventLog
from ..rundir import RunDir
from ..supervisor import Supervisor
from . import page_figures
from .actions import Actions
from .admission import Admission
from .core import Admit, Parts, SlotCalls, Write
from .generation import GenerationBudget
from .history import Memory, Requests
from .housekeeping import Housekeeping
from .lease_book import LeaseBook
from .ledger import Ledger
from .lifecycle import Lifecycle
from .model import CONNECT_ERRORS, Model, Refused
from .process import Process
from .slots import Slots
from .sync import StateSync
from .traffic import Traffic

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
        calls = SlotCalls(lambda: self.sync.closing, self.kick, self.refusal_now, self.timed_out, self.idle,
                          self.choose)  # fmt: skip
        self.slots = Slots(self.models, plan.models, self.gw, calls, plan.peers)
        self.book = LeaseBook()
        self.sync = StateSync(
            self.models, supervisor, run, events, (self.slots, self.book, self.generation, self.traffic), self.kick
        )
        self.memory = Memory()  # what the status page draws (history.py)
        self.answered = Requests()
        self.figures = page_figures.Saver()  # the page's figures kept for the next gateway (page_figures.py)
        self.ledger = Ledger(self.answered)  # answered requests kept, settled together (ledger.py)
        self.undrainable: set[str] = set()  # victims whose drain timed out: not drained again until idle
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.admission = Admission(self.models, self.slots, self.book, self.sync, self.budget, self.gw,
                                   self.undrainable)  # fmt: skip
        self.parts = Parts(
            self.gw, plan.policy, plan.platform.kind, run, supervisor, events, self.models, self.slots, self.sync,
            self.book, self.traffic, self.memory, self.lock, self.undrainable, self.admission, self.kick,
        )  # fmt: skip
        self.process = Process(self.parts)  # what makes a model ready and stops it (process.py)
        self.actions = Actions(self.parts, self.process)  # leases, pressure, a person's start and stop (actions.py)
        # the half-second round (housekeeping.py)
        self.housekeeping = Housekeeping(self.parts, self.process, self.actions.release_lease, self.keep_figures)

    def timed_out(self, m: Model) -> Refused:
        return self.admission.timed_out(m)

    def choose(self, names: list[str]) -> Model:
        return self.admission.choose(names)

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
        self.sync.look_again()  # the programs supervisord has now
        self.slots.reroute(plan.models)
        if self.process.metrics is not None:  # the HTTP side's, where it has them
            self.process.metrics.adopt(self.models)
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

    # -- what the slots call on (core.SlotCalls) -----------------------------------------------------
    def idle(self, m: Model) -> None:
        self.undrainable.discard(m.name)
        if any(q.waiters for q in self.slots.queues.values()):
            self.kick()  # an idle model may be what a waiting cold start needs

    def refusal_now(self, m: Model) -> Refused | None:
        """A model that is down and that the eviction policy cannot admit even by stopping every lower-priority
        worker: say so at once (what /umemc/can-load says) rather than queue the request until queue_timeout. The
        same decision as a start (the budget and the pressure rule): what `umemc check` promised, the gateway
        keeps, and what it refuses it says at once (event `refused`)."""
        refused = self.admission.refusal(m)
        if refused is None:
            return None
        need, decision = refused
        self.events.add("refused", m.name, reason=decision.reason(need), blocked_by=decision.blocked_by)
        return Refused(
            f"model {m.name} cannot be loaded now: {decision.reason(need)}. "
            "Send 'X-Umemc-Wait: 1' to queue until memory frees (up to the queue timeout)",
            "not_admissible",
            30,
        )

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
            if self.slots[m.name].waiters:  # not served by a free slot: what it needs is the process's to say
                self.process.ensure_ready(m)

    async def housekeeping_once(self, now: float | None = None) -> None:
        await self.housekeeping.once(now)
