"""Bringing a stack up and down: stale-state cleanup, supervisord start, reconciliation, waiting
for health, and a `down` that verifies by PID that nothing of the stack survives."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import time
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RuntimeFailure
from .cgroups import Backend, Cgroup
from .events import EventLog
from .probes.proc import ProcTree
from .rundir import RunDir
from .supervisor import Supervisor

ENFORCER = "umemc-enforcer"
GATEWAY = "umemc-gateway"
OWN = (ENFORCER, GATEWAY)      # umemc's own programs in the stack's supervisord
FAILED = ("FATAL", "EXITED", "BACKOFF")


@dataclass
class Stack:
    run: RunDir

    @property
    def plan(self) -> dict[str, Any]:
        return json.loads((self.run.bundle / "plan.json").read_text())

    @property
    def supervisor(self) -> Supervisor:
        return Supervisor(self.run.socket())

    def state(self) -> str:
        """running | stale (left over by a crash: cleaned) | stopped."""
        pid = self.run.supervisord_pid()
        if pid is not None and self.supervisor.alive():
            return "running"
        if pid is not None and _is_supervisord(pid):
            raise RuntimeFailure(f"supervisord (pid {pid}) runs but does not answer on {self.run.socket()}; "
                                 f"stop it: kill {pid}")
        stale = [p for p in (self.run.pidfile, self.run.socket()) if p.exists() or p.is_symlink()]
        for p in stale:
            p.unlink()
        return "stale" if stale else "stopped"

    # -- up -------------------------------------------------------------------------------------
    def reconcile(self) -> list[str]:
        """supervisorctl update semantics for a changed bundle, then start every hot worker that
        is not running; returns what was started."""
        sup = self.supervisor
        added, changed, removed = sup.call("supervisor.reloadConfig")[0]
        for name in removed + changed:
            with contextlib.suppress(xmlrpc.client.Fault):
                sup.call("supervisor.stopProcessGroup", name, True)
            sup.call("supervisor.removeProcessGroup", name)
        for name in changed + added:
            sup.call("supervisor.addProcessGroup", name)
        started = []
        infos = sup.processes()
        for name, m in self.plan["models"].items():
            if m["mode"] == "hot" and infos.get(name, {}).get("statename") not in ("RUNNING", "STARTING"):
                sup.start(name)
                started.append(name)
        for own in OWN:
            if own in infos and infos[own]["statename"] != "RUNNING" and own not in changed + added:
                sup.start(own)
        return started

    def restart_own(self) -> None:
        """The enforcer and the gateway read plan.json when they start: restart them after a reconcile."""
        sup = self.supervisor
        infos = sup.processes()
        for own in OWN:
            if own not in infos:
                continue
            with contextlib.suppress(xmlrpc.client.Fault):   # not running
                sup.stop(own, True)
            sup.start(own, False)

    def wait_gateway(self, timeout: float = 30.0) -> str | None:
        """Block until the gateway answers /umemc/health; returns its URL (None: the stack has none)."""
        gw = self.plan.get("gateway")
        if not gw:
            return None
        deadline = time.monotonic() + timeout
        probe = {"port": gw["port"], "health": "/umemc/health"}
        while not healthy(probe):
            info = self.supervisor.processes().get(GATEWAY, {})
            if info.get("statename") in FAILED or time.monotonic() > deadline:
                why = f"is {info.get('statename')}" if info.get("statename") in FAILED else \
                    f"did not answer within {timeout:g} s"
                log = self.run.logs / f"{GATEWAY}.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                raise RuntimeFailure("\n".join([f"the gateway {why}", *(f"  {t}" for t in tail),
                                                "the workers keep running: `umemc status`, `umemc down`"]))
            time.sleep(0.1)
        host = gw["host"] if ":" not in gw["host"] else f"[{gw['host']}]"
        return f"http://{host}:{gw['port']}/v1"

    def wait_started(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.supervisor.alive():
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"supervisord did not answer on {self.run.socket()} within {timeout:g} s; "
                                     f"see {self.run.state / 'supervisord.log'}")
            time.sleep(0.1)

    def wait_healthy(self, names: list[str], timeout: float, progress: Any = None) -> dict[str, float]:
        """Block until every named worker is RUNNING and healthy; returns seconds each took."""
        start = time.monotonic()
        done: dict[str, float] = {}
        seen: set[str] = set()
        models = self.plan["models"]
        while len(done) < len(names):
            infos = self.supervisor.processes()
            for name in names:
                if name in done:
                    continue
                state = infos.get(name, {}).get("statename", "UNKNOWN")
                if state in ("STARTING", "RUNNING", "BACKOFF"):
                    seen.add(name)
                stopped = state == "STOPPED" and name in seen  # the enforcer stopped it (see `umemc events`)
                if stopped or state in ("FATAL", "EXITED") or (state == "BACKOFF" and infos[name].get("spawnerr")):
                    raise RuntimeFailure(self._failure(name, state, infos[name]))
                if state == "RUNNING" and healthy(models[name]):
                    done[name] = time.monotonic() - start
                if progress is not None:
                    progress(name, state, name in done)
            if time.monotonic() - start > timeout:
                late = [n for n in names if n not in done]
                raise RuntimeFailure("\n".join(self._failure(n, infos.get(n, {}).get("statename", "UNKNOWN"),
                                                             infos.get(n, {}), timeout) for n in late))
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
        sup, tree = self.supervisor, ProcTree()
        pids: set[int] = set()
        for info in sup.processes().values():
            if info["pid"]:
                pids.update(tree.descendants(info["pid"]))
        sv_pid = self.run.supervisord_pid()
        with contextlib.suppress(OSError, xmlrpc.client.Error, http.client.HTTPException):
            sup.call("supervisor.stopAllProcesses", True)
        with contextlib.suppress(OSError, xmlrpc.client.Error, http.client.HTTPException):
            sup.call("supervisor.shutdown")
        deadline = time.monotonic() + timeout
        while sv_pid is not None and _alive(sv_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = [p for p in sorted(pids) if _alive(p)]
        for p in killed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        tree.close()
        return sorted(pids), killed

    def remove_private_socket_dir(self) -> None:
        """A deep run dir's socket lived in a private /tmp directory (rundir.socket_override): remove it."""
        record = self.run.state / "socket"
        if not record.exists():
            return
        sock = Path(record.read_text().strip())
        with contextlib.suppress(OSError):
            if sock.exists() or sock.is_symlink():
                sock.unlink()
            sock.parent.rmdir()
        record.unlink()

    def remove_cgroups(self) -> list[Path]:
        """Remove the workers' cgroups (recorded by the exec wrapper); returns what is left."""
        left: list[Path] = []
        records = sorted((self.run.state / "cgroups").glob("*")) if (self.run.state / "cgroups").is_dir() else []
        bases: set[tuple[int, Path]] = set()
        for record in records:
            with contextlib.suppress(OSError, ValueError):
                version, path = record.read_text().split()[:2]
                group = Cgroup(int(version), Path(path))
                for _ in range(50):  # a killed worker may still be exiting
                    if group.remove():
                        break
                    time.sleep(0.1)
                else:
                    left.append(group.path)
                bases.add((int(version), group.path.parent))
            record.unlink()
        for v, base in bases:
            left += Backend(v, base).remove_all()
        return left

    def events(self) -> EventLog:
        return EventLog(self.run.events)


def healthy(m: dict[str, Any]) -> bool:
    port, path = m.get("port"), m.get("health")
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _is_supervisord(pid: int) -> bool:
    try:
        return b"supervisord" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
