"""A model as the gateway holds it (its supervisord state, its lifecycle, its slots and queue), and
the refusal the gateway answers a request with."""

from __future__ import annotations

import asyncio
import http.client
import xmlrpc.client
from collections import deque
from dataclasses import dataclass, field

from ...contract import (
    ModelDoc,
)
from ...policy import Held
from ..supervisor import ANSWERING, LIVE, ProcState
from .lifecycle import Lifecycle, Phase

# supervisord's states, as the parts read them
__all__ = ["ANSWERING", "CONNECT_ERRORS", "LIVE", "Model", "ProcState", "Refused"]

CONNECT_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)
SPEED_WINDOW = 20  # answers a model's tokens/s is taken over


class Refused(Exception):
    """A request the gateway answers itself: a code (which the HTTP layer maps to a status), an
    OpenAI-shaped message, and when to try again."""

    def __init__(self, message: str, code: str, retry_after: int | None = None):
        super().__init__(message)
        self.message, self.code, self.retry_after = message, code, retry_after


@dataclass
class Model:
    name: str
    plan: ModelDoc
    state: ProcState = ProcState.STOPPED  # the process, as supervisord names it
    life: Lifecycle = field(default_factory=Lifecycle)  # what the gateway does with it (lifecycle.py)
    in_flight: int = 0
    waiters: deque[tuple[float, asyncio.Future[None]]] = field(default_factory=deque)
    last_used: float = 0.0  # wall clock of the last request finished (or of becoming ready)
    drain_since: float = 0.0  # requests queued before this are still served: one batch, then out
    starting: asyncio.Task[None] | None = None
    evicted: bool = False  # stopped by the gateway: a hot one comes back when it fits
    usage: int = 0  # live bytes from the enforcer's status
    given_up: bool = False
    failure: str | None = None
    no_drain: set[str] = field(default_factory=set)  # victims whose drain timed out: not again until idle
    draining_for: list[str] = field(default_factory=list)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    cold_starts: int = 0
    last_cold_start_s: float | None = None  # how long its last start on demand took (this run)
    restarts: int = 0
    latency_ewma: float = 1.0
    health_failures: int = 0  # health probes failed in a row while ready
    saved_slots: list[int] = field(default_factory=list)  # llama-server slots saved before its eviction
    tokens_in: int = 0  # this gateway's life: what its answers said (usage.py)
    tokens_out: int = 0
    prompt_speed: float | None = None  # prompt tokens/s of its last answer that said it (a KV restore's saving)
    speed: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))

    def generated(self, tokens: int, seconds: float) -> None:
        self.speed.append((tokens, seconds))

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens out per second over its last SPEED_WINDOW answers that said their tokens (None before one)."""
        tokens, seconds = sum(t for t, _ in self.speed), sum(s for _, s in self.speed)
        return round(tokens / seconds, 1) if tokens and seconds > 0 else None

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

    @property
    def busy(self) -> bool:
        return self.in_flight > 0 or bool(self.waiters)

    def held(self) -> Held:
        return Held(
            self.name,
            self.plan.priority,
            cold=self.cold,
            ram=max(self.usage, self.plan.quota_hard_bytes),
            gpu=self.plan.gpu_quota_hard_bytes,
            busy=self.busy or self.starting is not None,
            drainable=self.ready and self.starting is None,
            last_used=self.last_used,
            evicting=self.evicting or self.draining,
            live=self.usage,
            hard=self.plan.quota_hard_bytes,
        )
