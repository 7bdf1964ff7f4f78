"""`umemc down [--run-dir DIR]`: stop every worker and supervisord; then find whatever of the run is
still alive by cgroup membership and recorded pids (orphans of a killed supervisord, double-forked
children) and kill it; remove the cgroups. Idempotent, and it works whatever state is corrupt or
missing (plan.json, the event log, the pid file): exit 0 when nothing of the stack is left, 1 when
something could not be stopped (its records are kept, so a later `down` still knows it)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RuntimeFailure
from .args import Args
from .up import add_run_dir

if TYPE_CHECKING:
    from ..runtime.rundir import RunDir


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("down", help="stop the stack: every worker, the enforcer and supervisord")
    add_run_dir(p, "positional")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class DownArgs(Args):
    run_dir: str


def run(ns: argparse.Namespace) -> int:
    args = DownArgs.of(ns)
    from ..runtime.control import Stack
    from ..runtime.registry import forget
    from ..runtime.rundir import RunDir
    from ..runtime.uplock import stop_up

    run_dir = RunDir(Path(args.run_dir).absolute())
    try:
        interrupted = stop_up(run_dir.up_lock)  # an `up` still bringing the stack up is stopped first
    except TimeoutError as exc:
        raise RuntimeFailure(f"down: {exc}: run `umemc down` again once it has") from None
    if interrupted is not None:
        print(f"down: an `umemc up` (pid {interrupted.pid or '?'}) was bringing this stack up: stopped it first")
    if not run_dir.bundle.exists() and not run_dir.state.exists():
        print(f"nothing to stop: no stack in {args.run_dir}")
        return 0
    stack = Stack(run_dir)
    name = stack.name()
    try:
        running = stack.state() == "running"
    except RuntimeFailure:  # supervisord alive but deaf: it is in the run's cgroup or records; the sweep ends it
        running = False
    pids: list[int] = []
    killed: list[int] = []
    members = stack.members
    foreign = members.foreign_records()  # before the sweep forgets them: say what was not ours
    if running:
        pids, killed = members.stop_all(stack.supervisor)
    orphans, left = members.sweep()
    for problem in foreign:
        print(f"down: record {problem} (copied from another run, or forged): not killed, record removed")
    stale = stack.clean_stale()
    run_dir.release_socket()
    forget(run_dir.root)
    _record(run_dir, running=running, pids=pids, killed=killed, orphans=orphans, left=left)
    if left:
        what = "; ".join(f"{n}: {', '.join(map(str, p))}" for n, p in left.items())
        raise RuntimeFailure(
            f"down: could not stop every process of stack {name} ({what}); their records are "
            f"kept: run `umemc down --run-dir {args.run_dir}` again, or kill them yourself"
        )
    groups = members.groups_left()
    if groups:
        raise RuntimeFailure("could not remove cgroups (processes still inside?): " + ", ".join(map(str, groups)))
    if running:
        print(
            f"down: {name} stopped ({len(pids)} processes"
            + (f"; {len(killed)} survived the stop and were killed: {killed}" if killed else "")
            + ")"
            + (f"; {len(orphans)} left outside supervisord killed: {orphans}" if orphans else "")
        )
    elif orphans:
        print(f"down: stack {name} had no supervisord; killed {len(orphans)} process(es) it left: {orphans}")
    else:
        note = " (cleaned state left by a crashed run)" if stale else ""
        print(f"stack {name} is not running{note}")
    return 0


def _record(
    run_dir: RunDir,
    *,
    running: bool,
    pids: list[int],
    killed: list[int],
    orphans: list[int],
    left: dict[str, list[int]],
) -> None:
    """The `down` event, best effort: a broken event log never stops `down` (it says so on stderr)."""
    from ..runtime.event_log import EventLog

    if not run_dir.state.exists():
        return
    log = EventLog(run_dir.events)
    log.add(
        "down",
        None,
        pids=len(pids),
        killed=killed,
        orphans=orphans,
        running=running,
        left={n: p for n, p in left.items()},
    )
    log.close()
