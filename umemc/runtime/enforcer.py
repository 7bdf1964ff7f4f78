"""The enforcer: a program inside the same supervisord (restarted if it dies), reading plan.json.

Every sample_interval it reads each worker's whole process tree (kept-open statm, task children)
and its GPU-side memory (DRM fdinfo; nvidia-smi now and then), and
- soft quota crossed: event `soft_limit`, once per crossing (re-armed below 95% of it);
- hard quota crossed: SIGKILL the worker's process group at once, event `hard_limit_kill`
  (by enforcer); supervisord restarts it; after max_kills within kill_window it is left stopped;
- a kernel OOM kill in the worker's cgroup: event `hard_limit_kill` (by kernel);
- usage climbing faster than leak_threshold per minute over leak_window: `leak_suspected`;
- system pressure above evict_above: stop workers, lowest priority first, then least recently
  active, until pressure is below load_below (`evict`); the victim with requests in flight at the
  gateway is waited for (`evict_deferred`), never cut off, and no higher priority taken instead.
A worker near its hard quota is sampled every FAST_S in between, so a fast leak is caught early.

    python -m umemc.runtime.enforcer --bundle BUNDLE_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import sys
import time
import xmlrpc.client
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contract import (
    CgroupRecord,
    EnforcerStatus,
    ModelDoc,
    PlanDoc,
    WorkerReport,
    WorkerStatus,
    dump,
    read,
    read_optional,
)
from ..policy import Held, pressure_victim
from ..records import write_atomic
from .cgroups import Cgroup
from .events import EventLog
from .probes import nvidia
from .probes.drm import DrmProbe
from .probes.meminfo import MemAvailable
from .probes.proc import ProcTree, marked_processes
from .rundir import RunDir
from .supervisor import Supervisor
from .wrap import run_mark, start_time

FAST_S = 0.005  # sampling period of a worker above NEAR of its hard quota
NEAR = 0.75
SOFT_REARM = 0.95
SLOW_EVERY_S = 1.0  # process trees, kernel OOM counters, leak samples, status file
ESCAPED_EVERY_S = 5.0  # without a cgroup: look for processes that left a worker's tree (by the run's mark)
POLL_EVERY_S = 5.0  # supervisord's process list, also fetched whenever supervisord's children change
NVIDIA_EVERY_S = 2.0
LEAK_MIN_R2 = 0.8
DRIFT = 0.05  # more than 5% over the estimate once settled: estimate_drift
DRIFT_SETTLE_S = 5.0  # after supervisord calls it RUNNING (itself 5 s after the start)
GATEWAY_TIMEOUT_S = 5.0  # the pressure request runs in a thread: a slow gateway delays nothing else


@dataclass
class Worker:
    name: str
    hard: int
    soft: int
    priority: int
    pid: int | None = None
    pids: list[int] = field(default_factory=list)
    cpu_side: int = 0
    gpu_side: int = 0
    peak: int = 0
    started: float = 0.0
    restarts: int = -1
    soft_over: bool = False
    kills: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    cgroup: Cgroup | None = None
    oom_seen: int = 0
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=3600))
    leak_reported: bool = False
    last_active: float = 0.0
    last_cpu: int = -1
    state: str = "UNKNOWN"
    last_event: str | None = None
    given_up: bool = False
    estimate: int = 0
    drift: float | None = None  # measured / estimate - 1, once reported
    running_since: float | None = None
    reserved: int = 0  # what the worker's own ledger (umemc.worker) reports
    oom_pending: bool = False
    ended: deque[int] = field(default_factory=lambda: deque(maxlen=8))  # pids killed and recorded as exited
    escaped: list[tuple[int, int]] = field(default_factory=list)  # (pid, start) of processes that left its tree

    @property
    def usage(self) -> int:
        return self.cpu_side + self.gpu_side


class Enforcer:
    def __init__(self, bundle: Path, proc: str = "/proc"):
        self.bundle = bundle
        self.plan = read(PlanDoc, bundle / "plan.json")
        self.run_dir = RunDir.of_bundle(bundle)
        pol = self.plan.policy
        self.interval = float(pol.sample_interval_s)
        self.events = EventLog(self.run_dir.events)
        self.supervisor = Supervisor(self.run_dir.socket())
        self.proc = ProcTree(proc)
        self.drm = DrmProbe(proc)
        self.kind = self.plan.platform.kind
        self.usable = int(self.plan.capacity.usable_bytes)
        self.workers = {
            n: Worker(n, m.quota_hard_bytes, m.quota_soft_bytes, m.priority, estimate=m.estimate_bytes)
            for n, m in self.plan.models.items()
        }
        self.run_start = self.events.last_id("up")
        self.evicting = False
        self._asker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ask-gateway")
        self._gateway_answer: Future[dict[str, Any]] | None = None
        self._gateway_error: str | None = None
        self.evict_wait_until = 0.0
        self.pressure = 0.0
        self._last_slow = self._last_poll = self._last_escaped = 0.0
        self._mark = run_mark(self.run_dir.state)
        self._gone = False
        self._sv_pid: int | None = None
        self._sv_children: frozenset[int] = frozenset()
        self._infos: dict[str, Any] = {}
        self._meminfo = MemAvailable()
        self._nvidia: dict[int, int] = {}
        self._last_nvidia = 0.0
        self._stop = False
        self._status_error: str | None = None

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        self.events.add("enforcer_start", None, pid=os.getpid(), interval_s=self.interval)
        next_tick = time.monotonic()
        while not self._stop:
            try:
                self.tick()
            except (OSError, xmlrpc.client.Error, http.client.HTTPException) as exc:
                # supervisord restarting or gone, a full disk: say so and keep enforcing next tick
                print(f"umemc-enforcer: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            next_tick += self.interval
            self._fast_until(next_tick)
            if time.monotonic() > next_tick + self.interval:
                next_tick = time.monotonic()  # fell behind: skip, never burst
        self.events.close()

    def _on_term(self, *_: Any) -> None:
        self._stop = True

    def _fast_until(self, deadline: float) -> None:
        """Between ticks, re-read only the workers close to their hard quota (a few preads)."""
        while (remaining := deadline - time.monotonic()) > 0 and not self._stop:
            near = [w for w in self.workers.values() if w.pid and w.usage >= NEAR * w.hard]
            if not near:
                time.sleep(remaining)
                return
            for w in near:
                w.cpu_side = self._cpu_side(w)
                self._check_hard(w, time.time())
            time.sleep(min(FAST_S, max(remaining, 0)))

    def tick(self) -> None:
        """Every sample_interval: usage of each running worker (kept-open preads), quotas, pressure."""
        now = time.time()
        children = self.proc.children(self._sv_pid) if self._sv_pid else frozenset()
        if self._gone or children != self._sv_children or now - self._last_poll >= POLL_EVERY_S:
            self._sv_children = children  # supervisord started or lost a process: look now
            self.poll(now)
            self.slow_tick(now)
        elif now - self._last_slow >= SLOW_EVERY_S:
            self.slow_tick(now)
        kernel = self.plan.policy.kernel_enforcement == "auto"
        for w in self.workers.values():
            if not w.pid:
                continue
            if kernel and w.cgroup is None:
                self._attach_cgroup(w)  # the wrapper records the group a few ms after the start
            cpu = self._cpu_side(w)
            if cpu == 0 and w.cgroup is None:
                self._gone = True  # its process ended: ask supervisord at once on the next tick
                continue
            w.cpu_side, w.gpu_side = cpu, self._gpu(w.pids)
            w.peak = max(w.peak, w.usage)
            self._check_soft(w)
            self._check_hard(w, now)
        self._pressure_guard(now, self._infos)

    def poll(self, now: float) -> None:
        """supervisord's view (XML-RPC, a few ms): on a change of its children, else every 5 s."""
        self._last_poll, self._gone = now, False
        if self._sv_pid is None:
            self._sv_pid = int(self.supervisor.call("supervisor.getPID"))
            self._sv_children = self.proc.children(self._sv_pid)
        self._infos = self.supervisor.processes()

    def slow_tick(self, now: float) -> None:
        """Every second: the bookkeeping that needs more syscalls than a sample."""
        self._last_slow = now
        self._refresh_nvidia(now)
        if now - self._last_escaped >= ESCAPED_EVERY_S:
            self._find_escaped(now)
        for w in self.workers.values():
            self._check_kernel(w)  # before _track: a kernel kill ends the process it counts
            self._track(w, self._infos.get(w.name), now)
            if w.pid:
                if w.cgroup is None:
                    self._attach_cgroup(w)
                self._refresh(w, now)
                self._check_leak(w, now)
                self._check_drift(w, now)
        self.write_status(now)

    # -- per worker -----------------------------------------------------------------------------
    def _track(self, w: Worker, info: dict[str, Any] | None, now: float) -> None:
        w.state = info["statename"] if info else "UNKNOWN"
        pid = info["pid"] if info and info["statename"] in ("RUNNING", "STARTING") and info["pid"] else None
        if pid in w.ended:
            pid = None  # killed and recorded; supervisord has not noticed yet
        if pid == w.pid:
            return
        if w.pid is not None:
            cause = exit_cause(info, pid)
            if w.oom_pending:
                cause = {"exitstatus": None, "signal": "SIGKILL", "cause": "hard quota (kernel, cgroup OOM)"}
            self._event(w, "exit", pid=w.pid, state=w.state, **cause, peak_bytes=w.peak)
            w.oom_pending = False
            self.proc.prune(set())
        w.pid, w.pids, w.cpu_side, w.gpu_side, w.peak = pid, [], 0, 0, 0
        w.samples.clear()
        w.soft_over = w.leak_reported = False
        w.drift, w.running_since = None, None
        if pid is not None:
            w.started = now
            starts = self.events.count("start", w.name, self.run_start)
            last = self.events.last("start", w.name, self.run_start)
            if last is not None and last.detail.get("pid") == pid:  # the enforcer restarted, not the worker
                w.restarts, w.started = starts - 1, last.ts
            else:
                w.restarts = starts
                w.given_up = False
                self._event(w, "start", pid=pid)
            w.cgroup = None
            self._attach_cgroup(w)

    def _attach_cgroup(self, w: Worker) -> None:
        """The exec wrapper records `version path pid` once it has placed the worker; until then
        (a few ms after start) the worker is sampled by RSS."""
        try:
            rec = CgroupRecord.parse((self.run_dir.cgroups / w.name).read_text())
        except (OSError, ValueError):
            return
        if rec.pid == w.pid:
            w.cgroup = Cgroup(rec.version, rec.path)
            w.oom_seen = w.cgroup.oom_kills()

    def _refresh(self, w: Worker, now: float) -> None:
        """The worker's process tree (with what escaped it), its GPU descriptors, activity, and a 1 Hz usage
        sample."""
        assert w.pid is not None
        w.pids = self.proc.descendants(w.pid)
        w.escaped = [(p, t) for p, t in w.escaped if p not in w.pids and start_time(p) == t]
        w.pids += [p for p, _ in w.escaped]
        if self.kind == "amd-apu":
            self.drm.refresh(w.pids)
        w.cpu_side, w.gpu_side = self._cpu_side(w), self._gpu(w.pids)
        w.peak = max(w.peak, w.usage)
        w.samples.append((now, w.usage))
        cpu = self.proc.cpu_ticks(w.pid)
        if cpu != w.last_cpu:
            w.last_cpu, w.last_active = cpu, now
        w.reserved = self._reserved(w)

    def _find_escaped(self, now: float) -> None:
        """A worker without a cgroup of its own can leave its tree (fork, setsid, fork): its processes still
        carry the run's mark and their model's name (set by the exec wrapper, inherited), so they are found
        and counted against its quota, and killed with it."""
        self._last_escaped = now
        untracked = [w for w in self.workers.values() if w.pid and w.cgroup is None]
        if not untracked:
            return
        by_model = {w.name: w for w in untracked}
        for pid, model in marked_processes(self._mark):
            w = by_model.get(model or "")
            if w is not None and pid not in w.pids and pid != w.pid:
                w.escaped.append((pid, start_time(pid)))

    def _reserved(self, w: Worker) -> int:
        doc = read_optional(WorkerReport, self.run_dir.worker_report(w.name))
        return doc.reserved_bytes if doc is not None and doc.pid == w.pid else 0

    def _cpu_side(self, w: Worker) -> int:
        """In its own cgroup, a worker's CPU-side memory is what the kernel charges and limits there
        (RSS would also count shared library pages charged elsewhere); otherwise the tree's RSS."""
        if w.cgroup is not None:
            return w.cgroup.usage()
        return sum(self.proc.rss(p) for p in w.pids)

    def _gpu(self, pids: list[int]) -> int:
        """GPU-side bytes not already in RSS: DRM GTT/VRAM (AMD, Intel), NVIDIA per-process memory."""
        if self.kind == "amd-apu":
            return self.drm.gpu_bytes(pids)
        if self.kind in ("nvidia-discrete", "nvidia-unified") and self._nvidia:
            return sum(self._nvidia.get(p, 0) for p in pids) if self.kind == "nvidia-discrete" else 0
        return 0

    def _refresh_nvidia(self, now: float) -> None:
        if self.kind == "nvidia-discrete" and now - self._last_nvidia >= NVIDIA_EVERY_S:
            self._nvidia, self._last_nvidia = nvidia.query(), now

    def _check_soft(self, w: Worker) -> None:
        if not w.soft_over and w.usage > w.soft:
            w.soft_over = True
            self._event(w, "soft_limit", usage_bytes=w.usage, soft_bytes=w.soft, pid=w.pid)
        elif w.soft_over and w.usage < SOFT_REARM * w.soft:
            w.soft_over = False

    def _check_hard(self, w: Worker, now: float) -> None:
        if w.pid is None or w.usage <= w.hard:
            return
        pid, usage = w.pid, w.usage
        kill_tree(pid, w.pids)
        w.kills.append(now)
        self._event(
            w,
            "hard_limit_kill",
            by="enforcer",
            pid=pid,
            usage_bytes=usage,
            hard_bytes=w.hard,
            cpu_bytes=w.cpu_side,
            gpu_bytes=w.gpu_side,
        )
        # the kill is its exit: recorded as one (the next poll must not report an exit status for it)
        self._event(
            w,
            "exit",
            pid=pid,
            state="KILLED",
            exitstatus=None,
            signal="SIGKILL",
            cause="hard quota (enforcer)",
            peak_bytes=max(w.peak, usage),
        )
        w.ended.append(pid)
        w.pid, w.pids, w.cpu_side, w.gpu_side = None, [], 0, 0
        self._maybe_give_up(w, now)

    def _check_kernel(self, w: Worker) -> None:
        if w.cgroup is None or w.pid is None:
            return
        kills = w.cgroup.oom_kills()
        if kills > w.oom_seen:
            now = time.time()
            for _ in range(kills - w.oom_seen):
                w.kills.append(now)
            self._event(
                w,
                "hard_limit_kill",
                by="kernel",
                pid=w.pid,
                oom_kills=kills - w.oom_seen,
                hard_bytes=w.hard,
                cgroup=str(w.cgroup.path),
            )
            w.oom_seen = kills
            w.oom_pending = True  # its exit, when seen, was this kill (v1 may have killed a child only)
            self._maybe_give_up(w, now)

    def _maybe_give_up(self, w: Worker, now: float) -> None:
        pol = self.plan.policy
        recent = [t for t in w.kills if now - t <= pol.kill_window_s]
        if len(recent) < pol.max_kills or w.given_up:
            return
        w.given_up = True
        failed = self.supervisor.try_stop(w.name, False)
        self._event(
            w,
            "give_up",
            reason=f"{len(recent)} hard-limit kills within {pol.kill_window_s:g} s: left stopped",
            kills=len(recent),
            **({"stop": failed} if failed else {}),
        )

    def _check_leak(self, w: Worker, now: float) -> None:
        window = float(self.plan.policy.leak_window_s)
        if w.leak_reported or len(w.samples) < 3 or w.samples[-1][0] - w.samples[0][0] < window:
            return
        while w.samples and w.samples[-1][0] - w.samples[0][0] > window:
            w.samples.popleft()
        slope, r2 = _trend(list(w.samples))
        per_min = slope * 60
        if per_min > self.plan.policy.leak_threshold_bytes and r2 >= LEAK_MIN_R2:
            w.leak_reported = True
            left = (w.hard - w.usage) / slope if slope > 0 else None
            self._event(
                w,
                "leak_suspected",
                bytes_per_min=int(per_min),
                window_s=window,
                usage_bytes=w.usage,
                hard_bytes=w.hard,
                seconds_to_hard=None if left is None else round(left, 1),
            )

    def _check_drift(self, w: Worker, now: float) -> None:
        """Once a worker has settled, compare what it holds (and, for llama.cpp, what its own log
        says it allocated) with the plan's estimate: more than 5% over is `estimate_drift`."""
        if w.state != "RUNNING":
            return
        if w.running_since is None:
            w.running_since = now
        if w.drift is not None or now - w.running_since < DRIFT_SETTLE_S or not w.estimate:
            return
        m = self.plan.models[w.name]
        detail: dict[str, Any] = {}
        if m.reports_buffers:
            detail = self._llama_log_drift(w.name, m)
        over = w.usage / w.estimate - 1
        if detail or over > DRIFT:
            w.drift = max(over, detail.get("buffers_over", -1.0))
            self._event(
                w,
                "estimate_drift",
                measured_bytes=w.usage,
                estimate_bytes=w.estimate,
                over_pct=round(over * 100, 1),
                source=m.estimate_source,
                **detail,
            )
        else:
            w.drift = over  # within 5%: checked, nothing to report

    def _llama_log_drift(self, name: str, m: ModelDoc) -> dict[str, Any]:
        from ..calibration import parse_buffers, totals

        text = ""
        for suffix in ("err", "out"):
            log = self.run_dir.log(name, suffix)
            with contextlib.suppress(OSError), log.open("rb") as f:
                f.seek(max(0, log.stat().st_size - 512 * 1024))
                text += f.read().decode(errors="replace")
        t = totals(parse_buffers(text))
        reported = t["model"] + t["kv"] + t["compute"] + t["output"]
        parts = m.estimate_parts
        planned = parts.weights_bytes + parts.kv_bytes + parts.compute_bytes
        if not reported or not planned or reported <= (1 + DRIFT) * planned:
            return {}
        return {
            "buffers_bytes": reported,
            "buffers_planned_bytes": planned,
            "buffers_over": round(reported / planned - 1, 4),
            "buffers": t,
        }

    # -- pressure -------------------------------------------------------------------------------
    def measure_pressure(self) -> float:
        """The conservative one of: 1 - MemAvailable/usable (the OS's view), the workers' own total
        against usable, and the GPU window's used share where the driver tells it."""
        available = self._meminfo.read()
        workers = sum(w.usage for w in self.workers.values() if w.pid)
        gtt = gtt_used_share() if self.kind == "amd-apu" else 0.0
        return max(1 - (available if available is not None else self.usable) / self.usable, workers / self.usable, gtt)

    def _pressure_guard(self, now: float, infos: dict[str, Any]) -> None:
        pol = self.plan.policy
        self.pressure = self.measure_pressure()
        if self.pressure > pol.evict_above:
            self.evicting = True
        elif self.pressure < pol.load_below:
            self.evicting = False
        if not self.evicting or now < self.evict_wait_until:
            return
        if self.plan.gateway is not None and self._ask_gateway(now):
            return  # the gateway owns evictions while it answers
        # no gateway, or it does not answer: the enforcer decides alone (nothing is in flight through a
        # gateway that is down), by the same policy
        victim = self.pressure_victim(infos, set())
        if victim is None:
            return
        failed = self.supervisor.try_stop(victim.name, False)
        if failed is not None and failed != "not running":
            self._event(victim, "evict_failed", pressure=round(self.pressure, 4), reason=failed)
            self.evict_wait_until = now + max(1.0, 5 * self.interval)
            return
        self._event(
            victim,
            "evict",
            by="enforcer",
            reason="pressure",
            pressure=round(self.pressure, 4),
            usage_bytes=victim.usage,
            priority=victim.priority,
            evict_above=pol.evict_above,
            load_below=pol.load_below,
        )
        self.evict_wait_until = now + max(1.0, 5 * self.interval)  # let the memory come back first

    def _ask_gateway(self, now: float) -> bool:
        """Ask the gateway to relieve the pressure (POST /umemc/pressure): it owns every eviction while
        it runs, since it alone knows who has requests in flight. The request runs in a thread, so a
        slow gateway never delays a hard-quota kill; its answer is read on a later tick. False when
        the gateway did not answer (the caller decides alone)."""
        asking = self._gateway_answer
        if asking is not None and not asking.done():
            return True  # still asking: wait
        if asking is not None:
            self._gateway_answer = None
            try:
                answer = asking.result()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if str(exc) != self._gateway_error:
                    print(
                        f"umemc-enforcer: the gateway did not answer ({exc}); evicting alone",
                        file=sys.stderr,
                        flush=True,
                    )
                self._gateway_error = str(exc)
                return False
            self._gateway_error = None
            if answer.get("action") in ("evicting", "failed"):
                self.evict_wait_until = now + max(1.0, 5 * self.interval)  # let the memory come back first
            else:  # deferred (requests in flight) or nothing to evict: ask again shortly
                self.evict_wait_until = now + 0.5
            return True
        self._gateway_answer = self._asker.submit(self._post_pressure, round(self.pressure, 4))
        return True

    def _post_pressure(self, pressure: float) -> dict[str, Any]:
        gw = self.plan.gateway
        assert gw is not None
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(gw.host, gw.host)
        headers = {"Content-Type": "application/json"}
        if gw.token_env:
            token = self.run_dir.token_file.read_text()
            headers["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(host, gw.port, timeout=GATEWAY_TIMEOUT_S)
        try:
            conn.request("POST", "/umemc/pressure", body=json.dumps({"pressure": pressure}), headers=headers)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {body[:200]!r}")
            answer: dict[str, Any] = json.loads(body)
            return answer
        finally:
            conn.close()

    def pressure_victim(self, infos: dict[str, Any], busy: set[str]) -> Worker | None:
        """The one eviction policy's pick among the running workers (umemc.policy.pressure_victim):
        lowest priority, then least recently active, then file order."""
        running = {
            w.name: w for w in self.workers.values() if w.pid and infos.get(w.name, {}).get("statename") == "RUNNING"
        }
        held = [
            Held(
                w.name,
                w.priority,
                self.plan.models[w.name].cold,
                w.usage,
                0,
                w.name in busy,
                True,
                w.last_active,
            )
            for w in running.values()
        ]
        chosen = pressure_victim(held)
        return None if chosen is None else running[chosen.name]

    # -- output ---------------------------------------------------------------------------------
    def _event(self, w: Worker, kind: str, **detail: Any) -> None:
        w.last_event = kind
        self.events.add(kind, w.name, **detail)

    def write_status(self, now: float) -> None:
        doc = EnforcerStatus(
            time=now,
            pid=os.getpid(),
            pressure=round(self.pressure, 4),
            events_error=self.events.error,
            events_moved_to=None if self.events.moved_to is None else str(self.events.moved_to),
            models={
                w.name: WorkerStatus(
                    pid=w.pid,
                    rss_bytes=w.cpu_side,
                    gpu_bytes=w.gpu_side,
                    peak_bytes=w.peak,
                    restarts=max(0, w.restarts),
                    started=w.started if w.pid else None,
                    last_event=w.last_event,
                    given_up=w.given_up,
                    drift=None if w.drift is None else round(w.drift, 4),
                    reserved_bytes=w.reserved,
                    leak_rate_bytes_per_s=_leak_rate(w),
                )
                for w in self.workers.values()
            },
        )
        path = self.run_dir.status
        try:
            write_atomic(path, dump(doc))
        except OSError as exc:  # a full or read-only state dir: enforcement goes on, status goes stale
            if str(exc) != self._status_error:
                print(f"umemc-enforcer: cannot write {path}: {exc}", file=sys.stderr, flush=True)
            self._status_error = str(exc)
        else:
            self._status_error = None


def exit_cause(info: dict[str, Any] | None, new_pid: int | None) -> dict[str, Any]:
    """What supervisord can tell of a worker's end. Its `exitstatus` is `process.exitstatus or 0`: 0
    also when unknown, -1 for a signal, and stale once the worker was restarted; only an EXITED or
    STOPPED worker's own status is reported (null otherwise, never a made-up 0)."""
    if info is None or new_pid is not None or info.get("statename") not in ("EXITED", "STOPPED"):
        return {"exitstatus": None, "cause": "restarted before it was sampled" if new_pid else "unknown"}
    status = int(info.get("exitstatus") or 0)
    if status == -1:
        return {"exitstatus": None, "cause": "killed by a signal"}
    if info["statename"] == "STOPPED":
        return {"exitstatus": status, "cause": "stopped"}
    return {"exitstatus": status, "cause": "exited"}


def kill_tree(root: int, pids: list[int]) -> None:
    """SIGKILL the worker's process group (supervisord made it the group leader), then any
    descendant that left the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _leak_rate(w: Worker) -> float | None:
    """The worker's usage trend (bytes/s) over its last minute of 1 Hz samples, once it has 10 s of them."""
    if w.pid is None or len(w.samples) < 3:
        return None
    recent = [s for s in w.samples if s[0] >= w.samples[-1][0] - 60]
    if len(recent) < 3 or recent[-1][0] - recent[0][0] < 10:
        return None
    return round(_trend(recent)[0], 1)


def _trend(samples: list[tuple[float, int]]) -> tuple[float, float]:
    """Least-squares slope (bytes/s) and R² of usage over time."""
    n = len(samples)
    t0 = samples[0][0]
    xs = [t - t0 for t, _ in samples]
    ys = [float(u) for _, u in samples]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    if sxx == 0 or syy == 0:
        return 0.0, 0.0
    return sxy / sxx, (sxy * sxy) / (sxx * syy)


def gtt_used_share(drm_root: str = "/sys/class/drm") -> float:
    """AMD: mem_info_gtt_used / mem_info_gtt_total of the first card that has them (bytes)."""
    try:
        cards = sorted(os.listdir(drm_root))
    except OSError:
        return 0.0
    for card in cards:
        base = f"{drm_root}/{card}/device"
        try:
            used = int(Path(f"{base}/mem_info_gtt_used").read_text())
            total = int(Path(f"{base}/mem_info_gtt_total").read_text())
        except (OSError, ValueError):
            continue
        if total:
            return used / total
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-enforcer")
    p.add_argument("--bundle", required=True)
    args = p.parse_args(argv)
    Enforcer(Path(args.bundle).resolve()).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
