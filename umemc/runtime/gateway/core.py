"""What the scheduler's parts share: the modes of its operations (enums, never booleans), and the one protocol a
part calls back through: what the slots ask of the admission (the scheduler). The sync and the slots are given the
objects they use (the models, supervisord, the event log, the lease book) and a `kick`; the process and
housekeeping parts are still given the scheduler itself (through their protocols), which is the next split."""

from __future__ import annotations

from enum import Enum
from typing import Protocol

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


class Admission(Protocol):
    """What the slots ask of the scheduler: the decisions about starting a model are its alone."""

    @property
    def closing(self) -> bool: ...  # the gateway is shutting down: nothing more is queued

    def kick(self) -> None: ...  # a decision may be due: a request queued, a model went idle

    def refusal_now(self, m: Model) -> Refused | None: ...  # why a start could not be admitted even by evicting

    def timed_out(self, m: Model) -> Refused: ...  # what a request that waited the queue timeout is told

    def idle(self, m: Model) -> None: ...  # nothing in flight or queued any more: it may be drained again

    def choose(self, names: list[str]) -> Model: ...  # which of interchangeable models serves a shared name now
