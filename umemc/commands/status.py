"""`umemc status [--run-dir DIR] [--json]` and `umemc top`: per model state, pid, CPU- and GPU-side
bytes, quotas, share of the hard quota, restarts, uptime, last event; requests in flight and queued
at the gateway, and its leases."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import ContractError, Doc, read, values
from ..names import ENFORCER, GATEWAY, STANDBY
from ..units import gib, in_unit, unit_for
from .args import Args
from .common import console
from .up import add_run_dir, no_stack_in


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="per-worker state, memory and quotas of the running stack")
    add_run_dir(p, "positional")
    p.add_argument("--json", action="store_true", help='print {"models": {...}} (the contract in docs/CONTRACTS.md)')
    p.set_defaults(func=run)
    t = sub.add_parser("top", help="the status table, refreshed live")
    add_run_dir(t, "positional")
    t.add_argument("--interval", type=float, default=1.0, help="refresh period in seconds")
    t.set_defaults(func=run_top)


def collect(run_dir_arg: str) -> dict[str, Any]:
    """State from supervisord, usage from the enforcer's status file, quotas from plan.json. Read-only:
    it changes no file. Processes of the run alive without a supervisord are shown as ORPHANED; a
    corrupt plan.json or status file is said, never a traceback."""
    from ..contract import EnforcerStatus, GatewayState, PlanDoc
    from ..runtime.control import PlanUnreadable, Stack
    from ..runtime.rundir import RunDir
    from ..runtime.supervisor import ProcState

    run_dir = RunDir(Path(run_dir_arg).absolute())
    if not run_dir.bundle.exists() and not run_dir.state.exists():
        raise no_stack_in(run_dir_arg)
    stack = Stack(run_dir)
    problems: list[str] = []
    plan: PlanDoc | None = None
    try:
        plan = stack.plan
    except PlanUnreadable as exc:
        problems.append(str(exc))
    running = stack.state() == "running"
    infos = stack.supervisor.processes() if running else {}
    orphans = {} if running else stack.members.leftovers()
    live = _read(EnforcerStatus, run_dir.status, problems) if running else None
    gateway = _read(GatewayState, run_dir.gateway_state, problems) if running else None
    if live is not None and live.events_error:
        problems.append(f"event log: {live.events_error} (events go to the enforcer's log meanwhile)")
    elif running:
        problems += _event_log_problems(run_dir.events)
    if live is not None and live.events_moved_to:
        problems.append(f"the event log was corrupt: moved to {live.events_moved_to}, a new one started")
    out: dict[str, Any] = {
        "stack": stack.name() if plan is None else plan.stack,
        "running": running,
        "pressure": None if live is None else live.pressure,
        "models": {},
        "_gateway": None if plan is None or plan.gateway is None else values(plan.gateway),
        "_leases": [] if gateway is None else [values(x) for x in gateway.leases],
        "_generation": None if gateway is None or gateway.generation is None else values(gateway.generation),
        "_orphans": orphans,
        "_problems": problems,
        "_rehearsal": None if plan is None or not plan.simulate else {"scale": plan.scale},
        "_machine": None if live is None else _machine(live),
    }
    latest = _latest_events(run_dir) if running else {}
    names = list(plan.models) if plan is not None else [n for n in infos if n not in OWN_PROGRAMS]
    for name in names:
        m = None if plan is None else plan.models[name]
        info = infos.get(name, {})
        lv = None if live is None else live.models.get(name)
        gm = None if gateway is None else gateway.models.get(name)
        pid = info.get("pid") or (orphans[name][0] if name in orphans else None)
        same = lv is not None and pid is not None and lv.pid == pid
        out["models"][name] = {
            "state": "ORPHANED" if name in orphans else ProcState.of(info) if info else ProcState.STOPPED,
            "pid": pid,
            "rss_bytes": lv.rss_bytes if same and lv else 0,
            "gpu_bytes": lv.gpu_bytes if same and lv else 0,
            "quota_soft_bytes": None if m is None else m.quota_soft_bytes,
            "quota_hard_bytes": None if m is None else m.quota_hard_bytes,
            "restarts": 0 if lv is None else lv.restarts,
            "_uptime_s": (time.time() - info["start"]) if info.get("pid") and info.get("start") else None,
            "_last_event": latest[name].kind if name in latest else None if lv is None else lv.last_event,
            "_last_said": _said(latest.get(name)),
            "_priority": None if m is None else m.priority,
            "_mode": None if m is None else m.mode,
            "_drift": lv.drift if same and lv else None,
            "_resident_bytes": lv.resident_bytes if same and lv else None,
            "_reserved": lv.reserved_bytes if same and lv else 0,
            "_allowance": lv.allowance_bytes if same and lv else 0,  # leases that raise its quotas now
            "_requests": None if gm is None else {"in_flight": gm.in_flight, "queued": gm.queued},
            "_health": None if gm is None else gm.health,
            "_tokens_per_s": None if gm is None else gm.tokens_per_s,
            "_enforced_by": lv.enforced_by if same and lv else None,
            "_swapped": lv.swapped_bytes if same and lv else None,
            # NVIDIA: False where the driver lists none of its processes while the plan puts memory on the GPU (a
            # container's PID namespace, a Jetson): its gpu_bytes is then not the truth (docs/PLATFORMS.md)
            "_gpu_visible": (lv.gpu_visible if m is None or m.gpu_bytes else None) if same and lv else None,
            # beyond what it uses: a torch allocator's cache, a llama.cpp worker's memory beyond its buffers
            "_held_beyond": (
                lv.allocator_unused_bytes if lv.allocator_unused_bytes is not None else lv.beyond_buffers_bytes
            )
            if same and lv
            else None,
        }
    if out["_machine"] is not None:
        out["_machine"]["enforcement"] = _enforcement(out["models"].values(), plan, out["_machine"])
    out["_nodes"] = _other_nodes(plan, run_dir) if plan is not None and plan.peers and running else {}
    return out


PEER_WAIT_S = 2.0  # another node's gateway that has not answered by then is said not to answer


def _other_nodes(plan: Any, run_dir: Any) -> dict[str, Any]:
    """A stack of several nodes: the other nodes' models as their gateways say them (GET /umemc/status, the stack's
    token), by node: {"url", "models": {name: {"state", "status"}}} or {"url", "error"}."""
    import http.client

    from ..runtime.wrap import endpoint_parts

    token = run_dir.token()
    urls = {p.node: p.url for p in plan.peers.values()}
    out: dict[str, Any] = {}
    for node, url in sorted(urls.items()):
        conn = http.client.HTTPConnection(*endpoint_parts(url), timeout=PEER_WAIT_S)
        try:
            conn.request("GET", "/umemc/status", headers={"Authorization": f"Bearer {token}"} if token else {})
            resp = conn.getresponse()
            doc = json.loads(resp.read()) if resp.status == 200 else None
            if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
                raise ValueError(f"it answered {resp.status}")
            models = {  # what it serves (never a split model's part there)
                n: {"state": m.get("state"), "status": m.get("status")}
                for n, m in doc["models"].items()
                if isinstance(m, dict) and n in plan.peers
            }
            out[node] = {"url": url, "models": models}
        except (OSError, ValueError, http.client.HTTPException) as exc:
            out[node] = {"url": url, "error": f"its gateway does not answer ({exc})"}
        finally:
            conn.close()
    return out


def _machine(live: Any) -> dict[str, Any]:
    """How the enforcer samples this machine (its probes, the figure a worker's CPU side is), its swap and the OS's
    own pressure level (macOS), the GPU limit a runtime reported (Metal)."""
    return {
        "platform": live.platform,
        "memory_figure": live.memory_figure,
        "swap_used_bytes": live.swap_used_bytes,
        "swap_grown_bytes": live.swap_grown_bytes,
        "pressure_level": live.pressure_level,
        "gpu_limit_bytes": live.gpu_limit_bytes,
        "heat_c": live.heat_c,
        "heat_sensor": live.heat_sensor,
        "power_w": live.power_w,
        "throttling": live.throttling,
        "psi_some": live.psi_some,
        "psi_full": live.psi_full,
        "thermal_state": live.thermal_state,
    }


def _enforcement(models: Any, plan: Any, machine: dict[str, Any]) -> str:
    """Who holds the workers to their hard quotas now, in words."""
    kernel = sorted({m["_enforced_by"] for m in models if (m["_enforced_by"] or "").startswith("cgroup")})
    if kernel:
        return f"the kernel ({', '.join(kernel)}) and umemc's enforcer"
    if machine.get("platform") == "darwin" or (plan is not None and plan.platform.kind == "apple"):
        return "umemc's enforcer alone (macOS has no memory cgroups), by each worker's phys_footprint"
    return "umemc's enforcer alone"


OWN_PROGRAMS = (ENFORCER, STANDBY, GATEWAY)  # what supervisord runs beside the workers


def _latest_events(run_dir: Any) -> dict[str, Any]:
    """Each model's latest event of this run from the log (read only), whoever wrote it: an eviction reads as
    the gateway's eviction, not as the exit the enforcer saw."""
    from ..runtime.event_log import EventLog

    if not run_dir.events.is_file():
        return {}
    log = EventLog(run_dir.events, recover=False)
    try:
        return log.latest(log.last_id("up"))
    finally:
        log.close()


def _said(event: Any) -> str | None:
    if event is None:
        return None
    from ..runtime.eventtext import said

    return f"{said(event.kind, event.detail)}, {_ago(time.time() - event.ts)} ago"


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"


def _event_log_problems(path: Path) -> list[str]:
    """What a look at the file says, without writing to it: a running stack always has its event log."""
    import os

    if path.is_symlink() or (path.exists() and not path.is_file()):
        return [f"event log: {path} is not a regular file (events go to the workers' logs meanwhile)"]
    if not path.exists():
        return [f"event log: {path} is missing (deleted?); the runtime starts a new one with its next event"]
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        return [f"event log: {path} is not writable (events go to the runtime's logs meanwhile)"]
    return []


def _read(kind: type[Doc], path: Path, problems: list[str]) -> Doc | None:
    """A live status file; a missing one is normal (just started), a corrupt one is said."""
    if not path.exists():
        return None
    try:
        return read(kind, path)
    except ContractError as exc:
        problems.append(f"{exc}: live figures missing")
        return None


def contract(status: dict[str, Any]) -> dict[str, Any]:
    """`status --json`: the contract's {"models": {name: {state, pid, rss_bytes, gpu_bytes, quota_soft_bytes,
    quota_hard_bytes, restarts}}} first, then everything the table shows (same names without the '_'), as the
    typed document umemc.contract.StatusDoc (a field added to the table and not to the document fails here)."""
    from ..contract import StatusDoc
    from ..document import validate

    return values(validate(StatusDoc, _untyped(status)))


def _untyped(status: dict[str, Any]) -> dict[str, Any]:
    models = {}
    for name, m in status["models"].items():
        doc = {k: v for k, v in m.items() if not k.startswith("_")}
        doc |= {EXTRA_NAMES.get(k, k[1:]): v for k, v in m.items() if k.startswith("_")}
        models[name] = doc
    out: dict[str, Any] = {"models": models}
    out |= {k: v for k, v in status.items() if k != "models" and not k.startswith("_")}
    out |= {k[1:]: v for k, v in status.items() if k.startswith("_")}
    return out


EXTRA_NAMES = {
    "_reserved": "reserved_bytes",
    "_allowance": "allowance_bytes",
    "_last_said": "last_event_text",
    "_swapped": "swapped_bytes",
    "_held_beyond": "held_beyond_bytes",
}


def table(status: dict[str, Any]) -> Any:
    from rich import box
    from rich.table import Table

    from ..runtime.supervisor import ProcState

    pressure = status.get("pressure")
    title = f"umemc {status['stack']}: " + ("running" if status["running"] else "not running")
    orphans = status.get("_orphans") or {}
    if orphans:
        title += (
            f" — [red]{sum(len(p) for p in orphans.values())} process(es) left without supervisord "
            f"({', '.join(orphans)}): `umemc down` stops them[/]"
        )
    rehearsal = status.get("_rehearsal")
    if rehearsal:
        title += " — rehearsal: placeholders" + (
            f" at {rehearsal['scale']:g} of the size (every quota and the machine times {rehearsal['scale']:g})"
            if rehearsal["scale"] != 1
            else ""
        )
    if pressure is not None:
        title += f", pressure {pressure:.0%}"
    title += _machine_words(status.get("_machine"))
    if status["running"] and status.get("_gateway"):
        leases = status["_leases"]
        title += f", gateway :{status['_gateway']['port']}"
        if leases:
            title += f", {len(leases)} lease(s) {gib(sum(x['bytes'] for x in leases))}"
        gen = status.get("_generation")
        if gen and gen["max"] is not None:
            title += f", generating {gen['in_use']:g} of {gen['max']}" + (
                f" ({gen['waiting']} waiting)" if gen["waiting"] else ""
            )
    rows = status["models"].values()
    unit, size = unit_for(*(m["quota_hard_bytes"] for m in rows), *(m["rss_bytes"] + m["gpu_bytes"] for m in rows))
    t = Table(
        title=title + f"  ({unit})",
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 1),
        collapse_padding=True,
    )
    # RSS: the tree's resident memory as `ps` shows it; %hard: of the figure its quota is held to (with a cgroup, its
    # charge, which misses a model file's pages another process cached first)
    columns: tuple[str, ...] = ("model", "state", "pid", "RSS", "GPU", "resv", "%hard", "hard", "req")
    columns += ("tok/s", "rst", "up", "last event")
    for col in columns:
        t.add_column(col, justify="right" if col not in ("model", "state", "last event") else "left", no_wrap=True)
    for name, m in status["models"].items():
        used = m["rss_bytes"] + m["gpu_bytes"]
        share = used / m["quota_hard_bytes"] if m["quota_hard_bytes"] else 0
        soft = m["quota_soft_bytes"] or 0
        style = "red" if share > 1 else "yellow" if soft and used > soft else ""
        color = {ProcState.RUNNING: "green", ProcState.STARTING: "yellow", ProcState.STOPPED: "dim"}.get(
            m["state"], "red"
        )
        state = m["state"] if m.get("_health") != "unhealthy" else f"{m['state']} (unhealthy)"
        color = "red" if m.get("_health") == "unhealthy" else color
        uptime = m["_uptime_s"]
        t.add_row(
            name,
            f"[{color}]{state}[/]",
            str(m["pid"] or "-"),
            in_unit(m["rss_bytes"] if m.get("_resident_bytes") is None else m["_resident_bytes"], size),
            "not visible" if m.get("_gpu_visible") is False else in_unit(m["gpu_bytes"], size),
            in_unit(m["_reserved"], size) if m["_reserved"] else "-",
            f"[{style}]{share:.0%}[/]" if style else f"{share:.0%}",
            in_unit(m["quota_hard_bytes"], size),
            _requests(m),
            "-" if m.get("_tokens_per_s") is None else f"{m['_tokens_per_s']:.1f}",
            str(m["restarts"]),
            "-" if uptime is None else f"{uptime:.0f} s",
            _last(m),
        )
    for node, seen in (status.get("_nodes") or {}).items():  # a stack of several nodes: the others' models
        where = f"node {node} ({seen['url']})"
        if "error" in seen:
            t.add_row(f"[red]{where}[/]", f"[red]{seen['error']}[/]", *["" for _ in columns[2:]])
            continue
        for name, m in seen["models"].items():
            t.add_row(f"{name} [dim]on {node}[/]", str(m["state"]), *["" for _ in columns[2:-1]], f"{where}")
    return t


PSI_WARN = 0.10  # a tenth of the time some task waited on memory: reclaim is stalling the box


def _machine_words(machine: dict[str, Any] | None) -> str:
    if not machine:
        return ""
    out = ""
    if machine.get("pressure_level") not in (None, "normal"):
        out += f" [red](the OS says {machine['pressure_level']})[/]"
    grown = machine.get("swap_grown_bytes")
    if grown and grown > 0:
        out += f", [yellow]swap +{gib(grown)}[/]"
    out += _heat_words(machine)
    if machine.get("psi_some") is not None:
        some, full = machine["psi_some"], machine.get("psi_full") or 0.0
        stalled = f"memory stalls {some:.0%} (all tasks {full:.0%}) of the last 10 s"
        out += f", [yellow]{stalled}[/]" if some >= PSI_WARN else f", {stalled}"
    return out + f"\nenforced by {machine['enforcement']}"


def _heat_words(machine: dict[str, Any]) -> str:
    """The hottest sensor and the power draw where the platform reports them; red while the box throttles."""
    from rich.markup import escape

    parts = []
    if machine.get("heat_c") is not None:
        parts.append(f"{machine['heat_c']:g} °C ({escape(machine.get('heat_sensor') or '?')})")
    if machine.get("power_w") is not None:
        parts.append(f"{machine['power_w']:g} W")
    out = f", {', '.join(parts)}" if parts else ""
    if machine.get("throttling"):
        out += f" [red](throttling: {escape(machine['throttling'])})[/]"
    return out


def _requests(m: dict[str, Any]) -> str:
    """In flight at the gateway, +queued."""
    r = m.get("_requests")
    if not r:
        return "-"
    return f"{r['in_flight']}" + (f"+{r['queued']}" if r["queued"] else "")


def _last(m: dict[str, Any]) -> str:
    from rich.markup import escape

    text = escape(m.get("_last_said") or m["_last_event"] or "")
    drift = m.get("_drift")
    if drift is not None and drift > 0.05:
        text = f"[red]drift {drift:+.0%}[/] " + text
    return text


@dataclass(frozen=True)
class StatusArgs(Args):
    run_dir: str
    json: bool


@dataclass(frozen=True)
class TopArgs(Args):
    run_dir: str
    interval: float


def run(ns: argparse.Namespace) -> int:
    args = StatusArgs.of(ns)
    status = collect(args.run_dir)
    for problem in status["_problems"]:
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(contract(status), indent=2))
    else:
        console().print(table(status))
    return 0


def run_top(ns: argparse.Namespace) -> int:
    """Refresh every --interval seconds until `q` (or Ctrl-C); off a terminal, print one snapshot."""
    args = TopArgs.of(ns)
    from rich.live import Live

    out = console()
    if not out.is_terminal:
        out.print(table(collect(args.run_dir)))
        return 0
    with _keys() as key, Live(table(collect(args.run_dir)), console=out, screen=False, auto_refresh=False) as live:
        try:
            while key(args.interval) not in ("q", "Q"):
                live.update(table(collect(args.run_dir)), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str | None]]:
    """A function that waits up to N seconds for one key press on a terminal stdin (None: none came);
    the terminal is put in cbreak mode meanwhile and restored after."""
    import select

    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:

        def wait(seconds: float) -> str | None:
            time.sleep(seconds)
            return None

        yield wait
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def key(seconds: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], seconds)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield key
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
