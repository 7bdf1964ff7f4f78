"""The one eviction policy: may something of `need` bytes start now, and whom would it evict?

Every path that stops a worker to make room asks this module, so they cannot disagree:
- `umemc check` (budget.admit): what a cold start would evict from the hot set, on paper;
- the gateway (cold starts, leases), on live figures;
- `umemc up` on a running stack (admission without eviction);
- the enforcer's pressure guard (`pressure_victim`).

The ledger counts, for every worker running or starting, the larger of its live usage and its hard
quota (on paper: the hard quota), plus every granted lease; what is left of the budget (RAM, and
the GPU window where the platform has one) is free. A start that does not fit may evict workers of
lower priority (and, between two cold models of equal priority, the idle one: that is a swap) in
`eviction_order`: lowest priority first, then least recently used, then the stack's file order;
idle ones before busy ones, and a busy one only by draining it first. Never a higher priority for
a lower one. Pure functions: the caller owns any lock. Bottom of the package: imports nothing of umemc."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Held:
    """One worker as the ledger sees it."""

    name: str
    priority: int
    cold: bool
    ram: int  # max(live usage, hard quota)
    gpu: int  # its GPU-side hard quota
    busy: bool  # requests in flight or queued for it
    drainable: bool  # ready and serving: it may be drained; a starting worker may not
    last_used: float
    evicting: bool = False  # already chosen by another decision: its memory is on its way back


@dataclass(frozen=True)
class Lease:
    id: str
    holder: str
    ram: int
    gpu: int
    priority: int
    expires: float  # wall-clock seconds
    model: str | None = None


@dataclass(frozen=True)
class Need:
    what: str  # a model name or "lease"
    ram: int
    gpu: int
    priority: int
    cold: bool  # a cold model may swap out an idle cold model of equal priority
    drain: bool  # may busy workers be drained (requests: yes; leases: no)


@dataclass
class Decision:
    fits: bool
    evict: list[str] = field(default_factory=list)  # idle victims, stopped at once
    drain: list[str] = field(default_factory=list)  # busy victims, stopped once their requests finish
    blocked_by: list[dict[str, Any]] = field(default_factory=list)
    free_ram: int = 0
    free_gpu: int | None = None

    @property
    def victims(self) -> list[str]:
        return self.evict + self.drain

    def reason(self, need: Need) -> str:
        if self.fits:
            return "fits"
        parts = []
        for b in self.blocked_by:
            if b["kind"] == "lease":
                parts.append(f"lease {b['id']} of {b['holder']} ({b['bytes']} bytes)")
            elif b["kind"] == "pressure":
                parts.append(f"system pressure {b['pressure']} is not below load_below {b['load_below']}")
            else:
                parts.append(f"{b['name']} ({b['why']})")
        free = f"{self.free_ram} bytes free"
        return f"{need.what} needs {need.ram} bytes, {free}; " + (
            "blocked by " + ", ".join(parts) if parts else "nothing may be evicted"
        )


@dataclass(frozen=True)
class Budget:
    ram: int
    gpu: int | None  # None: no separate GPU ledger (kind = cpu)


def decide(need: Need, held: list[Held], leases: list[Lease], budget: Budget) -> Decision:
    used_ram = sum(h.ram for h in held) + sum(lease.ram for lease in leases)
    used_gpu = sum(h.gpu for h in held) + sum(lease.gpu for lease in leases)
    free_ram = budget.ram - used_ram
    free_gpu = None if budget.gpu is None else budget.gpu - used_gpu
    short_ram = need.ram - free_ram
    short_gpu = 0 if free_gpu is None else need.gpu - free_gpu
    if short_ram <= 0 and short_gpu <= 0:
        return Decision(True, free_ram=free_ram, free_gpu=free_gpu)
    may, blocked = _candidates(need, held)
    evict: list[str] = []
    drain: list[str] = []
    for h in may:
        if short_ram <= 0 and short_gpu <= 0:
            break
        (drain if h.busy else evict).append(h.name)
        short_ram -= h.ram
        short_gpu -= h.gpu
    if short_ram <= 0 and short_gpu <= 0:
        return Decision(True, evict, drain, free_ram=free_ram, free_gpu=free_gpu)
    blocked += [
        {"kind": "lease", "id": lease.id, "holder": lease.holder, "bytes": lease.ram, "expires": lease.expires}
        for lease in leases
    ]
    return Decision(False, blocked_by=blocked, free_ram=free_ram, free_gpu=free_gpu)


def _candidates(need: Need, held: list[Held]) -> tuple[list[Held], list[dict[str, Any]]]:
    """Who may make room, in eviction order, and who may not (with why)."""
    may: list[Held] = []
    blocked: list[dict[str, Any]] = []
    for h in held:
        why = _why_not(need, h)
        if why is None:
            may.append(h)
        else:
            blocked.append({"kind": "worker", "name": h.name, "priority": h.priority, "bytes": h.ram, "why": why})
    order = eviction_order(may)
    return [h for h in order if not h.busy] + [h for h in order if h.busy], blocked


def eviction_order(held: list[Held]) -> list[Held]:
    """Who goes first: lowest priority, then least recently used; ties keep the given order (the
    stack's file order), so a plan without live figures gets a deterministic answer."""
    return sorted(held, key=lambda h: (h.priority, h.last_used))


def pressure_victim(held: list[Held]) -> Held | None:
    """The enforcer's pressure guard stops the first worker in eviction order. When that one is busy
    it waits for it (the caller defers) rather than take a higher priority: None means nobody runs."""
    order = eviction_order(held)
    return order[0] if order else None


def _why_not(need: Need, h: Held) -> str | None:
    if h.name == need.what:
        return "itself"
    if h.evicting:
        return "already being evicted"
    lower = h.priority < need.priority or (h.priority == need.priority and need.cold and h.cold)
    if not lower:
        return f"priority {h.priority} >= {need.priority}"
    if h.busy and not (need.drain and h.drainable):
        return "starting" if not h.drainable else "requests in flight"
    return None
