"""`umemc up STACK|BUNDLE [--run-dir DIR] [--skip CHECK]… [--simulate] [--foreground]`: build (or copy) the
bundle into RUN/bundle, run the preflight, start the real supervisord and return once every hot
worker is RUNNING and healthy. On a running stack it says so and reconciles."""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RuntimeFailure, UsageError
from .args import Args
from .build import add_no_measure

if TYPE_CHECKING:
    from rich.console import Console

    from ..budget.plan import Plan
    from ..contract import PlanDoc
    from ..runtime.control import Stack
    from ..runtime.rundir import RunDir

DEFAULT_RUN_DIR = ".umemc/run"


def add_run_dir(p: argparse.ArgumentParser, by_name: str | None = None) -> None:
    """--run-dir; `by_name` "positional" or "option": a running stack may be named instead (`umemc ps` lists
    them), as STACK or as --stack NAME."""
    p.add_argument(
        "--run-dir",
        metavar="DIR",
        default=None,
        help=f"where the bundle and live state go (default: the nearest {DEFAULT_RUN_DIR} in this directory "
        "or a parent, else ./" + DEFAULT_RUN_DIR + ")",
    )
    what = (
        "a running stack by its name or its stack file, from any directory (`umemc ps` lists them); where exactly "
        "one stack runs, it may be left out"
    )
    if by_name == "positional":
        p.add_argument("stack_name", nargs="?", metavar="STACK", help=what)
    elif by_name == "option":
        p.add_argument("--stack", dest="stack_name", metavar="NAME", help=what)
    # a command about a running stack may take the one that runs; `up` starts one where it is asked to
    hint = f"`{p.prog} MODEL --stack NAME`" if by_name == "option" else f"`{p.prog} NAME`"
    p.set_defaults(find_run_dir="running" if by_name else "here", name_hint=hint)


def no_stack_in(where: str | Path, hint: str = "`umemc status NAME`") -> UsageError:
    """No stack runs from `where`: which do (by name), and how this command names one; or how to start one."""
    from ..runtime.registry import known

    records, _ = known()
    if records:
        names = ", ".join(f"{r.name} ({r.run_dir})" for r in records)
        return UsageError(f"no stack in {where}; running: {names}: name one ({hint})")
    return UsageError(f"no stack in {where}, and none runs (`umemc up STACK` starts one)")


def find_run_dir(start: Path | None = None, *, running: bool = False) -> str:
    """Like git finds its repository: the nearest .umemc/run that holds a run, from the current
    directory up; a new run goes into ./.umemc/run. `running` (a command about a running stack): where none is
    found that way and exactly one stack runs (`umemc ps`), that one's."""
    from ..runtime.rundir import RunDir

    here = (start or Path.cwd()).absolute()
    for d in (here, *here.parents):
        run = RunDir(d / DEFAULT_RUN_DIR)
        if run.bundle.is_dir() or run.state.is_dir():
            return str(run.root) if d != here else DEFAULT_RUN_DIR
    if running:
        from ..runtime.registry import known

        records, _ = known()
        if len(records) == 1:
            return records[0].run_dir
    return DEFAULT_RUN_DIR


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("up", help="start the stack under supervisord and enforce its quotas")
    p.add_argument("target", metavar="STACK|BUNDLE", help="a stack file, or a bundle directory from `umemc build`")
    add_run_dir(p)
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help="start despite a failed preflight check, named as the preflight names it (sysctl, memlock, swap, "
        "cgroups, ports, helpers, …; repeat it for more, or `all`)",
    )
    p.add_argument("--force", action="store_true", help="the same as --skip all")
    p.add_argument("--node", metavar="NAME", help="a stack with [nodes]: run the models placed on this node")
    p.add_argument(
        "--simulate",
        action="store_true",
        help="replace every worker by a placeholder that holds its soft quota and answers requests",
    )
    p.add_argument(
        "--scale",
        type=_scale,
        default=None,
        metavar="F",
        help="with --simulate: rehearse at F of the size (0 < F <= 1): the machine's memory and every quota times "
        "F, the same decisions (e.g. a 128 GB stack at 0.15 on a 24 GB box)",
    )
    p.add_argument("--foreground", action="store_true", help="keep supervisord in the foreground (systemd unit)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for hot workers (default 900)")
    add_no_measure(p)
    p.set_defaults(func=run)


def _scale(text: str) -> float:
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < f <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1 (got {text})")
    return f


@dataclass(frozen=True)
class UpArgs(Args):
    target: str
    run_dir: str
    skip: list[str]
    force: bool
    node: str | None
    simulate: bool
    scale: float | None
    foreground: bool
    timeout: float
    no_measure: bool


def run(ns: argparse.Namespace) -> int:
    args = UpArgs.of(ns)
    from rich.console import Console

    if args.scale is not None and not args.simulate:
        raise UsageError("umemc up: --scale rehearses placeholders: it needs --simulate")

    from ..runtime import uplock
    from ..runtime.rundir import RunDir

    console = Console(highlight=False, soft_wrap=True)  # long paths and fix commands stay on one line
    run_dir = RunDir(Path(args.run_dir).absolute())
    refuse_symlinks(run_dir)  # before anything is read for writing, created or chmod-ed
    try:
        held = uplock.hold(run_dir.up_lock)  # from here on a `down` finds this `up` and stops it first
    except uplock.UpInProgress as exc:
        raise RuntimeFailure(f"umemc up: {exc}; wait for it, or `umemc down` stops it") from None
    try:
        return _up(args, console, run_dir)
    finally:
        os.close(held)


def _up(args: UpArgs, console: Console, run_dir: RunDir) -> int:
    from ..runtime import waits
    from ..runtime.control import Stack
    from ..runtime.reconcile import reconcile, what_changed
    from ..runtime.supervisor import ANSWERING, ProcState, start_supervisord

    stack = Stack(run_dir)
    state = stack.state() if run_dir.bundle.exists() else "stopped"
    if state != "running":
        clean_crashed_run(console, stack)
    run_dir.prepare()
    before = _own_inputs(run_dir)
    install_bundle(args, run_dir)
    plan = stack.plan
    infos = stack.supervisor.processes() if state == "running" else {}
    alive = {n for n, i in infos.items() if ProcState.of(i) in ANSWERING}
    if not preflight(console, run_dir, plan, args, alive):
        return 1
    hot = [n for n, m in plan.models.items() if m.mode == "hot"]
    write_token(run_dir, plan)  # before the comparison below: a new token restarts the gateway
    events = stack.events()
    try:
        if state == "running":
            console.print(f"stack {plan.stack} is already running: reconciling")
            started, held_back = reconcile(stack, what_changed(before, _own_inputs(run_dir)))
            for name, why in held_back.items():
                console.print(f"  {name} (hot) not started: {why}")
            hot = [n for n in hot if n not in held_back]
            events.add("reconcile", None, started=started, held_back=held_back)
        else:
            events.add("up", None, bundle=str(run_dir.bundle), simulate=plan.simulate, scale=plan.scale)
            events.close()
            since = time.time() - 1.0  # a record written since is this start's (mtime granularity, clock steps)
            start_supervisord(run_dir, plan, foreground=args.foreground)
            waits.started(stack, timeout=args.timeout, since=since)  # while its process lives, it is starting
    finally:
        events.close()
    wait(console, stack, hot, args.timeout)
    release_model_cache(stack, plan)
    url = waits.gateway(stack, args.timeout)
    known = remember_run(plan, run_dir, url)
    console.print(
        f"\n[bold green]up[/]: {plan.stack}: {len(hot)} hot worker(s) running and healthy "
        f"(`umemc status {plan.stack if known else '--run-dir ' + args.run_dir}`)"
    )
    if url:
        console.print(f"gateway: {url} (OpenAI-compatible; cold models start on demand)")
    return 0


def release_model_cache(stack: Stack, plan: PlanDoc) -> None:
    """Where the GPU allocates from system memory through its driver (nvidia-unified), the hot workers serve with
    their weights in the GPU's buffers: the model files' cached pages nobody maps are released (a CUDA allocation
    does not wait for the kernel's reclaim; umemc.runtime.pagecache), and the event log says how much."""
    if plan.platform.kind != "nvidia-unified":
        return
    from ..runtime.pagecache import model_files, release

    files = model_files(plan.models.values())
    freed = release(files)
    if freed:
        events = stack.events()
        try:
            events.add("page_cache_released", None, bytes=freed, files=[str(f) for f in files], before="serving")
        finally:
            events.close()


def remember_run(plan: PlanDoc, run_dir: RunDir, url: str | None) -> bool:
    """Record the running stack for `umemc ps` and commands by name; False where it is known by its run dir only
    (another running stack has its name, or the user's state dir cannot be written: said on stderr)."""
    from ..runtime.control import Stack
    from ..runtime.registry import RunRecord, known, remember

    records, _ = known()
    other = next((r for r in records if r.name == plan.stack and Path(r.run_dir) != run_dir.root), None)
    if other is not None and Path(other.run_dir).is_dir():
        from ..runtime.rundir import RunDir

        if Stack(RunDir(Path(other.run_dir))).state() == "running":
            print(
                f"up: another stack named {plan.stack} runs from {other.run_dir}: this one is known by its run dir",
                file=sys.stderr,
            )
            return False
    said = remember(RunRecord(plan.stack, str(run_dir.root), plan.stack_file, url))
    if said:
        print(f"up: {said}", file=sys.stderr)
    return said is None


def _own_inputs(run_dir: RunDir) -> tuple[bytes | None, bytes | None]:
    """What umemc's own programs read when they start: the plan and the gateway's token (None: absent)."""
    out: list[bytes | None] = []
    for path in (run_dir.plan, run_dir.token_file):
        try:
            out.append(path.read_bytes())
        except OSError:
            out.append(None)
    return out[0], out[1]


def clean_crashed_run(console: Console, stack: Stack) -> None:
    """Before a fresh start: processes a killed supervisord left behind (found by cgroup and record)
    are stopped, never adopted, and its stale pid file and socket removed."""
    members = stack.members
    left = members.leftovers()
    if left:
        killed, survived = members.sweep()
        console.print(
            f"found {len(killed)} process(es) of an earlier run whose supervisord is gone ({', '.join(left)}): stopped"
        )
        if survived:
            raise RuntimeFailure(f"processes of an earlier run survived SIGKILL: {survived}; stop them first")
    if stack.clean_stale():
        console.print("found state left by a crashed run (pid file or socket without supervisord): cleaned")


def write_token(run_dir: RunDir, plan: PlanDoc) -> None:
    """The gateway's token goes to RUN/state/secrets (0600), read by the gateway; supervisord is started
    without the variable, so no worker inherits it. Unset: the preflight refuses (or --force warns)."""
    name = None if plan.gateway is None else plan.gateway.token_env
    if name and os.environ.get(name):
        run_dir.write_secret(run_dir.token_file, os.environ[name])
    run_dir.write_secret(run_dir.unset_file, f"{name}\n" if name else "")  # what the wrapper removes (rundir.py)


def refuse_symlinks(run_dir: RunDir) -> None:
    linked = run_dir.symlinks()
    if linked:
        raise UsageError(
            f"{linked[0]} is a symlink (to {os.readlink(linked[0])}): umemc writes its state, secrets and "
            "logs only into a directory of its own; give --run-dir the real path"
        )


def install_bundle(args: UpArgs, run_dir: RunDir) -> None:
    """A stack is built into RUN/bundle; a bundle directory is copied there."""
    from ..commands.build import build
    from ..commands.common import plan_from_arg
    from ..names import PLAN_FILE
    from ..write import is_bundle, write_bundle
    from .asking import Measure

    target = Path(args.target)
    if not target.is_dir():
        plan = plan_from_arg(args.target, Measure.READ if getattr(args, "no_measure", False) else Measure.MISSING)
        if plan.nodes:
            if args.node not in plan.nodes:
                raise UsageError(
                    f"{args.target} places its models on {len(plan.nodes)} nodes: say which one this machine is "
                    f"with --node ({', '.join(plan.nodes)})"
                )
            plan = plan.nodes[args.node]
        elif args.node is not None:
            raise UsageError(f"{args.target} has no [nodes]: --node does not apply")
        if args.scale is not None:
            plan = rehearsal(plan, args.scale)
        build(plan, run_dir.bundle, simulate=args.simulate)
        return
    if not is_bundle(target):
        raise UsageError(f"{args.target}: neither a stack file nor a umemc bundle")
    if not (target / PLAN_FILE).exists() and (target / "nodes").is_dir():
        nodes = sorted(p.name for p in (target / "nodes").iterdir() if p.is_dir())
        raise UsageError(
            f"{args.target} holds one bundle per node: run the one for this machine, "
            + " or ".join(f"{Path(args.target) / 'nodes' / n}" for n in nodes)
        )
    if args.simulate:
        raise UsageError("--simulate needs the stack file: it builds placeholders into the bundle")
    if target.resolve() != run_dir.bundle.resolve():
        files = {
            str(p.relative_to(target)): p.read_text()
            for p in sorted(target.rglob("*"))
            if p.is_file() and p.name != ".umemc-bundle"
        }
        write_bundle(run_dir.bundle, files)


PLACEHOLDER_FLOOR = 64 * 1024 * 1024  # a placeholder process's interpreter alone takes ~30-40 MiB


def rehearsal(plan: Plan, f: float) -> Plan:
    """The plan at F of its size; refused when a placeholder could not hold so little (its own interpreter)."""
    from ..budget.plan import scaled
    from ..units import human

    small = min(plan.models.values(), key=lambda m: m.quota_soft)
    if small.quota_soft * f < PLACEHOLDER_FLOOR:
        least = PLACEHOLDER_FLOOR / small.quota_soft
        raise UsageError(
            f"umemc up: at --scale {f:g} {small.name} ({human(small.quota_soft)}) would hold "
            f"{human(int(small.quota_soft * f))}, less than a placeholder process needs for itself "
            f"({human(PLACEHOLDER_FLOOR)}): use --scale {min(1.0, least):.2g} or more"
        )
    return scaled(plan, f)


def preflight(console: Console, run_dir: RunDir, plan: PlanDoc, args: UpArgs, running: set[str]) -> bool:
    from ..runtime.findings import report
    from ..runtime.preflight import Preflight

    pf = Preflight(run_dir.bundle, plan, simulate=args.simulate)
    findings = pf.run(running)
    skip = {*args.skip, *(["all"] if args.force else [])}
    blocking = pf.blocking(skip)
    warnings = [f for f in findings if not f.ok and f not in blocking]
    before = _said_before(run_dir)
    again = [f for f in warnings if f"{f.check}: {f.message}" in before]  # said by the last up, unchanged
    lines, refused = report([f for f in findings if f not in again], blocking)
    console.print("preflight:")
    for line in lines:
        console.print(line)
    if again:
        checks = ", ".join(sorted({f.check for f in again}))
        console.print(
            f"  [dim]{len(again)} warning(s) as the last `up` said them ({checks}): `umemc doctor` repeats them[/]"
        )
    _remember_said(run_dir, [f"{f.check}: {f.message}" for f in warnings])
    if refused:
        print(refused, file=sys.stderr)
        return False
    skipped = sorted({f.check for f in pf.blocking()} - {f.check for f in blocking})
    if skipped:
        console.print(f"[yellow]starting despite the preflight's {', '.join(skipped)} (--skip)[/]")
    return True


def _said_before(run_dir: RunDir) -> set[str]:
    """The warnings the last `up` of this run printed (none where unknown: then each is said)."""
    import json

    from ..records import read_file

    try:
        said = json.loads(read_file(run_dir.warned, 1 << 20))
    except (OSError, ValueError, RecursionError):
        return set()
    return {s for s in said if isinstance(s, str)} if isinstance(said, list) else set()


def _remember_said(run_dir: RunDir, said: list[str]) -> None:
    import json

    from ..records import write_atomic

    try:
        write_atomic(run_dir.warned, json.dumps(sorted(said)) + "\n")
    except OSError:
        pass  # a state dir that takes no write: every warning is said again next time, nothing worse


def wait(console: Console, stack: Stack, hot: list[str], timeout: float) -> None:
    from rich.live import Live
    from rich.table import Table

    from ..runtime.waits import healthy_workers

    states: dict[str, tuple[str, bool]] = {n: ("", False) for n in hot}
    started = time.monotonic()

    def table() -> Table:
        t = Table(box=None, show_header=False, pad_edge=False)
        for name, (state, ok) in states.items():
            t.add_row(f"  {name}", "[green]healthy[/]" if ok else f"[yellow]{state or 'waiting'}[/]")
        t.add_row("", f"[dim]{time.monotonic() - started:.0f} s[/]")
        return t

    with Live(table(), console=console, refresh_per_second=4) as live:

        def progress(name: str, state: str, ok: bool) -> None:
            states[name] = (state, ok)
            live.update(table())

        try:
            healthy_workers(stack, hot, timeout, progress)
        except RuntimeFailure:
            live.update(table())
            raise
