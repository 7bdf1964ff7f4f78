"""`umemc down [--run-dir DIR]`: stop every worker and supervisord; verify by PID that nothing of
the stack survives (killing stragglers); remove the workers' cgroups. Idempotent."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import RuntimeFailure
from .up import add_run_dir


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("down", help="stop the stack: every worker, the enforcer and supervisord")
    add_run_dir(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..runtime.control import Stack
    from ..runtime.rundir import RunDir

    run_dir = RunDir(Path(args.run_dir).absolute())
    if not run_dir.bundle.exists():
        print(f"nothing to stop: no stack in {args.run_dir}")
        return 0
    stack = Stack(run_dir)
    state = stack.state()
    if state != "running":
        left = stack.remove_cgroups()
        stack.remove_private_socket_dir()
        note = " (cleaned state left by a crashed run)" if state == "stale" else ""
        print(f"stack {stack.plan['stack']} is not running{note}")
        return _cgroups_left(left)
    events = stack.events()
    pids, killed = stack.stop_all()
    left = stack.remove_cgroups()
    stack.remove_private_socket_dir()
    events.add("down", None, pids=len(pids), killed=killed)
    events.close()
    print(f"down: {stack.plan['stack']} stopped ({len(pids)} processes"
          + (f"; {len(killed)} survived the stop and were killed: {killed}" if killed else "") + ")")
    return _cgroups_left(left)


def _cgroups_left(left: list[Path]) -> int:
    if left:
        raise RuntimeFailure("could not remove cgroups (processes still inside?): " + ", ".join(map(str, left)))
    return 0
