"""What every part of the scheduler shares: its state, and the few operations one part calls on
another (implemented in slots.py, leases.py, sync.py and scheduler.py). The parts are mixins of
`Scheduler`; this base only declares, so each part type-checks on its own."""

from __future__ import annotations

import asyncio
from typing import Any

from ...contract import (
    EnforcerStatus,
    GatewayDoc,
    PlanDoc,
)
from ...policy import Budget, Decision, Held, Lease, Need
from ..events import EventLog
from ..rundir import RunDir
from ..supervisor import Supervisor
from .model import Model, Refused


class Core:
    plan: PlanDoc
    gw: GatewayDoc
    run: RunDir
    supervisor: Supervisor
    budget: Budget
    models: dict[str, Model]
    routes: dict[str, str]
    leases: dict[str, Lease]
    lock: asyncio.Lock
    events: EventLog
    enforcer: EnforcerStatus | None  # its latest fresh status file
    pressure: float | None
    supervisord_pid: int | None
    probe: Any
    metrics: Any
    closing: bool
    _published_busy: set[str]
    _state_error: str | None

    def kick(self) -> None:
        raise NotImplementedError

    def decide(self, need: Need, exclude: str | None = None) -> Decision:
        raise NotImplementedError

    def decide_model(self, m: Model) -> Decision:
        raise NotImplementedError

    def need_for(self, m: Model) -> Need:
        raise NotImplementedError

    def held(self, exclude: str | None = None) -> list[Held]:
        raise NotImplementedError

    def live_leases(self) -> list[Lease]:
        raise NotImplementedError

    def write_state(self, now: float, arriving: str | None = None, durable: bool = False) -> bool:
        raise NotImplementedError

    def _dispatch(self, m: Model) -> None:
        raise NotImplementedError

    def _fail_waiters(self, m: Model, exc: Refused) -> None:
        raise NotImplementedError

    def _begin_start(self, m: Model, decision: Decision) -> None:
        raise NotImplementedError

    async def _stop(self, m: Model, why: str, restorable: bool = True, **detail: Any) -> None:
        raise NotImplementedError

    def mark_healthy(self, m: Model, was: str | None = None) -> None:
        raise NotImplementedError

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        raise NotImplementedError
