"""Keeping in step with the rest of the stack: supervisord's process states and the enforcer's live figures
(polled), worker health (probed), and RUN/state/gateway.json (what is in flight, the leases). The sync is the one
writer of each model's view of the rest of the stack (its supervisord state, usage, given-up flag, restarts, health
failures); it moves a lifecycle only by what it saw (a worker that answers is READY, one that stopped answering
UNHEALTHY, one that is gone DOWN)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...contract import ContractError, EnforcerStatus, GatewayModel, GatewayState, dump, parse
from ...records import read_file, write_atomic
from ..event_log import EventLog
from ..rundir import RunDir
from ..supervisor import Supervisor
from .core import Write
from .generation import GenerationBudget
from .lease_book import LeaseBook, lease_doc
from .lifecycle import SERVING, Phase
from .model import ANSWERING, LIVE, Model, ProcState
from .slots import Slots
from .traffic import Traffic

POLL_S = 0.5  # the round: the enforcer's status file, and supervisord's process table where it may have changed
TABLE_EVERY_S = 5.0  # supervisord's process table asked at least this often, changed or not
STATUS_FRESH_S = 5.0
# a program in one of these states moves on without a process starting or ending (startsecs passing, a backoff
# giving up): its table is asked every round while any is
MOVING = frozenset({ProcState.STARTING, ProcState.BACKOFF, ProcState.STOPPING})
Probe = Callable[[Model], Awaitable[bool]]
Children = Callable[[int], frozenset[int]]


class StateSync:
    """Owns what the gateway learns from the rest of the stack (supervisord's pid, the enforcer's latest status and
    pressure, each model's view) and what it publishes (gateway.json)."""

    def __init__(
        self,
        models: dict[str, Model],
        supervisor: Supervisor,
        run: RunDir,
        events: EventLog,
        parts: tuple[Slots, LeaseBook, GenerationBudget, dict[str, Traffic]],
        kick: Callable[[], None],
    ):
        self.models, self.supervisor, self.run, self.events = models, supervisor, run, events
        self.slots, self.book, self.generation, self.traffic = parts
        self.kick = kick
        self.probe: Probe | None = None  # given by the HTTP side (its client)
        self.closing = False
        self.supervisord_pid: int | None = None
        # supervisord's children, where this platform reads them for next to nothing (Linux's /proc: ~6 us; its
        # XML-RPC table costs the gateway ~1 ms and a thread's hand-off): given by the gateway's process
        self.children: Children | None = None
        self._table: dict[str, dict[str, Any]] | None = None  # supervisord's last answer, its time and its children
        self._table_at = 0.0
        self._table_children: frozenset[int] | None = None
        self.enforcer: EnforcerStatus | None = None  # its latest fresh status file
        self._status_text: bytes | None = None  # the status file last parsed, and what it said
        self._status_doc: EnforcerStatus | None = None
        self.pressure: float | None = None
        self.published: tuple[Any, ...] | None = None  # what gateway.json says (its time aside)
        self.state_error: str | None = None
        self.plan_digest: str | None = None  # the plan it serves (contract.read_plan), said in gateway.json

    # -- what was seen ----------------------------------------------------------------------------
    def observe(self, m: Model, info: dict[str, Any] | None) -> ProcState:
        """supervisord's answer about one model (the scheduler's own asking included)."""
        m.state = ProcState.of(info)
        return m.state

    def stopped(self, m: Model) -> None:
        """The scheduler stopped it: nothing of it runs, nothing of it is held."""
        m.state, m.usage = ProcState.STOPPED, 0
        self.look_again()

    def mark_unhealthy(self, m: Model, why: str) -> None:
        """A ready worker that stopped answering (SIGSTOP, a deadlock): no new request goes to it; the
        queue waits for it to answer its health URL again (or for it to be restarted)."""
        if m.ready:
            m.life.to(Phase.UNHEALTHY, why)
            self.events.add("unhealthy", m.name, reason=why, state=m.state)
        self.kick()

    def worker_lost(self, m: Model, why: str) -> None:
        """A request found the worker gone between two polls: it is DOWN until supervisord restarts it."""
        if m.ready:
            m.life.to(Phase.DOWN, why)
        self.look_again()
        self.kick()

    def look_again(self) -> None:
        """supervisord's table asked afresh at the next round (the gateway started or stopped a program, or found
        one gone, or its programs changed)."""
        self._table = None

    def mark_healthy(self, m: Model, was: str | None = None) -> None:
        m.health_failures = 0
        if was is not None:
            self.events.add("recovered", m.name, was=was)

    async def health_watch(self, interval: float) -> None:
        """Every health_interval: probe each ready, idle-or-busy worker (2 s timeout); two failures in a
        row mark it unhealthy."""
        while True:
            await asyncio.sleep(interval)
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

    async def refresh(self) -> None:
        """supervisord's states and the enforcer's live usage."""
        infos, asked = await self.table()
        status = self._enforcer_status()
        changed = False
        for m in self.models.values():
            info = infos.get(m.name)
            state = ProcState.of(info)
            if m.starting is None and not m.evicting and m.touched < asked:  # else newer than this answer
                changed |= await self._moved(m, state)
            live = None if status is None else status.models.get(m.name)
            m.usage = live.rss_bytes + live.gpu_bytes if live is not None and m.live else 0
            m.given_up = live is not None and live.given_up and state not in LIVE
            m.restarts = 0 if live is None else live.restarts
        self.pressure = None if status is None else status.pressure
        self.enforcer = status
        why = None if status is None else status.throttling
        if self.generation.throttle(why):
            heat_c = None if status is None else status.heat_c
            self.events.add("throttle", None, throttling=why, max_generating=self.generation.capacity, heat_c=heat_c)
            changed = True
        if changed:
            self.kick()

    async def table(self) -> tuple[dict[str, dict[str, Any]], float]:
        """supervisord's process table and when it was asked: asked again where it may have changed (a process of
        supervisord's started or ended: its children changed; a program in a MOVING state; the gateway's own
        look_again) and at least every TABLE_EVERY_S, else the last answer (an idle stack's table is the same
        round after round). Every round where supervisord's children cannot be read."""
        now = time.monotonic()
        pid, children = self.supervisord_pid, self.children
        seen = None if pid is None or children is None else children(pid)
        last = self._table
        if (
            last is None
            or seen is None
            or seen != self._table_children
            or now - self._table_at >= TABLE_EVERY_S
            or any(ProcState.of(info) in MOVING for info in last.values())
        ):
            last = await asyncio.to_thread(self.supervisor.processes)  # raises: asked again next round
            self._table, self._table_at, self._table_children = last, now, seen
        return last, self._table_at

    async def _moved(self, m: Model, state: ProcState) -> bool:
        """What supervisord says moves the model: a serving worker that is no longer running is DOWN (crashed,
        killed, evicted by the enforcer); a running one that answers its health URL is READY (started by `up`,
        restarted, recovered). True when it moved."""
        moved = False
        if m.life.phase in (*SERVING, Phase.UNHEALTHY) and state not in ANSWERING:
            m.life.to(Phase.DOWN, f"supervisord says {state}")
            moved = True
        m.state = state
        if m.state in ANSWERING and not m.ready and self.probe is not None and await self.probe(m):
            was = m.unhealthy
            m.life.to(Phase.READY, "answers its health URL")
            self.slots.touch(m)
            self.mark_healthy(m, was)
            moved = True
        return moved

    def _enforcer_status(self) -> EnforcerStatus | None:
        """The enforcer's status as its file says, while fresh. The file is parsed again only when its bytes changed
        (the enforcer rewrites it every second, the round comes twice as often; the parse is most of the read)."""
        try:
            text = read_file(self.run.status)
        except OSError:
            text = None
        if text != self._status_text:
            doc = None
            if text is not None:
                with contextlib.suppress(ContractError):  # corrupt: as if missing, until it is written again
                    doc = parse(EnforcerStatus, text, self.run.status)
            self._status_text, self._status_doc = text, doc
        doc = self._status_doc
        return doc if doc is not None and time.time() - doc.time < STATUS_FRESH_S else None

    # -- what is published --------------------------------------------------------------------------
    def write_state(self, now: float, how: Write = Write.BEST_EFFORT) -> bool:
        """RUN/state/gateway.json: what is in flight or queued and each model's speed, for `umemc status`, and the
        leases (the enforcer raises quotas by them; a restarted gateway takes them back). Written when it says
        something new (housekeeping asks every POLL_S; a request's path never writes it). Write.DURABLE: fsynced
        before it returns (a granted lease is on disk before the client hears 201). False when it could not be
        written."""
        if self.closing:
            return False
        models = {}
        for m in self.models.values():
            q = self.slots[m.name]
            models[m.name] = GatewayModel(
                in_flight=q.in_flight,
                queued=q.queued,
                ready=m.ready,
                starting=m.starting is not None,
                health="unhealthy" if m.unhealthy else "ok",
                unhealthy=m.unhealthy,
                tokens_per_s=self.traffic[m.name].tokens_per_s,
            )
        leases = [lease_doc(x) for x in self.book.leases.values()]
        said = (models, leases, self.generation.status(), self.supervisord_pid, self.plan_digest)
        path = self.run.gateway_state
        if how is Write.BEST_EFFORT and said == self.published and os.path.isfile(path):
            return True
        doc = GatewayState(
            time=now,
            pid=os.getpid(),
            supervisord_pid=self.supervisord_pid,
            models=models,
            leases=leases,
            generation=said[2],
            plan_sha256=self.plan_digest,
        )
        try:
            write_atomic(path, dump(doc), durable=how is Write.DURABLE)
        except OSError as exc:
            # a full or read-only state dir never fails a request: the enforcer keeps the leases it last read,
            # `status` shows the counts last written
            if str(exc) != self.state_error:
                print(f"umemc-gateway: cannot write {path}: {exc}", file=sys.stderr, flush=True)
            self.state_error = str(exc)
            return False
        self.state_error = None
        self.published = said
        return True
