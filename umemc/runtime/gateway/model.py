"""A model as the gateway holds it: its plan, its lifecycle (what the gateway does with it) and what the rest of the
stack says of it (supervisord's state, the enforcer's figures); and the refusal the gateway answers a request with.

Each field has one writer, said beside it: the scheduler (admission, starts, stops) or the sync (supervisord's and
the enforcer's view, health). The lifecycle is the one shared part: its table (lifecycle.py) says which moves are
legal, whoever makes them. A model's requests (slots, queue, drains) are the slots' (slots.Queue), its tokens the
HTTP side's (traffic.Traffic)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ...contract import ModelDoc, PeerDoc
from ..supervisor import ANSWERING, LIVE, RPC_ERRORS, ProcState
from .lifecycle import Lifecycle, Phase

# supervisord's states, as the parts read them
__all__ = ["ANSWERING", "CONNECT_ERRORS", "LIVE", "Model", "ProcState", "Refused"]

CONNECT_ERRORS = RPC_ERRORS


class Refused(Exception):
    """A request the gateway answers itself: a code (which the HTTP layer maps to a status), an
    OpenAI-shaped message, and when to try again. `private`: what the operator's event log may say beyond the
    message (a path, supervisord's spawn error), which a client never sees."""

    def __init__(self, message: str, code: str, retry_after: int | None = None, private: str | None = None):
        super().__init__(message)
        self.message, self.code, self.retry_after, self.private = message, code, retry_after, private


class Remote(Exception):
    """The model a request names runs on another node of the stack (its gateway answers it: peers.py)."""

    def __init__(self, name: str, peer: PeerDoc):
        super().__init__(name)
        self.name, self.peer = name, peer


@dataclass
class Model:
    name: str
    plan: ModelDoc
    life: Lifecycle = field(default_factory=Lifecycle)  # the scheduler and the sync, by its table
    # supervisord's and the enforcer's view: written by the sync alone (the scheduler's own answers from
    # supervisord go through StateSync.observe)
    state: ProcState = ProcState.STOPPED
    usage: int = 0  # live bytes from the enforcer's status
    given_up: bool = False
    restarts: int = 0
    health_failures: int = 0  # health probes failed in a row while ready
    # the scheduler's
    starting: asyncio.Task[None] | None = None
    evicted: bool = False  # stopped by the gateway: a hot one comes back when it fits
    failure: str | None = None
    draining_for: list[str] = field(default_factory=list)  # the victims its start waits for
    victims: list[str] = field(default_factory=list)  # what its start in flight stops to make room
    log_mark: int = 0  # its log's size when its start began (its load's steps are read after it)
    saved_slots: list[int] = field(default_factory=list)  # llama-server slots saved before its eviction
    cold_starts: int = 0
    last_cold_start_s: float | None = None  # how long its last start on demand took (this run)
    keep_alive_s: float | None = None  # a client's keep_alive (math.inf: until evicted); None: the stack's ttl

    @property
    def kind(self) -> str:
        return str(self.plan.kind)

    @property
    def status_word(self) -> str:
        """What a client of /v1/models wants to know, in one word: ready (answering), draining (its last batch,
        then out), starting, stopping, unhealthy, failed (given up, or its start failed), evicted (a hot model
        stopped to make room: back once it fits), cold (starts on the first request), stopped."""
        if self.given_up:
            return "failed"
        if self.unhealthy is not None:
            return "unhealthy"
        if self.draining:
            return "draining"
        if self.ready and self.starting is None:
            return "ready"
        if self.evicting:
            return "stopping"
        if self.starting is not None or self.state in (ProcState.STARTING, ProcState.BACKOFF):
            return "starting"
        if self.state is ProcState.FATAL or self.failure is not None and not self.live:
            return "failed"
        if self.evicted:
            return "evicted"
        return "cold" if self.cold else "stopped"

    @property
    def ready(self) -> bool:
        """Healthy and serving: READY, or DRAINING its last batch."""
        return self.life.serving

    @property
    def draining(self) -> bool:
        return self.life.phase is Phase.DRAINING

    @property
    def evicting(self) -> bool:
        return self.life.phase is Phase.STOPPING

    @property
    def unhealthy(self) -> str | None:
        return self.life.why if self.life.phase is Phase.UNHEALTHY else None

    @property
    def touched(self) -> float:
        """When the scheduler itself last moved it: older supervisord answers are older news."""
        return self.life.since

    @property
    def port(self) -> int | None:
        port: int | None = self.plan.port
        return port

    @property
    def max_concurrency(self) -> int:
        return int(self.plan.max_concurrency)

    @property
    def cold(self) -> bool:
        return bool(self.plan.mode == "cold")

    @property
    def live(self) -> bool:
        return self.state in LIVE or self.starting is not None
