"""Bringing a stack up and down: stale-state cleanup, supervisord start, reconciliation, waiting
for health, and a `down` that verifies by PID that nothing of the stack survives."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import time
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import (
    CgroupRecord,
    ContractError,
    EnforcerStatus,
    GatewayState,
    ModelDoc,
    PidRecord,
    PlanDoc,
    read,
    read_optional,
)
from ..errors import RuntimeFailure
from ..policy import Held, Lease
from .cgroups import Cgroup, run_backends
from .events import EventLog
from .probes.host import alive, marked_processes, processes, start_time
from .rundir import ENFORCER, GATEWAY, SUPERVISORD, RunDir
from .supervisor import ANSWERING, FAILED, LIVE, STARTED, ProcState, Supervisor
from .wrap import run_mark

OWN = (ENFORCER, GATEWAY)  # umemc's own programs in the stack's supervisord
RPC_ERRORS = (OSError, xmlrpc.client.Error, http.client.HTTPException)


class PlanUnreadable(ContractError):
    """RUN/bundle/plan.json is missing or corrupt (exit 2); `umemc down` still stops everything."""


@dataclass
class Stack:
    run: RunDir

    @property
    def plan(self) -> PlanDoc:
        try:
            return read(PlanDoc, self.run.plan)
        except ContractError as exc:
            raise PlanUnreadable(
                f"{exc}; `umemc down --run-dir {self.run.root}` still stops everything the stack started"
            ) from None

    def name(self) -> str:
        """The stack's name for messages; a corrupt plan still leaves the run dir to name it by."""
        try:
            return self.plan.stack
        except PlanUnreadable:
            return f"in {self.run.root}"

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.run.socket())

    def state(self) -> str:
        """running | stopped. Read-only: it never removes a file (a stale socket is `clean_stale`'s).
        The socket is asked first, so a deleted pid file does not lose a running stack."""
        if self.supervisor.alive():
            return "running"
        pid = self.run.supervisord_pid()
        if pid is not None and _is_supervisord(pid):
            raise RuntimeFailure(
                f"supervisord (pid {pid}) runs but does not answer on {self.run.socket()}; "
                f"`umemc down --run-dir {self.run.root}` stops it and everything it started"
            )
        return "stopped"

    def clean_stale(self) -> bool:
        """With supervisord gone, remove its pid file and socket, and forget the records of processes that are
        gone (a dead supervisord's record would be read as the new one's before the new one rewrites it);
        True when there was a pid file or socket."""
        stale = [p for p in (self.run.pidfile, self.run.socket()) if p.exists() or p.is_symlink()]
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
        for record in self.run.records():
            if not _same_process(record):
                self.run.forget(record.name)
        return bool(stale)

    def leftovers(self) -> dict[str, list[int]]:
        """Processes of this run still alive, by name: members of the run's cgroups (found by name, so
        no record is needed), recorded pids whose start time still matches and that carry the run's mark,
        and any other process carrying the mark (a double-forked daemon where no cgroup holds it). With
        supervisord running these are its programs; without it, orphans."""
        out: dict[str, set[int]] = {}
        for group in self._groups():
            pids = [p for p in group.pids() if alive(p)]
            if pids:
                out.setdefault(group.path.name, set()).update(pids)
        for record in self.run.records():
            if _same_process(record) and self.belongs(record.pid):
                out.setdefault(record.name, set()).add(record.pid)
        seen = {p for pids in out.values() for p in pids}
        for pid, model in self._marked():
            if pid not in seen:
                out.setdefault(model or "unrecorded", set()).add(pid)
        return {name: sorted(pids) for name, pids in sorted(out.items())}

    def belongs(self, pid: int) -> bool:
        """Whether a process is of this run: it carries the run's mark (UMEMC_RUN, set by the exec wrapper and
        inherited) or sits in one of the run's own cgroups. A record copied from another run names a real
        process, with the right start time, that is not ours: it is never killed."""
        if _mark_of(pid) == self.mark:
            return True
        return any(pid in g.pids() for g in self._own_groups())

    @property
    def mark(self) -> str:
        return run_mark(self.run.state)

    def foreign_records(self) -> list[str]:
        """Records naming a live process that is not of this run (forged, or copied from another run)."""
        return [
            f"{r.name}: pid {r.pid} is not a process of this run"
            for r in self.run.records()
            if _same_process(r) and not self.belongs(r.pid)
        ]

    def _marked(self) -> list[tuple[int, str | None]]:
        """Every process carrying this run's mark, with the model it was started for (UMEMC_MODEL)."""
        return marked_processes(self.mark)

    def _own_groups(self) -> list[Cgroup]:
        return [g for b in run_backends(self.run.state) for g in b.groups()]

    def _groups(self) -> list[Cgroup]:
        """The run's cgroups: by name below umemc's own cgroup, plus any recorded elsewhere that is named
        for this run (a record pointing at another run's group is ignored)."""
        from .cgroups import group_name

        groups = {g.path: g for g in self._own_groups()}
        folder = self.run.cgroups
        ours = group_name(self.name(), self.run.state)
        with contextlib.suppress(OSError):
            for record in folder.iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    rec = CgroupRecord.parse(record.read_text())
                    if rec.path.is_dir() and ours in rec.path.parts:
                        groups.setdefault(rec.path, Cgroup(rec.version, rec.path))
        return list(groups.values())

    def sweep(self) -> tuple[list[int], dict[str, list[int]]]:
        """Kill every process of the run that is still alive, whatever supervisord's fate: all members
        of its cgroups (double-forked `setsid` children too), recorded pids of this run with their process
        groups, and every process carrying the run's mark. Then remove the cgroups, and forget only the
        records of what is gone. Returns (pids killed, what survived by name: records of those are kept)."""
        before = self.leftovers()
        deadline = time.monotonic() + 5
        # kill, look again, kill what is new (a process forked a daemon between the scan and its own death)
        while True:
            self._kill_pass()
            if not (left := self.leftovers()) or time.monotonic() >= deadline:
                break
            before = {n: sorted(set(before.get(n, [])) | set(p)) for n, p in (before | left).items()}
            time.sleep(0.05)
        for backend in run_backends(self.run.state):
            backend.remove_all()
        for group in self._groups():
            group.remove()
        left = self.leftovers()
        for record in self.run.records():
            if record.name not in left:
                self.run.forget(record.name)
        with contextlib.suppress(OSError):
            for path in self.run.cgroups.iterdir():
                if path.name not in left:
                    path.unlink()
        killed = sorted({p for pids in before.values() for p in pids})
        return killed, left

    def _kill_pass(self) -> None:
        """SIGKILL to every member of the run's cgroups, every recorded process of this run (with its process
        group) and every process carrying the run's mark."""
        for group in self._groups():
            group.kill_all()
        for record in self.run.records():
            if _same_process(record):
                if self.belongs(record.pid):
                    _kill_group(record.pid)
            elif not _exists(record.pid):
                _kill_group(record.pid)  # the leader is gone, its group may not be: a free pid is never a pgid
        for pid, _ in self._marked():
            _kill_group(pid)

    def groups_left(self) -> list[Path]:
        return [g.path for g in self._groups()]

    # -- up -------------------------------------------------------------------------------------
    def reconcile(self, plan_changed: bool) -> tuple[list[str], dict[str, str]]:
        """supervisorctl update semantics for a changed bundle; umemc's own programs restarted when the
        plan or the token they read changed (else only started if they are down or failing); then every
        hot worker that is not running is started if it fits beside what runs now, by the same admission
        the gateway uses
        and never by evicting: a hot worker the gateway evicted for a cold one stays stopped until it
        fits again. Returns (started, {held back: why})."""
        sup = self.supervisor
        added, changed, removed = sup.call("supervisor.reloadConfig")[0]
        for name in removed + changed:
            with contextlib.suppress(xmlrpc.client.Fault):  # not running
                sup.call("supervisor.stopProcessGroup", name, True)
            sup.call("supervisor.removeProcessGroup", name)
        for name in changed + added:
            sup.call("supervisor.addProcessGroup", name)  # autostart: umemc's own programs start here
        infos = sup.processes()
        for own in OWN:
            if own not in infos or own in changed + added:
                continue
            state = ProcState.of(infos[own])
            if state is ProcState.BACKOFF or (plan_changed and state in ANSWERING):
                sup.stop(own, True)  # a program failing to start retries with what it read: start it afresh
                state = ProcState.STOPPED
            if state not in ANSWERING:
                with contextlib.suppress(xmlrpc.client.Fault):  # ALREADY_STARTED: autorestart won the race
                    sup.start(own, False)
        # a hot worker added or changed by the update was started by supervisord (autostart): say so
        by_update = [n for n in changed + added if n in self.plan.models and self.plan.models[n].mode == "hot"]
        started, held_back = self._start_hot(infos)
        return by_update + [n for n in started if n not in by_update], held_back

    def _start_hot(self, infos: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, str]]:
        from ..policy import Budget, Need, decide

        plan = self.plan
        cap, models = plan.capacity, plan.models
        budget = Budget(cap.budget_bytes, cap.gpu_budget_bytes)
        live = {n for n, i in infos.items() if ProcState.of(i) in LIVE and n in models}
        usage = _live_usage(self.run.status)
        held = [_held(n, models[n], usage.get(n, 0)) for n in live]
        leases = _live_leases(self.run.gateway_state)
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
                self.supervisor.start(name)
                started.append(name)
                held.append(_held(name, m, 0))
            else:
                held_back[name] = decision.reason(need)
        return started, held_back

    def wait_gateway(self, timeout: float = 900.0) -> str | None:
        """Block until the gateway answers /umemc/health, for as long as its program is starting or running (on a
        busy machine starting a hundred workers that can be long), up to `timeout`; returns its URL (None: the stack
        has none). A gateway that failed (FATAL, EXITED, BACKOFF) fails at once."""
        gw = self.plan.gateway
        if gw is None:
            return None
        deadline = time.monotonic() + timeout
        while not healthy(gw.port, "/umemc/health"):
            info = self.supervisor.processes().get(GATEWAY, {})
            state = ProcState.of(info)
            if state in FAILED or time.monotonic() > deadline:
                why = f"is {state}" if state in FAILED else f"did not answer within {timeout:g} s"
                log = self.run.logs / f"{GATEWAY}.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                raise RuntimeFailure(
                    "\n".join(
                        [
                            f"the gateway {why}",
                            *(f"  {t}" for t in tail),
                            "the workers keep running: `umemc status`, `umemc down`",
                        ]
                    )
                )
            time.sleep(0.1)
        host = gw.host if ":" not in gw.host else f"[{gw.host}]"
        return f"http://{host}:{gw.port}/v1"

    def wait_started(self, timeout: float = 30.0, since: float | None = None, unrecorded: float = 30.0) -> None:
        """Until supervisord answers on its socket, for as long as its process lives (it may spawn a hundred
        programs first), up to `timeout`; fails at once when the process recorded for it since `since` (the
        wall-clock time it was started: an older record is a crashed run's) ended, and when no record appears
        within `unrecorded` seconds (the exec wrapper writes it before supervisord runs)."""
        start = time.monotonic()
        deadline = start + timeout
        while not self.supervisor.alive():
            record = next((r for r in self.run.records() if r.name == SUPERVISORD), None)
            if record is not None and since is not None and self.run.recorded_at(SUPERVISORD) < since:
                record = None  # not this start's
            if record is None and time.monotonic() - start > unrecorded:
                raise RuntimeFailure(f"supervisord did not start: no record of it in {self.run.pids}")
            if record is not None and not alive(record.pid):
                log = self.run.supervisord_log
                tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
                raise RuntimeFailure("\n".join(["supervisord did not start", *(f"  {t}" for t in tail)]))
            if time.monotonic() > deadline:
                raise RuntimeFailure(
                    f"supervisord did not answer on {self.run.socket()} within {timeout:g} s; "
                    f"see {self.run.supervisord_logfile}"
                )
            time.sleep(0.05)

    def wait_healthy(self, names: list[str], timeout: float, progress: Any = None) -> dict[str, float]:
        """Block until every named worker is RUNNING and healthy; returns seconds each took."""
        start = time.monotonic()
        done: dict[str, float] = {}
        seen: set[str] = set()
        models = self.plan.models
        while len(done) < len(names):
            infos = self.supervisor.processes()
            for name in names:
                if name in done:
                    continue
                state = ProcState.of(infos.get(name))
                if state in STARTED:
                    seen.add(name)
                stopped = state is ProcState.STOPPED and name in seen  # the enforcer stopped it (`umemc events`)
                failed = state in (ProcState.FATAL, ProcState.EXITED)
                if stopped or failed or (state is ProcState.BACKOFF and infos[name].get("spawnerr")):
                    raise RuntimeFailure(self._failure(name, state, infos[name]))
                if state is ProcState.RUNNING and healthy(models[name].port, models[name].health):
                    done[name] = time.monotonic() - start
                if progress is not None:
                    progress(name, state, name in done)
            if time.monotonic() - start > timeout:
                late = [n for n in names if n not in done]
                raise RuntimeFailure(
                    "\n".join(self._failure(n, ProcState.of(infos.get(n)), infos.get(n, {}), timeout) for n in late)
                )
            if len(done) < len(names):
                time.sleep(0.2)
        return done

    def _failure(self, name: str, state: str, info: dict[str, Any], timeout: float | None = None) -> str:
        why = f"did not become healthy within {timeout:g} s" if timeout else f"is {state}"
        lines = [f"worker {name} {why}" + (f" ({info['spawnerr']})" if info.get("spawnerr") else "")]
        for suffix in ("err", "out"):
            log = self.run.logs / f"{name}.{suffix}.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            if tail:
                lines.append(f"--- last lines of {log}")
                lines += [f"  {t}" for t in tail]
        lines.append("the rest of the stack keeps running: `umemc status`, `umemc down`")
        return "\n".join(lines)

    # -- down -----------------------------------------------------------------------------------
    def stop_all(self, timeout: float = 120.0) -> tuple[list[int], list[int]]:
        """Stop every program, shut supervisord down, then make sure by PID that nothing of the stack
        survives. Returns (pids that were running, pids that had to be killed)."""
        sup, tree = self.supervisor, processes()
        pids: set[int] = set()
        with contextlib.suppress(*RPC_ERRORS):
            for info in sup.processes().values():
                if info["pid"]:
                    pids.update(tree.descendants(info["pid"]))
        sv_pid = self.run.supervisord_pid()
        with contextlib.suppress(*RPC_ERRORS):  # the pid file may have been deleted: ask supervisord
            sv_pid = int(sup.call("supervisor.getPID"))
        with contextlib.suppress(*RPC_ERRORS):
            sup.call("supervisor.stopAllProcesses", True)
        with contextlib.suppress(*RPC_ERRORS):
            sup.call("supervisor.shutdown")
        deadline = time.monotonic() + timeout
        while sv_pid is not None and alive(sv_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = [p for p in sorted(pids) if alive(p)]
        for p in killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        return sorted(pids), killed

    def remove_private_socket_dir(self) -> None:
        """A deep run dir's socket lived in a private /tmp directory (RunDir.claim_socket): remove it."""
        record = self.run.socket_record
        try:
            sock = Path(record.read_text().strip())
        except OSError:
            return
        with contextlib.suppress(OSError):
            if sock.exists() or sock.is_symlink():
                sock.unlink()
            sock.parent.rmdir()
        with contextlib.suppress(OSError):
            record.unlink()

    def events(self) -> EventLog:
        return EventLog(self.run.events)


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


def healthy(port: int | None, path: str | None) -> bool:
    """The worker answers its health URL (200), or accepts connections when it has none."""
    if port is None:
        return True
    if path is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
        return False
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _same_process(record: PidRecord) -> bool:
    """The recorded pid still names the recorded process (not a later one that reused the pid)."""
    return alive(record.pid) and start_time(record.pid) == record.start


def _mark_of(pid: int) -> str | None:
    return processes().run_environ(pid).get("UMEMC_RUN")


def _exists(pid: int) -> bool:
    """Any process (a zombie too) holds the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _is_supervisord(pid: int) -> bool:
    return any("supervisord" in arg for arg in processes().cmdline(pid))
