"""What the scheduler's parts share, and what they ask of the scheduler that composes them.

The parts (slots.py: request slots and queues; leases.py: the lease book; sync.py: polls, health, TTL,
gateway.json) are objects that each own their state; they are given the `Host` (the Scheduler) for the
stack's shared facts (its plan, models, event log, lock) and the few operations that cross parts. The
modes these operations take are enums, never booleans."""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import Any, Protocol

from ...contract import GatewayDoc, PlanDoc
from ...policy import Decision, Lease, Need
from ..events import EventLog
from ..rundir import RunDir
from ..supervisor import Supervisor
from .generation import GenerationBudget
from .history import Memory
from .model import Model, Refused


class Admit(Enum):
    """What a request does when its model is not ready."""

    QUEUE = "queue"  # wait for a slot (and a cold start) up to the queue timeout
    REFUSE_NOW = "refuse_now"  # a model the policy cannot admit now is refused at once (503 not_admissible)


class Evicted(Enum):
    """What becomes of a hot worker the gateway stops."""

    RESTORE = "restore"  # evicted to admit another: it comes back once it fits again
    STAY_DOWN = "stay_down"  # evicted for pressure (it would oscillate) or unloaded: it stays down


class Write(Enum):
    """How gateway.json is written."""

    BEST_EFFORT = "best_effort"  # atomically; a crash may lose the latest change
    DURABLE = "durable"  # fsynced (file and directory) before it returns: a granted lease survives kill -9


class Host(Protocol):
    plan: PlanDoc
    gw: GatewayDoc
    run: RunDir
    supervisor: Supervisor
    models: dict[str, Model]
    lock: asyncio.Lock
    events: EventLog
    generation: GenerationBudget
    probe: Any  # async (model) -> healthy?, given by the app (its HTTP client)
    metrics: Any  # the app's metrics (optional)
    memory: Memory  # what the status page draws over time
    closing: bool

    @property
    def state_error(self) -> str | None: ...  # why gateway.json could not be written last, if it could not

    def kick(self) -> None: ...

    def announce(self, model: str) -> None: ...

    def decide(self, need: Need, exclude: str | None = None) -> Decision: ...

    def decide_model(self, m: Model) -> Decision: ...

    def committed(self) -> tuple[int, int]: ...

    def need_for(self, m: Model) -> Need: ...

    def live_leases(self) -> list[Lease]: ...

    def write_state(self, now: float, arriving: str | None = None, how: Write = Write.BEST_EFFORT) -> bool: ...

    def dispatch(self, m: Model) -> None: ...

    def fail_waiters(self, m: Model, exc: Refused) -> None: ...

    def begin_start(self, m: Model, decision: Decision) -> None: ...

    async def stop(self, m: Model, why: str, evicted: Evicted = Evicted.RESTORE, **detail: Any) -> None: ...

    def release_lease(self, lease_id: str, why: str = "lease_release") -> Lease | None: ...
