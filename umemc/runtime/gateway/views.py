"""What the gateway says of itself (GET /umemc/status, the status page's first paint): the scheduler's parts read,
nothing written."""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

from ...contract import values
from .lease_book import lease_json

if TYPE_CHECKING:
    from .model import Model
    from .scheduler import Scheduler


def status(s: Scheduler) -> dict[str, Any]:
    ram, gpu = s.admission.committed()
    now = time.time()
    return {
        "stack": s.plan.stack,
        "rehearsal": {"scale": s.plan.scale} if s.plan.simulate else None,
        "gateway": {"pid": os.getpid(), "host": s.gw.host, "port": s.gw.port},
        "budget": {
            "budget_bytes": s.budget.ram,
            "committed_bytes": ram,
            "free_bytes": s.budget.ram - ram,
            "gpu_budget_bytes": s.budget.gpu,
            "gpu_committed_bytes": gpu,
        },
        "pressure": s.sync.pressure,
        "generation": values(s.generation.status()),
        "heat": _heat(s),
        "psi": _psi(s),
        "models": {m.name: _model(s, m, now) for m in s.models.values()},
        "groups": groups(s),
        "leases": [lease_json(x) for x in s.book.leases.values()],
    }


def _heat(s: Scheduler) -> dict[str, Any] | None:
    """The box's heat as the enforcer last read it; None where the platform reports none (or no fresh status)."""
    e = s.sync.enforcer
    if e is None or e.heat_source in (None, "none"):
        return None
    return {
        "celsius": e.heat_c,
        "sensor": e.heat_sensor,
        "watts": e.power_w,
        "throttling": e.throttling,
        "source": e.heat_source,
        "memory_busy": e.memory_busy,
        "memory_gbps": e.memory_gbps,
        "thermal_state": e.thermal_state,
    }


def _psi(s: Scheduler) -> dict[str, float] | None:
    """The kernel's memory pressure as the enforcer last read it (PSI, shares of the last 10 s); None without."""
    e = s.sync.enforcer
    if e is None or e.psi_some is None:
        return None
    return {"some": e.psi_some, "full": e.psi_full or 0.0}


def _model(s: Scheduler, m: Model, now: float) -> dict[str, Any]:
    q, traffic = s.slots[m.name], s.traffic[m.name]
    return {
        "state": m.state,
        "ready": m.ready,
        "mode": m.plan.mode,
        "priority": m.plan.priority,
        "in_flight": q.in_flight,
        "queued": q.queued,
        "max_concurrency": m.max_concurrency,
        "starting": m.starting is not None,
        "draining": m.draining,
        "usage_bytes": m.usage,
        "quota_soft_bytes": m.plan.quota_soft_bytes,
        "quota_hard_bytes": m.plan.quota_hard_bytes,
        "restarts": m.restarts,
        "cold_starts": m.cold_starts,
        "idle_s": round(now - q.last_used, 1) if m.ready else None,
        "ttl_s": m.plan.ttl_s,
        "aliases": m.plan.aliases,
        "serves": m.plan.serves,
        "failure": m.failure,
        "given_up": m.given_up,
        "unhealthy": m.unhealthy,
        "kind": m.kind,
        "status": m.status_word,
        "tokens_in": traffic.tokens_in,
        "tokens_out": traffic.tokens_out,
        "tokens_per_s": traffic.tokens_per_s,
        "keep_alive_s": keep_alive_json(m.keep_alive_s),
        "ttl_left_s": (
            round(max(0.0, limit - (now - q.last_used)), 1)
            if (limit := s.admission.idle_limit(m)) is not None and m.ready and not q.busy
            else None
        ),
        "last_cold_start_s": m.last_cold_start_s,
        "held_beyond_bytes": held_beyond(s, m),
        **_start_now(s, m),
    }


def held_beyond(s: Scheduler, m: Model) -> int | None:
    """What the running worker holds beyond what it uses, as the enforcer last saw it: a torch allocator's cache
    beyond its tensors, a llama.cpp worker's memory beyond its buffers (None: not running, or not known)."""
    live = None if s.sync.enforcer is None or not m.live else s.sync.enforcer.models.get(m.name)
    if live is None:
        return None
    return live.allocator_unused_bytes if live.allocator_unused_bytes is not None else live.beyond_buffers_bytes


def _start_now(s: Scheduler, m: Model) -> dict[str, Any]:
    """For a model that is down: whether a start would be admitted now, and whom it would evict."""
    if m.live:
        return {"fits_now": None, "would_evict": None}
    decision = s.admission.decide_model(m)
    return {"fits_now": decision.fits, "would_evict": decision.victims if decision.fits else []}


def keep_alive_json(seconds: float | None) -> float | str | None:
    """A client's keep_alive in JSON: seconds, "forever" (JSON has no infinity), or None (the stack's ttl)."""
    return "forever" if seconds is not None and math.isinf(seconds) else seconds


def groups(s: Scheduler) -> dict[str, dict[str, Any]]:
    """Each shared name (models' `serves`): the models that share it and which would answer it now."""
    choose = s.admission.choose
    return {shared: {"models": names, "answers_now": choose(names).name} for shared, names in s.slots.groups.items()}
