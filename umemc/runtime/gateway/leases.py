"""Leases: memory granted to something outside the stack (ComfyUI, a batch job) under the same
admission as a cold start; they outlive a restart of the gateway, not of the stack."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import replace
from typing import Any

from ...contract import (
    GatewayState,
    LeaseDoc,
    read_optional,
)
from ...policy import Decision, Lease, Need
from .core import Host, Write
from .lifecycle import Phase
from .model import Refused

# Live leases at once: each is a ledger entry and a line of gateway.json, rewritten and synced at every grant; a
# client leasing in a loop must not grow either without bound
MAX_LEASES = 64


class LeaseBook:
    """Owns the leases: granted under the same admission as a cold start, on disk before the client hears
    of them, released, extended or expired."""

    def __init__(self, host: Host):
        self.host = host
        self.leases: dict[str, Lease] = {}

    def live(self) -> list[Lease]:
        now = time.time()
        return [lease for lease in self.leases.values() if lease.expires > now]

    async def grant(
        self,
        holder: str,
        ram: int,
        gpu: int,
        priority: int,
        ttl: float,
        model: str | None = None,
        worker: str | None = None,
    ) -> tuple[Lease | None, Decision, Need]:
        host = self.host
        need = Need("lease", ram=ram, gpu=gpu, priority=priority, cold=False, drain=False)
        async with host.lock:
            if len(self.live()) >= MAX_LEASES:
                raise Refused(
                    f"{MAX_LEASES} leases are live: release one first (GET /umemc/leases lists them)", "too_many_leases"
                )
            # a worker's lease raises its allowance by the lease: the same need as memory of its own
            decision = host.decide(need)
            if not decision.fits:
                return None, decision, need
            lease = Lease(f"l-{secrets.token_hex(6)}", holder, ram, gpu, priority, time.time() + ttl, model, worker)
            self.leases[lease.id] = lease
            # on disk before anyone hears of it: a gateway killed right after answering 201 finds it again
            if not host.write_state(time.time(), how=Write.DURABLE):
                del self.leases[lease.id]
                raise Refused(
                    f"the lease could not be recorded ({host.state_error}): it is not granted",
                    "state_unwritable",
                    10,
                )
            for v in decision.evict:
                host.models[v].life.to(Phase.STOPPING, f"evicted for lease {lease.id}")
        host.events.add(
            "lease_grant",
            None,
            id=lease.id,
            holder=holder,
            bytes=ram,
            ttl_s=ttl,
            evicted=decision.evict,
            for_model=model,
        )
        try:
            await asyncio.gather(
                *(
                    host.stop(host.models[v], "evict", for_lease=lease.id, holder=holder, for_priority=priority)
                    for v in decision.evict
                )
            )
        except Refused:
            self.release(lease.id, "lease_release")  # its room could not be made: it never held
            raise
        return lease, decision, need

    def granted_at(self, need: Need) -> tuple[int, Decision] | None:
        """The lowest priority above the refused one at which the same lease would be granted now (and what it
        would evict), or None where no priority would (the memory is held by leases, by busy workers or by
        pressure, none of which a priority displaces)."""
        for priority in range(need.priority + 1, 101):
            decision = self.host.decide(replace(need, priority=priority))
            if decision.fits:
                return priority, decision
        return None

    def load(self, supervisord_pid: int | None) -> None:
        """Leases outlive a restart of the gateway (they are in RUN/state/gateway.json), not a
        restart of the stack: only those written under this same supervisord come back."""
        doc = read_optional(GatewayState, self.host.run.gateway_state)
        if doc is None or supervisord_pid is None or doc.supervisord_pid != supervisord_pid:
            return
        now = time.time()
        for x in doc.leases:
            if x.expires > now:
                self.leases[x.id] = x.lease()

    def release(self, lease_id: str, why: str = "lease_release") -> Lease | None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.host.events.add(why, None, id=lease.id, holder=lease.holder, bytes=lease.ram)
            self.host.write_state(time.time(), how=Write.DURABLE)  # a released lease does not come back
            self.host.kick()
        return lease

    def expire(self, now: float) -> None:
        for lease in [x for x in self.leases.values() if x.expires <= now]:
            self.release(lease.id, "lease_expire")

    def extend(self, lease_id: str, ttl: float) -> Lease | None:
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires <= time.time():
            return None
        lease = Lease(
            lease.id, lease.holder, lease.ram, lease.gpu, lease.priority, time.time() + ttl, lease.model, lease.worker
        )
        self.leases[lease.id] = lease
        self.host.write_state(time.time(), how=Write.DURABLE)  # the client is told its new expiry: keep it
        return lease


def lease_doc(lease: Lease) -> LeaseDoc:
    return LeaseDoc(
        id=lease.id,
        holder=lease.holder,
        bytes=lease.ram,
        gpu_bytes=lease.gpu,
        priority=lease.priority,
        model=lease.model,
        expires=round(lease.expires, 3),
        expires_in_s=round(max(0.0, lease.expires - time.time()), 1),
        worker=lease.worker,
    )


def lease_json(lease: Lease) -> dict[str, Any]:
    return lease_doc(lease).model_dump(mode="json")
