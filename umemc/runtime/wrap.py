"""The exec wrapper every process of a stack starts through (workers, the enforcer, the gateway, and
supervisord itself):

    python -m umemc.runtime.wrap --stack S --model M --hard N --soft N --cgroup auto|off --state DIR
                                 [--unset VAR]... [--outlive-parent] -- ARGV…

Before anything allocates it
- asks the kernel to SIGKILL it when its parent (supervisord) dies (PR_SET_PDEATHSIG): a `kill -9`
  of supervisord takes every worker with it instead of leaving orphans that hold memory; where the kernel
  has no such signal (macOS), the wrapper that becomes supervisord (--reaper) forks umemc.runtime.reaper,
  which stops the run's processes when supervisord dies;
- places itself in its own memory cgroup (hard quota = the kernel's limit; 0 = no limit), recorded
  in DIR/cgroups/M, so `umemc down` finds every process of the stack by cgroup membership, double-
  forked `setsid` children included, even when supervisord and every other record are gone;
- records `pid starttime` in DIR/pids/M (the fallback where no cgroup can be had);
- removes the variables named by --unset (the gateway's token) from the environment;
- marks the environment with the run's id (UMEMC_RUN), which every descendant inherits;
- gives the model's own variables their names (supervisord passes them as UMEMC_ENV_<NAME>, and this
  interpreter runs isolated, -I, so a PYTHONPATH or PYTHONHOME meant for the worker cannot change it);
then execs ARGV: the worker keeps this pid, so supervisord, the enforcer and the kernel see one process."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..names import RUN_MARK
from ..records import CgroupRecord, PidRecord, write_atomic
from .probes.host import parent_death_signal, start_time
from .rundir import RunDir, run_mark

if TYPE_CHECKING:
    import argparse

PR_SET_PDEATHSIG = 1  # linux/prctl.h


CGROUP_CHOICES = ("auto", "off")
VALUED = {"--stack": "stack", "--model": "model", "--hard": "hard", "--soft": "soft", "--cgroup": "cgroup",
          "--state": "state", "--unset": "unset"}  # fmt: skip
NUMBERS = ("hard", "soft")  # argparse's type=int: a negative number is a value, not an option
FLAGS = {"--outlive-parent": "outlive_parent", "--reaper": "reaper", "--daemon": "daemon"}


class Args(NamedTuple):
    """The wrapper's options (see the module's docstring)."""

    stack: str
    model: str
    hard: int
    soft: int
    state: str
    command: list[str]
    cgroup: str = "auto"
    unset: tuple[str, ...] = ()
    outlive_parent: bool = False
    reaper: bool = False
    daemon: bool = False


def parser() -> argparse.ArgumentParser:
    """--help, and the errors of an argv no bundle writes (quick_parse leaves those to it)."""
    import argparse

    p = argparse.ArgumentParser(prog="umemc-wrap")
    p.add_argument("--stack", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--hard", type=int, required=True)
    p.add_argument("--soft", type=int, required=True)
    p.add_argument("--cgroup", choices=CGROUP_CHOICES, default="auto")
    p.add_argument("--state", required=True)
    p.add_argument("--unset", action="append", default=[], metavar="VAR")
    p.add_argument("--outlive-parent", action="store_true", help="no parent-death signal (supervisord itself)")
    p.add_argument(
        "--reaper",
        action="store_true",
        help="fork a process that stops the run's processes when this one (supervisord) dies, where no parent-death "
        "signal does (macOS)",
    )
    p.add_argument(
        "--daemon",
        action="store_true",
        help="fork into a new session first; the caller's child "
        "exits at once (so the command is never the caller's zombie)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def quick_parse(argv: list[str]) -> Args | None:
    """The argv a bundle writes (each option as its own word, its value the next, then `-- ARGV`), read without
    argparse: importing it, with the help formatter it builds, was a fifth of the wrapper's start. None for
    anything else (--help, an abbreviation, `--opt=value`, a missing or odd value), which argparse then reads
    and answers as it always did."""
    got: dict[str, Any] = {}
    unset: list[str] = []
    i = 0
    while i < len(argv) and argv[i] != "--":
        word = argv[i]
        if word in FLAGS:
            got[FLAGS[word]] = True
            i += 1
            continue
        key = VALUED.get(word)
        if key is None or i + 1 >= len(argv) or (argv[i + 1].startswith("-") and key not in NUMBERS):
            return None
        value = argv[i + 1]
        if key in NUMBERS:
            try:
                got[key] = int(value)
            except ValueError:
                return None
        elif key == "unset":
            unset.append(value)
        elif key == "cgroup" and value not in CGROUP_CHOICES:
            return None
        else:
            got[key] = value
        i += 2
    command = argv[i + 1 :]
    if i == len(argv) or not command or not {"stack", "model", "hard", "soft", "state"} <= got.keys():
        return None
    return Args(command=command, unset=tuple(unset), **got)


def parse(argv: list[str]) -> Args:
    """argparse's reading of the argv (it exits with its message for one it refuses)."""
    p = parser()
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        p.error("no command after --")
    return Args(ns.stack, ns.model, ns.hard, ns.soft, ns.state, command, ns.cgroup, tuple(ns.unset),
                ns.outlive_parent, ns.reaper, ns.daemon)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = quick_parse(words) or parse(words)
    command = args.command
    if args.daemon:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    state = Path(args.state)
    if args.reaper:  # before this process enters the run's cgroup: the sweep kills that group's members
        from .reaper import fork

        fork(state)
    if not args.outlive_parent and not die_with_parent():
        print(f"umemc-wrap: the parent of {args.model} died before it started; not starting", file=sys.stderr)
        return 1
    run = RunDir.of_state(state)
    record = run.cgroups / args.model
    if args.cgroup == "auto":
        place(args.stack, args.model, args.hard, args.soft, state, record)
    else:
        forget(record)
    # the pid and its start time name one process for good: a record never makes `down` kill a later process
    write_record(run.pids / args.model, PidRecord(args.model, os.getpid(), start_time(os.getpid())).render())
    for name in args.unset:
        os.environ.pop(name, None)
    worker_env(os.environ)
    command = fill_state(command, state)
    # the run's mark, inherited by everything this process starts (double-forked daemons too): `umemc down`
    # finds the run's processes by it where no cgroup can, and kills nothing that does not carry it
    os.environ[RUN_MARK] = run_mark(state)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"umemc-wrap: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


WORKER_ENV_PREFIX = "UMEMC_ENV_"  # umemc.compile.WORKER_ENV_PREFIX


STATE_PLACEHOLDER = "@UMEMC_STATE@"  # an argv element beginning with it names a path in the run's state dir


def fill_state(command: list[str], state: Path) -> list[str]:
    """The run's state dir into the worker's argv (llama-server's --slot-save-path): the bundle cannot name it,
    it moves with the run dir; the directory is created for the worker."""
    out = []
    for arg in command:
        if arg.startswith(STATE_PLACEHOLDER):
            arg = str(state.resolve()) + arg[len(STATE_PLACEHOLDER) :]
            with contextlib.suppress(OSError):
                Path(arg).mkdir(mode=0o700, parents=True, exist_ok=True)
        out.append(arg)
    return out


def worker_env(env: MutableMapping[str, str]) -> None:
    """The model's own variables arrive as UMEMC_ENV_<NAME> (this interpreter, started with -I, never read
    them): give them their names for the worker alone."""
    for key in [k for k in env if k.startswith(WORKER_ENV_PREFIX)]:
        env[key[len(WORKER_ENV_PREFIX) :]] = env.pop(key)


def die_with_parent() -> bool:
    """PR_SET_PDEATHSIG(SIGKILL); it survives the exec. False when the parent is already gone (we
    were reparented before the call, so the signal would never come). Where there is no such signal, the reaper
    stands in (True)."""
    if not parent_death_signal():
        return True
    import ctypes  # only here: ctypes costs ~40 ms to import

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux: the process group still dies together
        return True
    return os.getppid() == parent


def write_record(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as exc:  # a full disk must not stop the worker: cgroups and the run's mark still find it
        print(f"umemc-wrap: cannot record {path}: {exc.strerror}; starting anyway", file=sys.stderr)


def forget(record: Path) -> None:
    """A stale record goes; a read-only or full state dir must not stop the start (said, not fatal)."""
    try:
        record.unlink(missing_ok=True)
    except OSError as exc:
        print(f"umemc-wrap: cannot remove {record}: {exc.strerror}; starting anyway", file=sys.stderr)


def place(stack: str, model: str, hard: int, soft: int, state: Path, record: Path) -> None:
    from .cgroups import detect, group_name

    backend, reason = detect(group_name(stack, state))
    if backend is None:
        print(f"umemc-wrap: no kernel enforcement for {model}: {reason}", file=sys.stderr)
        forget(record)
        return
    try:
        group = backend.create(model, hard, soft)
        group.enter(os.getpid())
    except OSError as exc:
        print(f"umemc-wrap: no kernel enforcement for {model}: {exc}", file=sys.stderr)
        return
    write_record(record, CgroupRecord(backend.version, group.path, os.getpid()).render())


if __name__ == "__main__":
    sys.exit(main())
