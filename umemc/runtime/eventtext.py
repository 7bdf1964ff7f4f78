"""One line of plain words for an event of the log (`umemc status`'s last event, the status page's event list):
what happened, and the one figure that says why. The event itself (kind, detail) stays the record; this is only
how it reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..units import gib


def _size(n: Any) -> str:
    return f"{gib(int(n))} GiB" if isinstance(n, int) and not isinstance(n, bool) else "?"


def _cheapest(d: dict[str, Any]) -> str:
    """Why this one among its equals: what it costs to bring back (with where that figure comes from), the rule."""
    cost = d.get("restore_s")
    if not isinstance(cost, (int, float)):
        return "the idle one gives way"
    source = "by its last start" if d.get("restore_from") == "measured" else "from its size"
    return f"bringing it back takes {cost:g} s {source}; the quicker to bring back, then the longer idle, gives way"


def _evict(d: dict[str, Any]) -> str:
    mine, theirs = d.get("priority"), d.get("for_priority")
    ranks = ""
    if isinstance(mine, int) and isinstance(theirs, int):
        ranks = f" (priority {mine} < {theirs})" if mine < theirs else f" (both priority {mine}: {_cheapest(d)})"
    if d.get("for_model"):
        why = f"to start {d['for_model']}{ranks}"
    elif d.get("for_lease"):
        holder = f" of {d['holder']}" if d.get("holder") else ""
        why = f"for lease {d['for_lease']}{holder}{ranks}"
    elif d.get("reason") == "pressure" or d.get("pressure") is not None:
        why = "for memory pressure" + (f" {d['pressure']:.0%}" if isinstance(d.get("pressure"), float) else "")
    else:
        why = ""
    by = " by the enforcer" if d.get("by") == "enforcer" else ""
    return " ".join(x for x in ("evicted", why) if x) + by


def _exit(d: dict[str, Any]) -> str:
    cause = d.get("cause") or "exited"
    status = d.get("exitstatus")
    text = "exited" if cause == "exited" else f"exited: {cause}"
    return text + (f" (status {status})" if cause == "exited" and status is not None else "")


def _kill(d: dict[str, Any]) -> str:
    if d.get("by") == "kernel":
        return f"killed by the kernel over its hard quota ({_size(d.get('hard_bytes'))})"
    return f"killed over its hard quota ({_size(d.get('usage_bytes'))} of {_size(d.get('hard_bytes'))})"


def _cold_start(d: dict[str, Any]) -> str:
    seconds = d.get("seconds")
    text = "started on demand" + (f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else "")
    evicted = d.get("evicted") or []
    return text + f", evicting {', '.join(map(str, evicted)) if evicted else 'nothing'}"


def _action(d: dict[str, Any]) -> str:
    what = {"start": "a start", "stop": "a stop (after its requests)", "evict": "an eviction"}
    evicts = d.get("evicts") or []
    return f"{what.get(str(d.get('action')), str(d.get('action')))} asked from the page or the API" + (
        f" (evicting {', '.join(map(str, evicts))})" if evicts else ""
    )


def _swapping(d: dict[str, Any]) -> str:
    if "swapped_bytes" in d:
        return f"{_size(d.get('swapped_bytes'))} of it swapped out: it will answer slowly"
    return f"the machine swaps: {_size(d.get('grown_bytes'))} more in swap since the enforcer started" + (
        f" (memory pressure {d['level']})" if d.get("level") else ""
    )


SAID: dict[str, Callable[[dict[str, Any]], str]] = {
    "up": lambda d: "stack up" + (" (rehearsal)" if d.get("simulate") else ""),
    "down": lambda d: "stack down",
    "reconcile": lambda d: "reconciled with the running stack",
    "plan_adopted": lambda d: f"the {d.get('by', '?')} took on the new plan in place ("
    + ", ".join(f"{k}: {', '.join(d[k]) or '-'}" for k in ("added", "changed", "removed") if isinstance(d.get(k), list))
    + ")",
    "enforcer_start": lambda d: "enforcer started",
    "state": lambda d: f"{d['from']} -> {d['to']}"
    + (f": {d['why']}" if d.get("why") else "")
    + (f" ({d['by']})" if d.get("by") else ""),
    "start": lambda d: "started" + (f" (pid {d['pid']})" if d.get("pid") else ""),
    "exit": _exit,
    "soft_limit": lambda d: f"over its soft quota ({_size(d.get('usage_bytes'))} of {_size(d.get('soft_bytes'))})",
    "hard_limit_kill": _kill,
    "leak_suspected": lambda d: "memory climbing steadily (a leak?)",
    "give_up": lambda d: f"left stopped: {d.get('kills', '?')} hard-quota kills in a row",
    "estimate_drift": lambda d: f"uses {d.get('over_pct', '?')}% more than its estimate",
    "evict": _evict,
    "evict_deferred": lambda d: "eviction deferred: " + str(d.get("reason") or "busy"),
    "evict_failed": lambda d: "could not be evicted: " + str(d.get("reason") or "?"),
    "cold_start": _cold_start,
    "cold_start_failed": lambda d: "cold start failed: " + str(d.get("reason") or "?"),
    "drain_timeout": lambda d: "could not start: the models in its way did not finish their requests in time",
    "ttl_unload": lambda d: (
        "unloaded: idle past the keep_alive a client asked for"
        if d.get("reason") == "keep_alive"
        else "unloaded: idle past its ttl"
    ),
    "ttl_unload_failed": lambda d: "could not be unloaded: " + str(d.get("reason") or "?"),
    "refused": lambda d: "refused a start: " + str(d.get("reason") or "?"),
    "unhealthy": lambda d: "unhealthy: " + str(d.get("reason") or "?"),
    "recovered": lambda d: "healthy again",
    "restore": lambda d: "restored: it fits again after its eviction",
    "helper_lost": lambda d: "stopped: the RPC server holding its layers on another node went away ("
    + ", ".join(d.get("endpoints") or ["?"])
    + ")",
    "helpers_back": lambda d: "started again: the RPC servers of its other nodes answer again",
    "lease_grant": lambda d: f"lease {d.get('id')} granted to {d.get('holder')} ({_size(d.get('bytes'))})",
    "lease_release": lambda d: f"lease {d.get('id')} of {d.get('holder')} released",
    "lease_expire": lambda d: f"lease {d.get('id')} of {d.get('holder')} expired",
    "event_log_reset": lambda d: "the event log was corrupt: a new one started",
    "slot_save": lambda d: f"KV of slot {d.get('slot')} saved before its eviction",
    "slot_restore": lambda d: f"KV of slot {d.get('slot')} restored: {d.get('tokens')} tokens in {d.get('ms')} ms"
    + (f", about {d['saved_s']:.1f} s of prompt reading saved" if isinstance(d.get("saved_s"), float) else ""),
    "slot_save_failed": lambda d: f"KV of slot {d.get('slot')} not saved: {d.get('reason')}",
    "slot_restore_failed": lambda d: f"KV of slot {d.get('slot')} not restored: {d.get('reason')}",
    "allowance": lambda d: f"allowance from leases now {_size(d.get('allowance_bytes'))}",
    "action": _action,
    "unload": lambda d: "stopped on request",
    "unload_failed": lambda d: "could not be stopped: " + str(d.get("reason") or "?"),
    "swapping": _swapping,
    "gpu_limit": lambda d: f"the GPU may use only {_size(d.get('limit_bytes'))} (Metal's working-set limit), the plan "
    f"counts on {_size(d.get('gpu_window_bytes'))}",
    "reaped": lambda d: f"supervisord (pid {d.get('supervisord_pid')}) died: its {len(d.get('pids') or [])} "
    "processes stopped",
    "defragment": lambda d: "restarted at a quiet moment: "
    + (
        f"its process held {_size(d.get('unused_bytes'))} beyond its buffers"
        if d.get("measure") == "beyond_buffers"
        else f"its allocator held {_size(d.get('unused_bytes'))} beyond its tensors"
    )
    + f" for {d.get('held_s')} s",
    "defragment_failed": lambda d: "could not be restarted for its fragmentation: " + str(d.get("reason") or "?"),
    "throttle": lambda d: (
        f"the box throttles ({d.get('throttling')}): at most {d.get('max_generating')} generating at once"
        if d.get("throttling")
        else "the box no longer throttles: "
        + (f"at most {d['max_generating']} generating at once" if d.get("max_generating") else "generation unlimited")
    ),
    "page_cache_released": lambda d: f"{_size(d.get('bytes'))} of model files' page cache released "
    + (
        "before its load (a CUDA allocation does not wait for the kernel to reclaim it)"
        if d.get("before") == "load"
        else "once it served (its weights are in the GPU's buffers)"
    ),
}


def said(kind: str, detail: Any) -> str:
    """The event in words; an unknown kind (a newer umemc's log) reads as its name."""
    words = SAID.get(kind)
    if words is None or not isinstance(detail, dict):
        return kind
    try:
        return words(detail)
    except (TypeError, ValueError, KeyError, AttributeError):  # a detail of another shape: its name
        return kind
