"""What the scheduler's parts share: the modes of its operations (enums, never booleans), what the slots call on
(`SlotCalls`) and the record of the parts the process and housekeeping are given (`Parts`). No part is handed the
scheduler: each is given the objects it uses (the models, supervisord, the event log, the lease book, the admission's
figures) and the calls it makes (a `kick`), and tests/runtime/test_gateway_parts.py holds every part to that."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from .model import Model, Refused

if TYPE_CHECKING:
    from ...contract import GatewayDoc, PolicyDoc
    from ..event_log import EventLog
    from ..rundir import RunDir
    from ..supervisor import Supervisor
    from .admission import Admission
    from .history import Memory
    from .lease_book import LeaseBook
    from .slots import Slots
    from .sync import StateSync
    from .traffic import Traffic


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


@dataclass(frozen=True)
class SlotCalls:
    """What the slots call on when a request cannot be served at once: the decisions about starting a model are
    the scheduler's and the admission's, never the slots'."""

    closing: Callable[[], bool]  # the gateway is shutting down: nothing more is queued
    kick: Callable[[], None]  # a decision may be due: a request queued, a model went idle
    refusal_now: Callable[[Model], Refused | None]  # why a start could not be admitted even by evicting
    timed_out: Callable[[Model], Refused]  # what a request that waited the queue timeout is told
    idle: Callable[[Model], None]  # nothing in flight or queued any more: it may be drained again
    choose: Callable[[list[str]], Model]  # which of interchangeable models serves a shared name now


@dataclass(frozen=True)
class Parts:
    """The scheduler's parts as the process and housekeeping are given them, each the one owner of its state and
    shared by reference. `gw`, `policy` and `platform_kind` are the plan's frame, which never changes while the
    gateway runs (a plan that changes it restarts the gateway: PlanDoc.frame)."""

    gw: GatewayDoc
    policy: PolicyDoc
    platform_kind: str
    run: RunDir
    supervisor: Supervisor
    events: EventLog
    models: dict[str, Model]
    slots: Slots
    sync: StateSync
    book: LeaseBook
    traffic: dict[str, Traffic]
    memory: Memory
    lock: asyncio.Lock
    undrainable: set[str]  # victims whose drain timed out: not drained again until idle
    admission: Admission
    kick: Callable[[], None]
