"""enforcer.json: what the enforcer last measured of every worker (read by `umemc status`, the gateway
and /metrics), written atomically once a second. A full or read-only state dir stops the status, never
the enforcement: the error is said once on stderr."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ...contract import EnforcerStatus, WorkerStatus, dump
from ...records import write_atomic
from ..event_log import EventLog
from .rules import leak_rate
from .worker_state import Worker


class StatusWriter:
    def __init__(self, path: Path):
        self.path = path
        self._error: str | None = None
        self.moved_before: str | None = None  # a move of the damaged log this run, made by an earlier writer

    def write(
        self, now: float, pressure: float, workers: list[Worker], events: EventLog, trends: dict[str, Any] | None = None
    ) -> None:
        doc = EnforcerStatus(
            time=now,
            pid=os.getpid(),
            pressure=round(pressure, 4),
            events_error=events.error,
            events_moved_to=str(events.moved_to) if events.moved_to is not None else self.moved_before,
            models={w.name: _worker(w) for w in workers},
            **(trends or {}),
        )
        try:
            write_atomic(self.path, dump(doc))
        except OSError as exc:
            if str(exc) != self._error:
                print(f"umemc-enforcer: cannot write {self.path}: {exc}", file=sys.stderr, flush=True)
            self._error = str(exc)
        else:
            self._error = None


def _worker(w: Worker) -> WorkerStatus:
    return WorkerStatus(
        pid=w.pid,
        rss_bytes=w.cpu_side,
        resident_bytes=w.resident,
        gpu_bytes=w.gpu_side,
        peak_bytes=w.peak,
        restarts=max(0, w.restarts),
        started=w.started if w.pid else None,
        last_event=w.last_event,
        given_up=w.given_up,
        drift=None if w.drift is None else round(w.drift, 4),
        reserved_bytes=w.reserved,
        allocator_unused_bytes=w.allocator_unused,
        beyond_buffers_bytes=w.beyond_buffers,
        leak_rate_bytes_per_s=None if w.pid is None else leak_rate(w.samples),
        allowance_bytes=w.allowance,
        swapped_bytes=w.swapped,
        gpu_visible=w.gpu_visible if w.pid else None,
        enforced_by=None if w.pid is None else ("enforcer" if w.cgroup is None else f"cgroup v{w.cgroup.version}"),
    )
