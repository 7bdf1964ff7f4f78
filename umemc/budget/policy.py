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
`eviction_order`: lowest priority first, then the cheapest to bring back, then least recently used, then the
stack's file order;
idle ones before busy ones, and a busy one only by draining it first. Never a higher priority for
a lower one. Pure functions: the caller owns any lock. Bottom of the package: imports nothing of umemc."""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Held:
    """One worker as the ledger sees it (every field after its priority by keyword: a row of booleans by position
    is a bug waiting to happen)."""

    name: str
    priority: int
    _: KW_ONLY
    cold: bool
    ram: int  # max(live usage, hard quota)
    gpu: int  # its GPU-side hard quota
    busy: bool  # requests in flight or queued for it
    drainable: bool  # ready and serving: it may be drained; a starting worker may not
    last_used: float
    evicting: bool = False  # already chosen by another decision: its memory is on its way back
    live: int | None = None  # measured usage, what stopping it takes off the pressure (None: ram)
    hard: int = 0  # its hard quota (ram is the larger of this and its usage); a lease may raise it
    restore_s: float | None = None  # what bringing it back would cost, in seconds (live only; None on paper)

    @classmethod
    def on_paper(cls, name: str, priority: int, ram: int, gpu: int) -> Held:
        """A hot model before anything runs: its hard quotas, idle, drainable, never used."""
        return cls(name, priority, cold=False, ram=ram, gpu=gpu, busy=False, drainable=True, last_used=0.0)

    @property
    def usage(self) -> int:
        return self.ram if self.live is None else self.live


class Lease(NamedTuple):
    id: str
    holder: str
    ram: int
    gpu: int
    priority: int
    expires: float  # wall-clock seconds
    model: str | None = None
    # the stack's worker whose allowance the lease raises (ComfyUI leasing for its own workflow): counted as
    # that worker's larger quota, not beside it; a lease for nobody (a batch job) is memory of its own
    worker: str | None = None


@dataclass(frozen=True)
class Need:
    what: str  # a model name or "lease"
    _: KW_ONLY
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
                parts.append(f"lease {b['id']} of {b['holder']} ({_bytes(b['bytes'])})")
            elif b["kind"] == "pressure":
                parts.append(
                    f"memory pressure {b['pressure']} (after any evictions) is not below load_below {b['load_below']}"
                )
            else:
                parts.append(f"{b['name']} ({b['why']})")
        free = f"{_bytes(self.free_ram)} free"
        return f"{need.what} needs {_bytes(need.ram)}, {free}; " + (
            "blocked by " + ", ".join(parts) if parts else "nothing may be evicted"
        )


def _bytes(n: int) -> str:
    """Exact bytes for scripts, GiB for people."""
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


class Budget(NamedTuple):
    ram: int
    gpu: int | None  # None: no separate GPU ledger (kind = cpu)
    # Pressure: the share of usable memory in use (the enforcer measures the conservative one of the OS's
    # view, the workers' own total and the GPU window's used share). A start is admitted only while the
    # pressure, less what its evictions free, is below load_below. usable 0: no pressure rule.
    usable: int = 0
    load_below: float = 1.0
    pressure: float | None = None  # live; None: on paper, the ledger's own total over usable


def attach(held: list[Held], leases: list[Lease]) -> tuple[list[Held], list[Lease]]:
    """Leases that raise a live worker's allowance, folded into that worker: its ledger entry becomes the larger
    of its usage and its hard quota plus those leases (the memory it will use for them is its own), and while
    they live it is busy (not evicted as idle); the other leases stay memory of their own."""
    by_worker: dict[str, list[Lease]] = {}
    for lease in leases:
        if lease.worker is not None:
            by_worker.setdefault(lease.worker, []).append(lease)
    names = {h.name for h in held}
    out = []
    for h in held:
        mine = by_worker.get(h.name)
        if mine:
            extra_ram, extra_gpu = sum(x.ram for x in mine), sum(x.gpu for x in mine)
            h = replace(
                h, ram=max(h.usage, h.hard + extra_ram), gpu=h.gpu + extra_gpu, busy=True, hard=h.hard + extra_ram
            )
        out.append(h)
    return out, [x for x in leases if x.worker is None or x.worker not in names]


def decide(need: Need, held: list[Held], leases: list[Lease], budget: Budget) -> Decision:
    held, leases = attach(held, leases)
    used_ram = sum(h.ram for h in held) + sum(lease.ram for lease in leases)
    used_gpu = sum(h.gpu for h in held) + sum(lease.gpu for lease in leases)
    free_ram = budget.ram - used_ram
    free_gpu = None if budget.gpu is None else budget.gpu - used_gpu
    short_ram = need.ram - free_ram
    short_gpu = 0 if free_gpu is None else need.gpu - free_gpu
    pressure = _pressure(budget, used_ram)
    if short_ram <= 0 and short_gpu <= 0 and pressure < budget.load_below:
        return Decision(fits=True, free_ram=free_ram, free_gpu=free_gpu)
    may, blocked = _candidates(need, held)
    evict: list[str] = []
    drain: list[str] = []
    for h in may:
        if short_ram <= 0 and short_gpu <= 0 and pressure < budget.load_below:
            break
        (drain if h.busy else evict).append(h.name)
        short_ram -= h.ram
        short_gpu -= h.gpu
        pressure -= h.usage / budget.usable if budget.usable else 0.0
    if short_ram <= 0 and short_gpu <= 0 and pressure < budget.load_below:
        return Decision(fits=True, evict=evict, drain=drain, free_ram=free_ram, free_gpu=free_gpu)
    if short_ram <= 0 and short_gpu <= 0:  # memory is there; pressure is what blocks
        blocked.insert(0, {"kind": "pressure", "pressure": round(pressure, 4), "load_below": budget.load_below})
    blocked += [
        {"kind": "lease", "id": lease.id, "holder": lease.holder, "bytes": lease.ram, "expires": lease.expires}
        for lease in leases
    ]
    return Decision(fits=False, blocked_by=blocked, free_ram=free_ram, free_gpu=free_gpu)


class OnPaper:
    """`decide` for many needs against one node's hot set on paper (nothing busy, used or being evicted;
    every holder hot, no leases): the same answer, found by bisection on the eviction order's prefix
    sums instead of a pass over every holder per need. A 1000-cold-model stack on 500 nodes asks it
    half a million times."""

    def __init__(self, held: list[Held], budget: Budget):
        assert not any(h.busy or h.evicting or h.cold or h.live is not None for h in held), "on paper only"
        self.order = eviction_order(held)
        self.prios = [h.priority for h in self.order]
        self.ram = list(itertools.accumulate((h.ram for h in self.order), initial=0))
        self.gpu = list(itertools.accumulate((h.gpu for h in self.order), initial=0))
        used = self.ram[-1]
        self.free_ram = budget.ram - used
        self.free_gpu = None if budget.gpu is None else budget.gpu - self.gpu[-1]
        self.pressure = _pressure(budget, used)
        # the pressure after stopping each prefix, with decide()'s own float arithmetic (the same order of
        # subtractions), negated so that it rises: the first prefix below load_below is a bisection
        pressures, p = [self.pressure], self.pressure
        for h in self.order:
            p -= h.usage / budget.usable if budget.usable else 0.0
            pressures.append(p)
        # the shortest prefix that brings the pressure under load_below (the same for every need)
        self.calm_from = bisect.bisect_right([-x for x in pressures], -budget.load_below)
        self.names = tuple(h.name for h in self.order)

    def decide(self, need: Need) -> tuple[bool, tuple[str, ...]]:
        """(admissible, the victims in eviction order) as decide() would say for a cold need."""
        j = self.evictions(need.ram, need.gpu, need.priority)
        return (False, ()) if j < 0 else (True, self.names[:j])

    def evictions(self, ram: int, gpu: int, priority: int) -> int:
        """How many of the eviction order a cold need of these quotas stops to start (-1: it cannot)."""
        j = self.calm_from
        if ram > self.free_ram:
            j = max(j, bisect.bisect_left(self.ram, ram - self.free_ram))
        if self.free_gpu is not None and gpu > self.free_gpu:
            j = max(j, bisect.bisect_left(self.gpu, gpu - self.free_gpu))
        # only lower priorities may make room: the j-th to go must be below the need's priority
        if j == 0:
            return 0
        return j if j <= len(self.prios) and self.prios[j - 1] < priority else -1


def _pressure(budget: Budget, used_ram: int) -> float:
    if not budget.usable:
        return 0.0
    return budget.pressure if budget.pressure is not None else used_ram / budget.usable


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
    """Who goes first: lowest priority; among equals the cheapest to bring back (restore_s: its measured start,
    else its size at an assumed read rate; the cost-benefit rule of a cache whose entries cost unequal amounts to
    reload) by `restore_class`, then least recently used; ties keep the given order (the stack's file order), so a
    plan without live figures gets a deterministic answer."""
    return sorted(held, key=lambda h: (h.priority, restore_class(h.restore_s), h.last_used))


QUICK_RESTORE_S = 2.0


def restore_class(seconds: float | None) -> int:
    """What bringing a model back costs, coarsely: every start under QUICK_RESTORE_S is 0, then one class per
    doubling (2-4 s is 1, 4-8 s 2, ...). A start a few tenths of a second longer, or a measurement's noise, is no
    reason to stop the model in use rather than one idle for an hour; a start ten times longer is."""
    if seconds is None or seconds < QUICK_RESTORE_S:
        return 0
    return int(math.log2(seconds / QUICK_RESTORE_S)) + 1


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
