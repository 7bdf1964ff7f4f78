"""Who stops a run's processes when its supervisord dies, where the kernel has no parent-death signal.

On Linux every process a run starts asks for SIGKILL when its parent dies (PR_SET_PDEATHSIG, umemc.runtime.wrap):
a `kill -9` of supervisord takes the workers, the enforcer and the gateway with it. macOS has no such signal, so
the exec wrapper that becomes supervisord first starts a reaper: a small process in its own process group, carrying
the run's mark like every other process of the run (so `umemc down` stops it with the rest and never returns while
it still runs), that waits for supervisord's exit (kqueue's NOTE_EXIT on macOS; a pidfd on Linux, where the tests
force this mode with UMEMC_PARENT_DEATH=reaper; a poll elsewhere), then stops every process of the run exactly as
`umemc down` does (`Stack.sweep`: the run's mark, records, cgroups) and logs a `reaped` event. If the reaper itself
is killed, `umemc down` (and the next `umemc up`) still sweep."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from .kernel import wait_exit


def fork(state: Path) -> None:
    """Start the reaper of the process calling this (the wrapper about to exec supervisord); returns in the parent.
    The child execs `python -m umemc.runtime.reaper` with the run's mark in its environment: a forked copy of the
    wrapper would carry the environment the wrapper was started with, unmarked, and nothing would stop it."""
    watched = os.getpid()
    if os.fork() > 0:
        return
    try:
        os.setpgid(0, 0)  # not in supervisord's group: the sweep kills that group
        _detach()
        from ..names import REAPER, RUN_MARK, run_mark

        env = dict(os.environ, **{RUN_MARK: run_mark(state), "UMEMC_MODEL": REAPER})
        argv = [sys.executable, "-I", "-m", "umemc.runtime.reaper", "--state", str(state), "--watch", str(watched)]
        os.execve(sys.executable, argv, env)
    except BaseException as exc:  # noqa: BLE001 - a forked child never returns into the wrapper's code
        with contextlib.suppress(OSError):
            print(f"umemc-reaper: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="umemc-reaper")
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--watch", type=int, required=True, help="supervisord's pid")
    args = p.parse_args(argv)
    from . import control, event_log  # noqa: F401 - loaded before the wait: the sweep starts once supervisord is gone

    try:
        wait_exit(args.watch)
        reap(args.state, args.watch)
    except Exception as exc:  # noqa: BLE001 - said in supervisord's log, the one place anyone will look
        print(f"umemc-reaper: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def _detach() -> None:
    """stdin from /dev/null (nothing reads it); stdout and stderr stay supervisord's log (its launcher gave them)."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


def reap(state: Path, supervisord_pid: int) -> list[int]:
    """Stop every process of the run (`umemc down`'s sweep) and say so in the event log; returns what was killed."""
    from .control import Stack
    from .event_log import EventLog
    from .rundir import RunDir

    run = RunDir.of_state(state)
    killed, left = Stack(run).members.sweep()
    if killed or left:  # the log tolerates damage and a full disk (it says so and goes on): the sweep is done
        log = EventLog(run.events)
        log.add("reaped", None, supervisord_pid=supervisord_pid, pids=killed, left=sorted(left))
        log.close()
    return killed


if __name__ == "__main__":
    sys.exit(main())
