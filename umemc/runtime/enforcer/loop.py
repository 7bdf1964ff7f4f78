"""The enforcer's loop: it samples every worker each sample_interval (and those near their hard quota
every FAST_S in between), applies the quota rules, keeps each worker's phase, runs the pressure guard
and writes the status. supervisord's view is polled when its children change, else every 5 s."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...contract import ContractError, GatewayState, ModelDoc, read_optional, read_plan
from ...names import OWN_PROGRAMS, PLAN_FILE
from ..event_log import STOPS, EventLog
from ..probes import heat, machine
from ..probes.heat import Heat
from ..probes.host import Probes
from ..rundir import RunDir
from ..supervisor import ANSWERING, RPC_ERRORS, ProcState, Supervisor
from . import rules
from .checks import Checks
from .pressure import PressureGuard
from .sampler import OffLoop, Sampler
from .series import Series
from .status_file import StatusWriter
from .worker_state import Phase, Quota, Worker

FAST_S = 0.005  # sampling period of a worker above NEAR of its hard quota
NEAR = 0.75
OWN = OWN_PROGRAMS  # umemc's own programs (their run-dir records)
SLOW_EVERY_S = 1.0  # process trees, kernel OOM counters, leak samples, status file
ESCAPED_EVERY_S = 5.0  # without a cgroup: look for processes that left a worker's tree (by the run's mark)
POLL_EVERY_S = 5.0  # supervisord's process list, also fetched whenever supervisord's children change
HEAT_EVERY_S = 2.0  # temperatures and power (hwmon files; nvidia-smi is a process of its own)


# exits the enforcer did not see happen (the process was gone, or another in its place, at the next sample)
UNSEEN = ("restarted before it was sampled", "unknown")
SUPERVISORD_TAIL = 256 * 1024  # of its log: where a worker's last end is (a crash loop writes a line a second)


class Enforcer:
    """`host`, `supervisor` and `kill` are this machine's probes, the run's supervisord and a SIGKILL of the
    worker's tree unless given: tests give fakes of all three and drive `tick` by hand (tests/runtime/
    test_enforcer_loop.py, in milliseconds)."""

    def __init__(
        self,
        bundle: Path,
        host: Probes | None = None,
        supervisor: Supervisor | None = None,
        kill: Callable[[int, list[int]], None] | None = None,
    ):
        self.bundle = bundle
        self.plan, self.plan_digest = read_plan(bundle / PLAN_FILE)
        self.run_dir = RunDir.of_bundle(bundle)
        self.interval = float(self.plan.policy.sample_interval_s)
        self.events = EventLog(self.run_dir.events, lazy=True)  # opened as it enforces (open_log)
        self.supervisor = supervisor or Supervisor(self.run_dir.socket())
        self.kill = kill or kill_tree
        self.sampler = Sampler(self.plan, self.run_dir, host)
        self.guard = PressureGuard(self.plan, self.run_dir, self.supervisor, self.interval, self._event)
        self.status = StatusWriter(self.run_dir.status)
        window = self.plan.policy.leak_window_s
        self.workers = {n: self._worker(n, m, window) for n, m in self.plan.models.items()}
        self.box = Series(window)  # the whole machine's used memory (usable - MemAvailable)
        self.own = Series(window)  # umemc's own processes: supervisord, the enforcer, the gateway
        self.run_start = 0  # the last `up` event's id: read as it opens its log
        # the box's temperatures and power, read off the loop every HEAT_EVERY_S (nvidia-smi is a process)
        self.heat_reads: OffLoop[Heat | None] = OffLoop(
            lambda: heat.read(self.plan.platform.kind, self.sampler.host.platform), HEAT_EVERY_S, None, "heat"
        )
        self._last_slow = self._last_poll = self._last_escaped = 0.0
        self._gone = False
        self._sv_pid: int | None = None
        self._sv_children: frozenset[int] = frozenset()
        self._infos: dict[str, Any] = {}
        self._stop = False
        self._new_plan = False  # SIGHUP: the bundle's plan changed
        self.checks = Checks(self.plan, self.run_dir, self.sampler, self.supervisor, self.kill, self.events)

    def adopt(self) -> None:
        """The bundle's plan as it is now, taken on in place where only its models changed (PlanDoc.frame): an
        added model is enforced from now on, a removed one no longer, a changed one by its new quotas (what was
        measured of it stays; supervisord restarts its worker where its program changed, seen as any restart).
        A plan that changes more stops this enforcer: supervisord starts it again on the new plan (the standby
        enforces meanwhile)."""
        self._new_plan = False
        try:
            plan, digest = read_plan(self.bundle / PLAN_FILE)
        except ContractError as exc:
            print(f"umemc-enforcer: the new plan cannot be read, enforcing the one it has: {exc}", file=sys.stderr,
                  flush=True)  # fmt: skip
            return
        if digest == self.plan_digest:
            return
        if plan.frame() != self.plan.frame():
            print("umemc-enforcer: the new plan changes more than its models: restarting on it", file=sys.stderr,
                  flush=True)  # fmt: skip
            self._stop = True
            return
        old = self.plan.models
        removed = [n for n in old if n not in plan.models]
        added = [n for n in plan.models if n not in old]
        changed = [n for n in plan.models if n in old and plan.models[n] != old[n]]
        for name in removed:
            del self.workers[name]
        for name in added:
            self.workers[name] = self._worker(name, plan.models[name], plan.policy.leak_window_s)
        for name in changed:
            self.workers[name].quota = _quota(name, plan.models[name])
        self.plan = self.guard.plan = self.checks.plan = plan
        self.plan_digest = digest
        self._gone = True  # supervisord's view at the next tick: what it started and stopped for the update
        self.events.add("plan_adopted", None, by="enforcer", added=added, changed=changed, removed=removed)
        self.slow_tick(time.time())  # its status says the new plan now

    def _worker(self, name: str, m: ModelDoc, window: float) -> Worker:
        """A worker whose every change of phase is written to the event log as it is made (a `state` event)."""

        def announce(was: str, now: str, why: str | None) -> None:
            self.events.add("state", name, by="enforcer", **{"from": was, "to": now}, why=why)

        return Worker(_quota(name, m), announce=announce, history=Series(window))

    def open_log(self) -> None:
        """The event log as it is now, opened as this enforcer starts to enforce (one that waited for the lock, or
        enforced before and handed it back, may hold a log since moved aside or replaced), and what became of a
        damaged one this run (the enforcer before this one may have moved it: its status said so)."""
        self.events.close()
        self.events = self.checks.events = EventLog(self.run_dir.events)
        self.run_start = self.events.last_id("up")
        self.status.moved_before = self.events.moved_before(self.run_start)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, *, signals: bool = True, until: Callable[[], bool] | None = None) -> None:
        """Enforce until SIGTERM (`signals`: this process's handlers are the enforcer's; a thread installs none), a
        plan that changes more than its models, or `until()` says so (asked every SLOW_EVERY_S)."""
        if signals:
            signal.signal(signal.SIGTERM, self._on_term)
            signal.signal(signal.SIGHUP, self.on_hup)
        self.open_log()
        self.events.add("enforcer_start", None, pid=os.getpid(), interval_s=self.interval)
        self.count_ooms_from_now()
        next_tick = asked = time.monotonic()
        while not self._stop:
            if until is not None and time.monotonic() - asked >= SLOW_EVERY_S:
                asked = time.monotonic()
                if until():
                    break
            try:
                if self._new_plan:
                    self.adopt()
                self.tick()
            except RPC_ERRORS as exc:
                # supervisord restarting or gone, a full disk: say so and keep enforcing next tick
                print(f"umemc-enforcer: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            next_tick += self.interval
            self._fast_until(next_tick)
            if time.monotonic() > next_tick + self.interval:
                next_tick = time.monotonic()  # fell behind: skip, never burst
        self.events.close()

    def count_ooms_from_now(self) -> None:
        """The kernel's kills already counted in the workers' groups when this enforcer takes over (a restarted
        enforcer, the standby) were said by the one before it: only later ones are news."""
        for w in self.workers.values():
            self.sampler.find_oom_group(w, from_now=True)

    def _on_term(self, *_: Any) -> None:
        self._stop = True

    def on_hup(self, *_: Any) -> None:
        self._new_plan = True

    def _fast_until(self, deadline: float) -> None:
        """Between ticks, re-read only the workers close to their hard quota (a few preads)."""
        while (remaining := deadline - time.monotonic()) > 0 and not self._stop:
            near = [w for w in self.workers.values() if w.pid and w.usage >= NEAR * w.hard]
            if not near:
                time.sleep(remaining)
                return
            for w in near:
                w.cpu_side = self.sampler.cpu_side(w)
                self.checks.hard(w, time.time())
            time.sleep(min(FAST_S, max(remaining, 0)))

    def tick(self) -> None:
        """Every sample_interval: usage of each running worker (kept-open preads), quotas, pressure."""
        now = time.time()
        children = self.sampler.procs.children(self._sv_pid) if self._sv_pid else frozenset()
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
                self.sampler.attach_cgroup(w)  # the wrapper records the group a few ms after the start
            cpu = self.sampler.cpu_side(w)
            if cpu == 0 and w.cgroup is None:
                self._gone = True  # its process ended: ask supervisord at once on the next tick
                continue
            self.sampler.record(w, cpu)
            self.checks.soft(w)
            self.checks.hard(w, now)
        workers = list(self.workers.values())
        self.guard.step(now, self.sampler.pressure(workers), workers, self._infos)

    def poll(self, now: float) -> None:
        """supervisord's view (XML-RPC, a few ms): on a change of its children, else every 5 s."""
        self._last_poll, self._gone = now, False
        if self._sv_pid is None:
            self._sv_pid = int(self.supervisor.call("supervisor.getPID"))
            self._sv_children = self.sampler.procs.children(self._sv_pid)
        self._infos = self.supervisor.processes()

    def slow_tick(self, now: float) -> None:
        """Every second: the bookkeeping that needs more syscalls than a sample."""
        self._last_slow = now
        self.events.verify_due()  # a log damaged under its open connection is moved aside within VERIFY_S
        self.sampler.refresh_nvidia(now)
        self.heat_reads.poll(now)
        if now - self._last_escaped >= ESCAPED_EVERY_S:
            self._last_escaped = now
            self.sampler.find_escaped(list(self.workers.values()))
        self._allowances()
        kernel = self.plan.policy.kernel_enforcement == "auto"
        for w in self.workers.values():
            self.checks.kernel(w)  # before _track: a kernel kill ends the process it counts
            self._track(w, self._infos.get(w.name), now)
            self.checks.helpers(w)
            if w.pid:
                if w.cgroup is None and kernel:  # without kernel enforcement the wrapper places no worker
                    self.sampler.attach_cgroup(w)
                self.sampler.refresh(w, now)
                self.checks.leak(w)
                self.checks.swap(w)
                self.checks.drift(w, now)
        available = self._box_and_own(now)
        self.checks.box_swap()
        self.status.write(
            now,
            self.guard.pressure,
            list(self.workers.values()),
            self.events,
            rules.box_trends(self.box, self.own, available) | self._machine(),
        )

    def _machine(self) -> dict[str, Any]:
        """The machine's facts for the status: how it is sampled and enforced, its swap, the OS's pressure level."""
        swap, base = self.sampler.last_swap, self.checks.swap_base
        return (
            {
                "platform": self.sampler.host.platform,
                "memory_figure": self.sampler.procs.memory_figure,
                "swap_used_bytes": None if swap is None else swap.used,
                "swap_grown_bytes": None if swap is None or base is None else swap.used - base,
                "pressure_level": self.sampler.box.level(),
                "gpu_limit_bytes": self.checks.gpu_limit,
                "plan_sha256": self.plan_digest,
            }
            | self._heat()
            | self._psi()
        )

    @staticmethod
    def _psi() -> dict[str, Any]:
        """The kernel's memory pressure (PSI): one small read a status write."""
        psi = machine.psi()
        return {} if psi is None else {"psi_some": psi.some10, "psi_full": psi.full10}

    def _heat(self) -> dict[str, Any]:
        """The hottest sensor, the power draw, and why the box throttles (the stack's throttle_above counted)."""
        h = self.heat_reads.value
        if h is None:
            return {}
        hottest = h.hottest
        return {
            "heat_c": None if hottest is None else hottest.celsius,
            "heat_sensor": None if hottest is None else hottest.name,
            "power_w": h.watts,
            "throttling": h.throttling(self.plan.policy.throttle_above_c),
            "heat_source": h.source,
            "memory_busy": h.memory_busy,
            "memory_gbps": h.memory_gbps,
            "thermal_state": h.thermal_state,
        }

    def _box_and_own(self, now: float) -> int | None:
        """One sample of the machine's used memory and of umemc's own processes' (their trends go to the status
        and /metrics: a slow leak of the box or of umemc itself is seen long before it bites). MemAvailable."""
        available = self.sampler.available()
        if available is not None:
            self.box.add(now, max(0, self.sampler.usable - available))
        own = 0
        for name in OWN:  # their records alone (the run's records hold every worker's too)
            record = self.run_dir.record(name)
            if record is not None:
                own += self.sampler.procs.memory(record.pid)
        self.own.add(now, own)
        return available

    def _allowances(self) -> None:
        """Leases that name a worker raise its quotas while they live (gateway.json, written by the gateway under
        the same supervisord): the enforcer's limit and the kernel's. A lease that ends takes its allowance back;
        a worker still above its plain quota then is over it, like any other."""
        doc = read_optional(GatewayState, self.run_dir.gateway_state)
        now, extra = time.time(), {n: 0 for n in self.workers}
        if doc is not None and (self._sv_pid is None or doc.supervisord_pid == self._sv_pid):
            for lease in doc.leases:
                if lease.worker in extra and lease.expires > now:
                    extra[lease.worker] += lease.bytes
        for w in self.workers.values():
            if extra[w.name] != w.allowance:
                w.allowance = extra[w.name]
                self.sampler.apply_limits(w)  # the kernel's limit first: the event says what is in force
                self._event(w, "allowance", allowance_bytes=w.allowance, hard_bytes=w.hard)

    def pressure_victim(self, infos: dict[str, Any], busy: set[str]) -> Worker | None:
        return self.guard.victim(list(self.workers.values()), infos, busy)

    # -- a worker's process ---------------------------------------------------------------------
    def _track(self, w: Worker, info: dict[str, Any] | None, now: float) -> None:
        w.state = ProcState.of(info)
        pid = info["pid"] if info and w.state in ANSWERING and info["pid"] else None
        if pid in w.ended:
            pid = None  # killed and recorded; supervisord has not noticed yet
        if pid == w.pid:
            return
        if w.pid is not None:
            cause = w.pending_exit or rules.exit_cause(info, pid)
            if cause.get("cause") in UNSEEN and self._stopped_on_purpose(w):
                cause = {"exitstatus": None, "cause": "stopped"}  # a stop someone asked for, not a crash
            elif cause.get("cause") in (*UNSEEN, "killed by a signal"):  # supervisord's log says how it ended
                cause = rules.logged_exit(self._supervisord_log(), w.name, w.pid) or cause
            self._event(w, "exit", pid=w.pid, state=w.state, **cause, peak_bytes=w.peak)
            self.sampler.procs.prune(set())
            w.lost()
            if w.phase is not Phase.GIVEN_UP:
                w.to(Phase.DOWN, str(cause.get("cause") or "its process exited"))
        w.forget()
        if pid is None:
            return
        last = self.events.last("start", w.name, self.run_start)
        w.began(pid, now)
        # restarts: what supervisord restarted after a crash or a kill; a cold start, an eviction or an idle unload
        # is the gateway's decision, not a restart
        w.restarts = self.events.restarts(w.name, self.run_start)
        if last is not None and last.detail.get("pid") == pid:  # the enforcer restarted, not the worker
            w.started = last.ts
        else:
            self._event(w, "start", pid=pid)
        self.sampler.attach_cgroup(w)

    def _supervisord_log(self) -> str:
        """The tail of supervisord's own log (where it says how each process ended); empty where it cannot be read."""
        from ...records import read_tail

        try:
            return read_tail(self.run_dir.supervisord_logfile, SUPERVISORD_TAIL).decode(errors="replace")
        except OSError:
            return ""

    def _stopped_on_purpose(self, w: Worker) -> bool:
        """Whether the worker's process ended by a stop recorded since it started (an eviction, an unload, an idle
        unload): between two samples a stop and the next start on demand can both happen, and the exit the enforcer
        then sees is that stop, never a restart after a crash."""
        start = self.events.last("start", w.name, self.run_start)
        after = self.run_start if start is None else start.id
        return any(self.events.last(kind, w.name, after) is not None for kind in STOPS)

    def _event(self, w: Worker, kind: str, **detail: Any) -> None:
        w.last_event = kind
        self.events.add(kind, w.name, **detail)


def kill_tree(root: int, pids: list[int]) -> None:
    """SIGKILL the worker's process group (supervisord made it the group leader), then any
    descendant that left the group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _quota(name: str, m: ModelDoc) -> Quota:
    return Quota(name, m.quota_hard_bytes, m.quota_soft_bytes, m.priority, m.estimate_bytes)
