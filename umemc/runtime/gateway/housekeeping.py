"""The gateway's half-second round (POLL_S): supervisord's and the enforcer's view refreshed, a memory sample for
the page, expired leases released, idle models unloaded (a cold model's ttl, a client's keep_alive), a worker that
stays fragmented restarted at a quiet moment, a hot worker evicted earlier restored where it fits again, the state
and the figures written. Every stop and start goes through the process (under the scheduler's lock where it
decides); this part owns only what it decides on: how long each worker has stayed fragmented."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .core import Evicted
from .model import CONNECT_ERRORS, Refused
from .sync import POLL_S

if TYPE_CHECKING:
    from ...budget.policy import Lease
    from .core import Parts
    from .process import Process

# a worker holding too much beyond its tensors or buffers (policy.restart_fragmented_above) is restarted once it has
# for this long, and only after this long without a request
FRAGMENTED_FOR_S = 300.0
QUIET_S = 60.0


class Housekeeping:
    """Given the scheduler's parts (core.Parts), the process, and the two calls it makes beyond them: a lease's
    release (actions.py: its event, the state on disk) and the page's figures kept (the scheduler's)."""

    def __init__(
        self,
        parts: Parts,
        process: Process,
        release_lease: Callable[[str, str], Lease | None],
        keep_figures: Callable[[], None],
    ):
        self.parts, self.process = parts, process
        self.release_lease, self.keep_figures = release_lease, keep_figures
        self.fragmented_since: dict[str, float] = {}  # since when a worker holds too much beyond what it uses

    async def run(self) -> None:
        """Round after round for the gateway's life; a round that fails is said and the next one comes."""
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.once()
            except CONNECT_ERRORS as exc:  # supervisord restarting or going down: next time
                print(f"umemc-gateway: {exc}", file=sys.stderr, flush=True)
            except Exception as exc:  # noqa: BLE001 - like the pump, it must outlive a bug in one round
                print(f"umemc-gateway: housekeeping: {exc!r}", file=sys.stderr, flush=True)

    async def once(self, now: float | None = None) -> None:
        s = self.parts
        await s.sync.refresh()
        now = time.time() if now is None else now
        status = s.sync.enforcer
        gpu = 0 if status is None else sum(w.gpu_bytes for w in status.models.values())
        usage = {m.name: m.usage for m in s.models.values()}
        s.memory.record(now, usage, gpu, s.sync.pressure, s.admission.committed()[0])
        for lease in s.book.expired(now):
            self.release_lease(lease.id, "lease_expire")
        await self.unload_idle(now)
        await self.restart_fragmented(now)
        await self.restore_hot()
        s.sync.write_state(now)
        self.keep_figures()

    async def unload_idle(self, now: float) -> None:
        s = self.parts
        for m in s.models.values():
            limit, q = s.admission.idle_limit(m), s.slots[m.name]
            idle = m.ready and not q.busy and m.starting is None and not m.draining
            if limit is not None and idle and now - q.last_used >= limit:
                asked = {"reason": "keep_alive"} if m.keep_alive_s is not None else {}
                with contextlib.suppress(Refused):  # recorded as ttl_unload_failed; tried again next round
                    await self.process.stop(
                        m, "ttl_unload", Evicted.STAY_DOWN, idle_s=round(now - q.last_used, 1), ttl_s=limit, **asked
                    )

    async def restart_fragmented(self, now: float) -> None:
        """A worker whose caching allocator has held more than policy.restart_fragmented_above of its hard quota
        beyond its tensors for FRAGMENTED_FOR_S (the enforcer's figure from the worker's own report; a llama.cpp
        worker: what its processes hold beyond the buffers its log states and its overhead) is restarted
        at a quiet moment: ready, nothing in flight or queued, no request for QUIET_S. Its fragmentation goes with
        its process; a hot one comes back at once (as after an eviction), a cold one at its next request."""
        s = self.parts
        share = s.policy.restart_fragmented_above
        status = s.sync.enforcer
        if share is None or status is None:
            return
        for m in s.models.values():
            live = status.models.get(m.name)
            measure = "allocator" if live is None or live.allocator_unused_bytes is not None else "beyond_buffers"
            unused = None if live is None or not m.live else live.allocator_unused_bytes
            if unused is None and live is not None and m.live:
                unused = live.beyond_buffers_bytes  # llama.cpp: its heap's drift above its buffers
            if unused is None or unused <= share * m.plan.quota_hard_bytes:
                self.fragmented_since.pop(m.name, None)
                continue
            since = self.fragmented_since.setdefault(m.name, now)
            q = s.slots[m.name]
            quiet = m.ready and not q.busy and m.starting is None and not m.draining and now - q.last_used >= QUIET_S
            if now - since < FRAGMENTED_FOR_S or not quiet:
                continue
            del self.fragmented_since[m.name]
            detail = {"unused_bytes": unused, "hard_bytes": m.plan.quota_hard_bytes, "held_s": round(now - since),
                      "measure": measure}  # fmt: skip
            with contextlib.suppress(Refused):  # said in defragment_failed; tried again once it holds as long
                # a hot one is restored at the next round, where it fits
                await self.process.stop(
                    m, "defragment", Evicted.RESTORE if m.plan.mode == "hot" else Evicted.STAY_DOWN, **detail
                )

    async def restore_hot(self) -> None:
        """A hot worker the gateway evicted comes back once it fits without evicting anything."""
        s = self.parts
        for m in s.models.values():
            if m.plan.mode != "hot" or not m.evicted or m.live or s.slots[m.name].waiters or m.given_up:
                continue
            async with s.lock:
                decision = s.admission.decide_model(m)
                if not decision.fits or decision.victims:
                    continue
                self.process.begin_start(m, decision)
            s.events.add("restore", m.name, reason="hot worker evicted earlier fits again")
