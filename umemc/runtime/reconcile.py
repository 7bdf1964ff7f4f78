"""`umemc up` on a running stack: supervisorctl update semantics for a changed bundle, then every hot worker that is
not running started if it fits beside what runs now, by the same admission the gateway uses and never by
evicting."""

from __future__ import annotations

import contextlib
import enum
import time
import xmlrpc.client
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..budget.policy import Budget, Held, Lease, Need, decide
from ..contract import ContractError, EnforcerStatus, GatewayState, ModelDoc, PlanDoc, parse, read_optional, read_plan
from ..errors import RuntimeFailure
from ..names import STANDBY
from .rundir import ENFORCER, GATEWAY
from .supervisor import ANSWERING, LIVE, WAITED_S, ProcState

if TYPE_CHECKING:
    from .control import Stack

OWN = (ENFORCER, STANDBY, GATEWAY)  # umemc's own programs in the stack's supervisord


class Change(enum.Enum):
    """What changed, for umemc's own programs, between the bundle they run and the one `up` installed."""

    NONE = "none"
    MODELS = "models"  # only the models (PlanDoc.frame): the gateway and the enforcer take the plan on in place
    ALL = "all"  # more (or the gateway's token): they are restarted on it


def what_changed(before: tuple[bytes | None, bytes | None], after: tuple[bytes | None, bytes | None]) -> Change:
    """(plan, token) bytes as they were and as they are (None: no such file)."""
    if before == after:
        return Change.NONE
    if before[1] != after[1] or before[0] is None or after[0] is None:
        return Change.ALL
    try:
        old, new = parse(PlanDoc, before[0], "plan"), parse(PlanDoc, after[0], "plan")
    except ContractError:
        return Change.ALL
    return Change.MODELS if old.frame() == new.frame() else Change.ALL


ADOPT_S = 30.0  # how long a program that answers gets to say it runs the new plan before it is restarted on it


def reconcile(stack: Stack, change: Change) -> tuple[list[str], dict[str, str]]:
    """supervisorctl update semantics for a changed bundle; umemc's own programs told of a plan that changed only
    in its models (SIGHUP: they take it on in place, keeping what the gateway serves and its figures, and what the
    enforcer measured), restarted on one that changed more or a new token (else only started if they are down or
    failing); then every hot worker that is not running is started if it fits beside what runs now, by the same
    admission the gateway uses and never by evicting: a hot worker the gateway evicted for a cold one stays
    stopped until it fits again. Returns (started, {held back: why})."""
    sup = stack.supervisor
    added, changed, removed = sup.call("supervisor.reloadConfig")[0]
    for name in removed + changed:
        with contextlib.suppress(xmlrpc.client.Fault):  # not running
            sup.call("supervisor.stopProcessGroup", name, True, timeout=WAITED_S)
        sup.call("supervisor.removeProcessGroup", name)
    for name in changed + added:
        sup.call("supervisor.addProcessGroup", name)  # autostart: umemc's own programs start here
    infos = sup.processes()
    told = []
    for own in OWN:
        if own not in infos or own in changed + added:
            continue
        state = ProcState.of(infos[own])
        if state is ProcState.BACKOFF or (change is Change.ALL and state in ANSWERING):
            # a program failing to start retries with what it read: start it afresh (one that ended since
            # supervisord answered, a loaded machine's race, is not running: nothing to stop)
            failed = sup.try_stop(own, wait=True)
            if failed not in (None, "not running"):
                raise RuntimeFailure(f"{own} could not be restarted on the new plan: {failed}")
            state = ProcState.STOPPED
        elif change is Change.MODELS and state in ANSWERING:
            with contextlib.suppress(xmlrpc.client.Fault):  # it ended meanwhile: supervisord starts it on the plan
                sup.call("supervisor.signalProcess", own, "HUP")
                told.append(own)
        if state not in ANSWERING:
            with contextlib.suppress(xmlrpc.client.Fault):  # ALREADY_STARTED: autorestart won the race
                sup.start(own, wait=False)
    if told:
        _until_adopted(stack, told)
    # a hot worker added or changed by the update was started by supervisord (autostart): say so
    by_update = [n for n in changed + added if n in stack.plan.models and stack.plan.models[n].mode == "hot"]
    started, held_back = _start_hot(stack, infos)
    return by_update + [n for n in started if n not in by_update], held_back


def _until_adopted(stack: Stack, told: list[str], timeout: float = ADOPT_S) -> None:
    """Until the gateway and the enforcer that were told of the new plan say they run it (their state files'
    plan_sha256), for as long as they answer; one that does not within `timeout` is restarted on it (the enforcer
    that enforces: its standby takes over on the new plan). The waiting enforcer (the other of the two) reads the
    plan when it takes over."""
    digest = read_plan(stack.run.plan)[1]
    parties = [
        (GatewayState, stack.run.gateway_state, [GATEWAY]),
        (EnforcerStatus, stack.run.status, [ENFORCER, STANDBY]),
    ]
    waiting = [(kind, path, programs) for kind, path, programs in parties if set(programs) & set(told)]
    deadline = time.monotonic() + timeout
    while waiting:
        infos = stack.supervisor.processes()
        for party in list(waiting):
            kind, path, programs = party
            doc: GatewayState | EnforcerStatus | None = read_optional(kind, path)  # type: ignore[arg-type]
            answering = [p for p in programs if ProcState.of(infos.get(p)) in ANSWERING]
            if (doc is not None and doc.plan_sha256 == digest) or not answering:
                waiting.remove(party)  # it runs the plan, or it is restarting on it (supervisord starts it)
            elif time.monotonic() > deadline:
                running = next((p for p in answering if doc is not None and infos[p].get("pid") == doc.pid), None)
                with contextlib.suppress(xmlrpc.client.Fault):
                    stack.supervisor.stop(running or answering[0], wait=True)
                    stack.supervisor.start(running or answering[0], wait=False)
                waiting.remove(party)
        if waiting:
            time.sleep(0.05)


def _start_hot(stack: Stack, infos: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
    plan = stack.plan
    cap, models = plan.capacity, plan.models
    budget = Budget(cap.budget_bytes, cap.gpu_budget_bytes)
    live = {n for n, i in infos.items() if ProcState.of(i) in LIVE and n in models}
    usage = _live_usage(stack.run.status)
    held = [_held(n, models[n], usage.get(n, 0)) for n in live]
    leases = _live_leases(stack.run.gateway_state)
    started: list[str] = []
    held_back: dict[str, str] = {}
    waiting = [n for n, m in models.items() if m.mode == "hot" and n not in live]
    for name in sorted(waiting, key=lambda n: -models[n].priority):  # higher priority first
        m = models[name]
        need = Need(
            name, ram=m.quota_hard_bytes, gpu=m.gpu_quota_hard_bytes, priority=m.priority, cold=False, drain=False
        )
        decision = decide(need, held, leases, budget)
        if decision.fits and not decision.victims:
            stack.supervisor.start(name)
            started.append(name)
            held.append(_held(name, m, 0))
        else:
            held_back[name] = decision.reason(need)
    return started, held_back


def _held(name: str, m: ModelDoc, usage: int) -> Held:
    """A running worker as the admission ledger sees it; never a victim here (reconcile never evicts)."""
    return Held(
        name,
        m.priority,
        cold=m.cold,
        ram=max(usage, m.quota_hard_bytes),
        gpu=m.gpu_quota_hard_bytes,
        busy=True,
        drainable=False,
        last_used=0.0,
    )


def _live_usage(path: Path) -> dict[str, int]:
    doc = read_optional(EnforcerStatus, path)
    return {} if doc is None else {n: v.rss_bytes + v.gpu_bytes for n, v in doc.models.items()}


def _live_leases(path: Path) -> list[Lease]:
    doc = read_optional(GatewayState, path)
    now = time.time()
    return [x.lease() for x in ([] if doc is None else doc.leases) if x.expires > now]
