"""`umemc doctor [STACK] [--json] [--capture FILE.tar.gz]`: what umemc sees of this machine and where it reads it —
the platform kind it detects and why, the memory the OS sees, the GPU window in force and its interface, the memory
bus, heat, the kernel's memory pressure (PSI), per-process GPU memory where the driver tells it, the engines found —
and preflight's findings about the machine (its VM tunables, GPU window, ROCm, swap, cgroups) with their fixes,
against STACK's plan, or against the stack `umemc init` would write for this machine.

`UMEMC_HOST_ROOT=DIR` reads a recorded machine instead; `--capture` writes this one as such a DIR (a .tar.gz) for a
bug report. Exit 0, or 1 where a finding fails (a setting that would refuse `umemc up`); 2 for bad arguments."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .args import Args

ENGINES = ("llama-server", "llama-fit-params", "ggml-rpc-server", "whisper-server", "vllm", "mlx_lm.server")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("doctor", help="what umemc sees of this machine, from where, and what to fix")
    p.add_argument("stack", nargs="?", default=None, help="judge the machine against this stack's plan")
    p.add_argument("--json", action="store_true", help="one JSON object (docs/PLATFORMS.md lists its keys)")
    p.add_argument(
        "--capture",
        metavar="FILE.tar.gz",
        default=None,
        help="write what umemc reads of this machine to FILE, for a bug report (UMEMC_HOST_ROOT replays it)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class DoctorArgs(Args):
    stack: str | None
    json: bool
    capture: str | None


def run(ns: argparse.Namespace) -> int:
    args = DoctorArgs.of(ns)
    if args.capture:
        return _capture(Path(args.capture))
    found = report(Path(args.stack) if args.stack else None)
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        _print(found)
    return 1 if any(f["status"] == "fail" for f in found["findings"]) else 0


def _capture(out: Path) -> int:
    from ..cli import umemc_version
    from ..runtime.probes.capture import capture

    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UsageError(f"--capture {out}: name a .tar.gz file")
    if not out.parent.is_dir():
        raise UsageError(f"--capture {out}: no directory {out.parent}")
    about = capture(out, umemc_version())
    programs = ", ".join(about["programs"]) if isinstance(about["programs"], dict) else ""
    files = about["files"]
    count = len(files) if isinstance(files, list) else 0
    print(f"wrote {out}: {count} files umemc reads and what {programs or 'no program'} printed; no environment")
    print(f"replay it: mkdir machine && tar -xzf {out} -C machine && UMEMC_HOST_ROOT=machine umemc doctor")
    return 0


def report(stack: Path | None) -> dict[str, Any]:
    """The doctor's JSON object (the contract's keys first)."""
    from ..runtime.probes import heat, hostroot, machine

    m = machine.detect()
    window = machine.gpu_window(m)
    host_os = hostroot.host_os()
    hot = heat.read(m.kind, host_os)
    psi = machine.psi()
    busy, busy_source = _bus(m.kind, hot)
    out: dict[str, Any] = {
        "platform": m.kind,
        "memory_bytes": m.memory - m.carveout,
        "gpu_window_bytes": window.bytes,
        "gpu_window_source": window.source,
        "memory_busy": busy,
        "findings": [],
        "platform_why": m.why,
        "memory_source": m.memory_source,
        "uma_carveout_bytes": m.carveout or None,
        "gpu_window_note": window.note or None,
        "memory_busy_source": busy_source,
        "memory_gbps": hot.memory_gbps,
        "psi": None if psi is None else psi._asdict(),
        "heat": _heat(hot),
        "gpu_processes": _gpu_processes(m.kind),
        "engines": {e: shutil.which(e) for e in ENGINES},
        "recorded": None if hostroot.recorded() is None else str(hostroot.recorded()),
    }
    if m.kind == "nvidia-unified":
        info = machine.meminfo()
        out["nvmap_used_bytes"] = info.get("NvMapMemUsed")
    out["findings"], out["findings_against"] = _findings(stack, m)
    out["stack_engines"] = _stack_engines(stack) if stack is not None else None
    return out


def _stack_engines(stack: Path) -> dict[str, dict[str, str | None]]:
    """Each model's engine as the stack names it: its program (for vLLM and MLX the interpreter whose environment
    holds them) and the version installed there, or null where it is not installed."""
    from ..compile.launchers import RUNTIMES
    from ..helptext import installed, package_version
    from ..stack.resolve import load_stack

    out: dict[str, dict[str, str | None]] = {}
    for name, m in load_stack(stack).models.items():
        runtime = RUNTIMES[m.spec.runtime]
        module = runtime.HELP_MODULE
        if m.spec.runtime == "command" or m.spec.runtime == "comfyui":
            continue
        program = m.spec.bin or ("python3" if module else m.spec.runtime)
        found = shutil.which(program)
        present = found is not None and (module is None or installed(found, module))
        version = package_version(found, module) if present and found and module else None
        out[name] = {"runtime": m.spec.runtime, "program": found or program if present else None, "version": version}
    return out


def _bus(kind: str, hot: Any) -> tuple[float | None, str]:
    if kind == "nvidia-unified":
        return None, (
            "not measured: no counter of the shared memory's traffic here (GB10's utilization.memory stays 0 whatever "
            "the load: llama-swap#782)"
        )
    if kind == "apple":
        return None, "not measured: macOS reports no memory bus activity without root"
    if hot.memory_busy is not None:
        return hot.memory_busy, "nvidia-smi utilization.memory" if "nvidia" in kind else "amdgpu gpu_metrics"
    if hot.memory_gbps is not None:
        return None, "not measured as a share: amdgpu's gpu_metrics gives the DRAM's bandwidth (memory_gbps)"
    return None, "not measured: the platform reports none"


def _heat(hot: Any) -> dict[str, Any]:
    return {
        "source": hot.source,
        "sensors": [{"name": s.name, "celsius": s.celsius, "limit": s.limit} for s in hot.sensors],
        "watts": hot.watts,
        "throttling": hot.throttling(),
        "thermal_state": hot.thermal_state,
    }


def _gpu_processes(kind: str) -> dict[str, int] | None:
    """pid -> GPU bytes the NVIDIA driver gives (None: the platform has no such per-process figure here)."""
    if kind not in ("nvidia-unified", "nvidia-discrete"):
        return None
    from ..runtime.probes import nvidia

    got = nvidia.smi()
    return None if got is None else {str(p): b for p, b in sorted(got.items()) if b is not None}


def _findings(stack: Path | None, m: Any) -> tuple[list[dict[str, Any]], str]:
    """Preflight's machine checks against STACK's plan (else the stack init would write here)."""
    from ..budget.plan import make_plan
    from ..commands.build import build
    from ..contract import PlanDoc, read
    from ..names import PLAN_FILE
    from ..runtime.preflight import Preflight
    from ..stack.resolve import load_stack

    with tempfile.TemporaryDirectory(prefix="umemc-doctor-") as tmp:
        path = stack
        if path is None:
            path = Path(tmp) / "machine.toml"
            path.write_text(_machine_stack(m))
        judged = Path(tmp) / "judged"
        build(make_plan(load_stack(path)), judged, files_later=True)
        found = Preflight(judged, read(PlanDoc, judged / PLAN_FILE)).machine()
        here = str(judged.resolve())
    against = str(stack) if stack else "the stack `umemc init` would write for this machine"
    # the bundle judged against was a temporary one: a fix names the bundle `umemc build` writes instead
    return [
        {
            "check": f.check,
            "status": "ok" if f.ok else "warn" if f.advisory else "fail",
            "message": f.message,
            "fix": [x.replace(here, "BUNDLE") for x in f.fix],
        }
        for f in found
    ], against + " (BUNDLE: what `umemc build STACK` writes)"


def _machine_stack(m: Any) -> str:
    from .init import platform_table, preset_for

    return (
        'version = 1\nname = "machine"\n\n'
        + platform_table(preset_for(m), m)
        + '\n[models.probe]\nruntime = "command"\ncommand = ["true"]\nmemory = "1GiB"\n'
    )


def _print(r: dict[str, Any]) -> None:
    from rich.markup import escape

    from .common import console

    def gib(n: int | None) -> str:
        return "none" if n is None else f"{n / (1 << 30):.2f} GiB"

    out = console()
    if r["recorded"]:
        out.print(f"[bold]recorded machine[/] {escape(r['recorded'])}")
    out.print(f"[bold]platform[/]    {r['platform']}: {escape(r['platform_why'])}")
    out.print(f"[bold]memory[/]      {gib(r['memory_bytes'])} ({escape(r['memory_source'])})")
    note = f"\n              [yellow]{escape(r['gpu_window_note'])}[/]" if r["gpu_window_note"] else ""
    out.print(f"[bold]GPU window[/]  {gib(r['gpu_window_bytes'])} ({escape(r['gpu_window_source'])}){note}")
    bus = "" if r["memory_busy"] is None else f"{r['memory_busy']:.0%} busy, "
    out.print(f"[bold]memory bus[/]  {bus}{escape(r['memory_busy_source'])}")
    psi = r["psi"]
    out.print(
        "[bold]pressure[/]    "
        + (
            "no PSI here"
            if psi is None
            else f"memory stalls {psi['some10']:.0%} (all tasks {psi['full10']:.0%}) of 10 s"
        )
    )
    h = r["heat"]
    hottest = max(h["sensors"], key=lambda s: s["celsius"], default=None)
    said = "nothing reported" if hottest is None else f"{hottest['celsius']:g} °C ({escape(hottest['name'])})"
    state = f", thermal state {h['thermal_state']}" if h["thermal_state"] else ""
    out.print(
        f"[bold]heat[/]        {said}{state} ({h['source']})"
        + (f", [red]{h['throttling']}[/]" if h["throttling"] else "")
    )
    if r["gpu_processes"] is not None:
        out.print(f"[bold]GPU memory[/]  per process: {len(r['gpu_processes'])} process(es) the driver lists")
    engines = [f"{e} ({p})" for e, p in r["engines"].items() if p]
    out.print(f"[bold]engines[/]     {escape(', '.join(engines)) if engines else 'none on PATH'}")
    for name, e in (r.get("stack_engines") or {}).items():
        where = f"{e['program']}" + (f", {e['version']}" if e["version"] else "") if e["program"] else "not installed"
        out.print(f"  {escape(name)}: {escape(e['runtime'])} ({escape(where)})")
    out.print(f"[bold]findings[/]    against {escape(r['findings_against'])}")
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    for f in r["findings"]:
        out.print(f"  [{colour[f['status']]}]{f['status']:4}[/] {f['check']}: {escape(f['message'])}")
        for fix in f["fix"]:
            out.print(f"         fix: {escape(fix)}")
