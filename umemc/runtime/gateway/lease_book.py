"""The lease book: memory granted to something outside the stack (ComfyUI, a batch job). A ledger and nothing
more: the scheduler admits a lease (the same admission as a cold start), records it here, has gateway.json written
before the client hears of it, and stops what it evicts. Leases outlive a restart of the gateway (they are read back
from gateway.json), not of the stack."""

from __future__ import annotations

import secrets
import time
from typing import Any

from ...budget.policy import Lease
from ...contract import GatewayState, LeaseDoc, values

# Live leases at once: each is a ledger entry and a line of gateway.json, rewritten and synced at every grant; a
# client leasing in a loop must not grow either without bound
MAX_LEASES = 64


class LeaseBook:
    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}

    def live(self, now: float | None = None) -> list[Lease]:
        at = time.time() if now is None else now
        return [lease for lease in self.leases.values() if lease.expires > at]

    @property
    def full(self) -> bool:
        return len(self.live()) >= MAX_LEASES

    def add(
        self, holder: str, ram: int, gpu: int, priority: int, ttl: float, model: str | None, worker: str | None
    ) -> Lease:
        lease = Lease(f"l-{secrets.token_hex(6)}", holder, ram, gpu, priority, time.time() + ttl, model, worker)
        self.leases[lease.id] = lease
        return lease

    def drop(self, lease_id: str) -> Lease | None:
        return self.leases.pop(lease_id, None)

    def extend(self, lease_id: str, ttl: float) -> Lease | None:
        """A live lease held ttl seconds from now; None when it is gone or expired."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires <= time.time():
            return None
        lease = Lease(
            lease.id, lease.holder, lease.ram, lease.gpu, lease.priority, time.time() + ttl, lease.model, lease.worker
        )
        self.leases[lease.id] = lease
        return lease

    def expired(self, now: float) -> list[Lease]:
        return [x for x in self.leases.values() if x.expires <= now]

    def load(self, doc: GatewayState | None, supervisord_pid: int | None) -> None:
        """The leases of gateway.json, where it was written under this same supervisord (a restart of the gateway,
        not of the stack), that have not expired."""
        if doc is None or supervisord_pid is None or doc.supervisord_pid != supervisord_pid:
            return
        now = time.time()
        for x in doc.leases:
            if x.expires > now:
                self.leases[x.id] = x.lease()


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
    return values(lease_doc(lease))
