"""A model's lifecycle as the gateway sees it: one explicit state machine, every transition in one
table and made through `Lifecycle.to`. supervisord's own process state (STARTING, RUNNING, …) is a
separate fact the scheduler reads; this is what the gateway does with the model.

    DOWN ──start──▶ STARTING ──healthy──▶ READY ──drain──▶ DRAINING ──drained──▶ STOPPING ──▶ DOWN
      ▲                 │                   │ ▲                 │                    ▲
      └──failed─────────┘                   │ └──recovered──────┼── UNHEALTHY ◀──────┘ (probe misses)
                                            └──evict / ttl──────┴──────────────────▶ STOPPING
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class Phase(Enum):
    DOWN = "down"  # not running, or running but not (yet) seen healthy
    STARTING = "starting"  # a start is in flight: victims draining or stopping, the process loading
    READY = "ready"  # running, healthy, taking requests
    DRAINING = "draining"  # chosen as a victim: serves the batch queued before the drain, nothing new
    UNHEALTHY = "unhealthy"  # running but not answering (a hung or stopped process): no requests
    STOPPING = "stopping"  # chosen as a victim or idle past its TTL: being stopped


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DOWN: frozenset({Phase.STARTING, Phase.READY, Phase.STOPPING}),
    Phase.STARTING: frozenset({Phase.READY, Phase.DOWN}),
    Phase.READY: frozenset({Phase.DRAINING, Phase.STOPPING, Phase.UNHEALTHY, Phase.DOWN}),
    Phase.DRAINING: frozenset({Phase.READY, Phase.STOPPING, Phase.UNHEALTHY, Phase.DOWN}),
    Phase.UNHEALTHY: frozenset({Phase.READY, Phase.STARTING, Phase.STOPPING, Phase.DOWN}),
    Phase.STOPPING: frozenset({Phase.DOWN, Phase.READY}),  # READY: the stop failed or was abandoned
}
SERVING = frozenset({Phase.READY, Phase.DRAINING})


class IllegalTransition(RuntimeError):
    """A bug: the scheduler tried a transition the table does not allow."""


Announce = Callable[[str, str, "str | None"], None]  # (from, to, why) of a change of phase


class Lifecycle:
    """`announce` hears every change of phase as it is made (the scheduler writes it to the event log as a `state`
    event): no path can move a model silently."""

    def __init__(self, announce: Announce | None = None) -> None:
        self.phase = Phase.DOWN
        self.since = time.monotonic()  # when the scheduler last moved it (a supervisord poll asked
        self.why: str | None = None  # earlier than this is older news and is ignored)
        self.announce = announce

    def to(self, phase: Phase, why: str | None = None) -> None:
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"{self.phase.value} -> {phase.value} ({why or 'no reason given'})")
        was = self.phase
        self.phase, self.why, self.since = phase, why, time.monotonic()
        if phase is not was and self.announce is not None:
            self.announce(was.value, phase.value, why)

    @property
    def serving(self) -> bool:
        return self.phase in SERVING
