"""The lease API: memory set aside for work outside the models (a batch job, a training run) through the same
admission as a cold start: /umemc/leases to list and ask, DELETE to release, /extend to keep one longer."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from ...budget.policy import Decision, Need
from ...chars import CONTROL
from ...units import parse_duration, parse_size
from .app_keys import SCHED
from .bodies import json_object
from .lease_book import lease_json
from .model import Refused
from .scheduler import Scheduler
from .surfaces import error


async def leases_list(request: web.Request) -> web.Response:
    return web.json_response({"leases": [lease_json(x) for x in request.app[SCHED].book.leases.values()]})


LEASE_KEYS = frozenset({"holder", "bytes", "model", "priority", "ttl", "worker"})


MAX_LEASE_TTL_S = 7 * 24 * 3600.0


MAX_LEASE_BYTES = 2**60


DEFAULT_LEASE_TTL_S = 600.0


async def lease_create(request: web.Request) -> web.Response:
    sched = request.app[SCHED]
    doc = await json_object(request)
    unknown = sorted(set(doc) - LEASE_KEYS)
    if unknown:
        raise Refused(
            f"unknown lease field(s): {', '.join(unknown)} (known: {', '.join(sorted(LEASE_KEYS))})",
            "invalid_lease",
        )
    holder = doc.get("holder")
    if not isinstance(holder, str) or not holder.strip() or len(holder) > 128 or CONTROL.search(holder):
        raise Refused('"holder" is required: who asks (e.g. "comfyui"), 1-128 printable characters', "invalid_lease")
    ttl = _seconds(doc.get("ttl", DEFAULT_LEASE_TTL_S))
    ram, gpu, priority, model = _lease_size(sched, doc)
    worker = _lease_worker(sched, doc)
    lease, decision, need = await sched.actions.grant_lease(holder, ram, gpu, priority, ttl, model, worker)
    if lease is None:
        return _lease_refused(decision, need, sched.actions.grant_at(need))
    return web.json_response({"granted": True, "lease": lease_json(lease), "evicted": decision.evict}, status=201)


def _lease_worker(sched: Scheduler, doc: dict[str, Any]) -> str | None:
    """`worker`: the worker of this stack whose allowance the lease raises (its enforcer limit and its kernel
    limit grow by the lease while it lives). A worker that is not running holds nothing: its lease is then
    memory of its own, like any other."""
    name = doc.get("worker")
    if name is None:
        return None
    m = sched.models.get(name) if isinstance(name, str) else None
    if m is None:
        raise Refused(f'"worker" must name a model of this stack (got {name!r})', "invalid_lease")
    return m.name if m.live else None


def _lease_refused(decision: Decision, need: Need, higher: tuple[int, Decision] | None) -> web.Response:
    reason = decision.reason(need)
    if higher is None:
        reason += f"; no priority would be granted now (this lease asked {need.priority})"
    else:
        at, would = higher
        evicting = f", evicting {', '.join(would.victims)}" if would.victims else ""
        reason += f"; at priority {at} it would be granted{evicting} (this lease asked {need.priority})"
    return web.json_response(
        {
            "granted": False,
            "reason": reason,
            "grant_at_priority": None if higher is None else higher[0],
            "blocked_by": decision.blocked_by,
            "free_bytes": decision.free_ram,
            "error": {"message": reason, "type": "insufficient_memory", "code": "lease_refused"},
        },
        status=409,
    )


def _lease_size(sched: Scheduler, doc: dict[str, Any]) -> tuple[int, int, int, str | None]:
    if ("bytes" in doc) == ("model" in doc):
        raise Refused('give exactly one of "bytes" (e.g. "8GiB") or "model" (a model of this stack)', "invalid_lease")
    if "model" in doc:
        if not isinstance(doc["model"], str):
            raise Refused(f'"model" must be a model name (got {doc["model"]!r})', "invalid_lease")
        m = sched.slots.route(doc["model"])
        p = m.plan
        return p.quota_hard_bytes, p.gpu_quota_hard_bytes, _priority(doc, p.priority), m.name
    raw = doc["bytes"]
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise ValueError(f"not a size: {raw!r}")
        ram = raw if isinstance(raw, int) else parse_size(raw)
    except ValueError as exc:
        raise Refused(f'"bytes": {exc}', "invalid_lease") from None
    if not 0 < ram <= MAX_LEASE_BYTES:
        raise Refused(f'"bytes" must be > 0 and at most {MAX_LEASE_BYTES} (got {ram})', "invalid_lease")
    return ram, ram if sched.budget.gpu is not None else 0, _priority(doc, 50), None


def _priority(doc: dict[str, Any], default: int) -> int:
    priority = doc.get("priority", default)
    if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 100:
        raise Refused(f'"priority" must be an integer 0-100 (got {priority!r})', "invalid_lease")
    return priority


def _seconds(raw: Any) -> float:
    try:
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise ValueError(f"not a duration: {raw!r}")
        value = float(raw) if isinstance(raw, (int, float)) else parse_duration(raw)
    except ValueError as exc:
        raise Refused(f'"ttl": {exc}', "invalid_lease") from None
    if not math.isfinite(value) or not 0 < value <= MAX_LEASE_TTL_S:
        raise Refused(
            f'"ttl" must be more than 0 s and at most {MAX_LEASE_TTL_S:g} s (7 days) (got {raw!r})',
            "invalid_lease",
        )
    return value


async def lease_delete(request: web.Request) -> web.Response:
    lease = request.app[SCHED].actions.release_lease(request.match_info["id"])
    if lease is None:
        return error(404, f"no lease {request.match_info['id']!r}", "lease_not_found")
    return web.json_response({"released": lease_json(lease)})


async def lease_extend(request: web.Request) -> web.Response:
    doc = await json_object(request)
    if set(doc) - {"ttl"}:
        raise Refused(f"unknown field(s): {', '.join(sorted(set(doc) - {'ttl'}))} (known: ttl)", "invalid_lease")
    ttl = _seconds(doc.get("ttl", DEFAULT_LEASE_TTL_S))
    lease = request.app[SCHED].actions.extend_lease(request.match_info["id"], ttl)
    if lease is None:
        return error(404, f"no lease {request.match_info['id']!r} (released or expired)", "lease_not_found")
    return web.json_response({"lease": lease_json(lease)})


ROUTES = (
    web.get("/umemc/leases", leases_list),
    web.post("/umemc/leases", lease_create),
    web.delete("/umemc/leases/{id}", lease_delete),
    web.post("/umemc/leases/{id}/extend", lease_extend),
)
