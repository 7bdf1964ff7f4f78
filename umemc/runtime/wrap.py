"""The exec wrapper every process of a stack starts through (workers, the enforcer, the gateway, and
supervisord itself):

    python -m umemc.runtime.wrap --stack S --model M --hard N --soft N --cgroup auto|off --state DIR
                                 [--unset VAR]... [--keep-secrets] [--helpers HOST:PORT,...] [--outlive-parent]
                                 -- ARGV…

Before anything allocates it
- asks the kernel to SIGKILL it when its parent (supervisord) dies (PR_SET_PDEATHSIG): a `kill -9`
  of supervisord takes every worker with it instead of leaving orphans that hold memory; where the kernel
  has no such signal (macOS), the wrapper that becomes supervisord (--reaper) forks umemc.runtime.reaper,
  which stops the run's processes when supervisord dies;
- places itself in its own memory cgroup (hard quota = the kernel's limit; 0 = no limit), recorded
  in DIR/cgroups/M, so `umemc down` finds every process of the stack by cgroup membership, double-
  forked `setsid` children included, even when supervisord and every other record are gone;
- records `pid starttime` in DIR/pids/M (the fallback where no cgroup can be had);
- removes the variables `umemc up` named in DIR/secrets/unset-env (the gateway token's), and those named by
  --unset, from the environment, unless --keep-secrets (the gateway's own wrapper): read at each start, so a
  changed token_env changes no worker's command (a gateway-only change restarts no worker);
- marks the environment with the run's id (UMEMC_RUN), which every descendant inherits;
- gives the model's own variables their names (supervisord passes them as UMEMC_ENV_<NAME>, and this
  interpreter runs isolated, -I, so a PYTHONPATH or PYTHONHOME meant for the worker cannot change it);
- waits at DIR/gates/M, where the gateway left one, until the processes of the models it evicts for M have
  exited (pass_gate): a cold start's wrapper starts while they stop;
- a model split across nodes: waits until the RPC servers holding its other parts accept a connection
  (--helpers, up to HELPERS_WAIT_S): its llama-server would otherwise exit at once where a node is still starting;
then execs ARGV: the worker keeps this pid, so supervisord, the enforcer and the kernel see one process.

A cold start waits for all of this, so it imports next to nothing (os, sys, and ctypes for the prctl): its
records, cgroup files and run mark are written on path strings (umemc.records, umemc.runtime.kernel), its options
are read without argparse. ~6 ms beyond the interpreter's own start, where it was ~30 ms with typing and pathlib."""

from __future__ import annotations

import os
import sys

from ..names import CGROUPS_DIR, GATES_DIR, PIDS_DIR, RUN_MARK, SECRETS_DIR, UNSET_FILE, run_mark
from ..records import cgroup_line, pid_line, read_text, write_atomic
from . import kernel

TYPE_CHECKING = False  # typing's own constant would import typing
if TYPE_CHECKING:
    import argparse
    from collections.abc import MutableMapping
    from typing import Any


CGROUP_CHOICES = ("auto", "off")
VALUED = {"--stack": "stack", "--model": "model", "--hard": "hard", "--soft": "soft", "--cgroup": "cgroup",
          "--state": "state", "--unset": "unset", "--helpers": "helpers"}  # fmt: skip
NUMBERS = ("hard", "soft")  # argparse's type=int: a negative number is a value, not an option
FLAGS = {"--outlive-parent": "outlive_parent", "--reaper": "reaper", "--daemon": "daemon",
         "--keep-secrets": "keep_secrets"}  # fmt: skip


class Args:
    """The wrapper's options (see the module's docstring). A plain class: `typing.NamedTuple` would import typing,
    as much as the rest of the wrapper's imports together."""

    __slots__ = ("stack", "model", "hard", "soft", "state", "command", "cgroup", "unset", "outlive_parent", "reaper",
                 "daemon", "helpers", "keep_secrets")  # fmt: skip

    def __init__(self, stack: str, model: str, hard: int, soft: int, state: str, command: list[str],
                 cgroup: str = "auto", unset: tuple[str, ...] = (), *, outlive_parent: bool = False,
                 reaper: bool = False, daemon: bool = False, helpers: str = "",
                 keep_secrets: bool = False) -> None:  # fmt: skip
        self.stack, self.model, self.hard, self.soft, self.state = stack, model, hard, soft, state
        self.command, self.cgroup, self.unset = command, cgroup, unset
        self.outlive_parent, self.reaper, self.daemon = outlive_parent, reaper, daemon
        self.helpers, self.keep_secrets = helpers, keep_secrets

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Args(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"


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
    p.add_argument("--helpers", default="", metavar="HOST:PORT,...", help="RPC servers to wait for before the start")
    p.add_argument("--outlive-parent", action="store_true", help="no parent-death signal (supervisord itself)")
    p.add_argument(
        "--keep-secrets", action="store_true", help="keep the variables `up` names for removal (the gateway)"
    )
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
                outlive_parent=ns.outlive_parent, reaper=ns.reaper, daemon=ns.daemon,
                helpers=ns.helpers, keep_secrets=ns.keep_secrets)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = quick_parse(words) or parse(words)
    command = args.command
    if args.daemon:
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    state = os.path.realpath(args.state)  # supervisord's config spells it BUNDLE/../state
    if args.reaper:  # before this process enters the run's cgroup: the sweep kills that group's members
        from pathlib import Path

        from .reaper import fork

        fork(Path(state))
    if not args.outlive_parent and not die_with_parent():
        print(f"umemc-wrap: the parent of {args.model} died before it started; not starting", file=sys.stderr)
        return 1
    record = os.path.join(state, CGROUPS_DIR, args.model)
    if args.cgroup == "auto":
        place(args.stack, args.model, args.hard, args.soft, state, record)
    else:
        forget(record)
    # the pid and its start time name one process for good: a record never makes `down` kill a later process
    write_record(os.path.join(state, PIDS_DIR, args.model), pid_line(os.getpid(), start_time(os.getpid())))
    for name in (*args.unset, *([] if args.keep_secrets else unset_names(state))):
        os.environ.pop(name, None)
    worker_env(os.environ)
    command = fill_state(command, state)
    # the run's mark, inherited by everything this process starts (double-forked daemons too): `umemc down`
    # finds the run's processes by it where no cgroup can, and kills nothing that does not carry it
    os.environ[RUN_MARK] = run_mark(state)
    refusal = pass_gate(os.path.join(state, GATES_DIR, args.model))
    if not refusal and args.helpers:
        refusal = wait_helpers(args.helpers.split(","), HELPERS_WAIT_S)
    if refusal:
        print(f"umemc-wrap: not starting {args.model}: {refusal}", file=sys.stderr)
        return 1
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"umemc-wrap: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


WORKER_ENV_PREFIX = "UMEMC_ENV_"  # umemc.compile.bundle.WORKER_ENV_PREFIX


STATE_PLACEHOLDER = "@UMEMC_STATE@"  # an argv element beginning with it names a path in the run's state dir


def fill_state(command: list[str], state: str) -> list[str]:
    """The run's state dir (resolved) into the worker's argv (llama-server's --slot-save-path): the bundle cannot
    name it, it moves with the run dir; the directory is created for the worker."""
    out = []
    for arg in command:
        if arg.startswith(STATE_PLACEHOLDER):
            arg = state + arg[len(STATE_PLACEHOLDER) :]
            try:
                os.makedirs(arg, mode=0o700, exist_ok=True)
            except OSError:
                pass
        out.append(arg)
    return out


def unset_names(state: str) -> list[str]:
    """The variables `umemc up` named for removal (the gateway token's): none where it named none."""
    try:
        return read_text(os.path.join(state, SECRETS_DIR, UNSET_FILE), 64 * 1024).split()
    except OSError:
        return []


def worker_env(env: MutableMapping[str, str]) -> None:
    """The model's own variables arrive as UMEMC_ENV_<NAME> (this interpreter, started with -I, never read
    them): give them their names for the worker alone."""
    for key in [k for k in env if k.startswith(WORKER_ENV_PREFIX)]:
        env[key[len(WORKER_ENV_PREFIX) :]] = env.pop(key)


def die_with_parent() -> bool:
    """PR_SET_PDEATHSIG(SIGKILL); it survives the exec. False when the parent is already gone (we
    were reparented before the call, so the signal would never come). Where there is no such signal, the reaper
    stands in (True)."""
    if not kernel.parent_death_signal():
        return True
    parent = os.getppid()
    kernel.kill_with_parent()  # where it fails (no prctl), the process group still dies together
    return os.getppid() == parent


def start_time(pid: int) -> int:
    if sys.platform.startswith("linux"):
        from .probes.proc import LinuxProcesses  # /proc read with os alone

        return LinuxProcesses().start_time(pid)
    from .probes.host import start_time as of_platform  # psutil

    return of_platform(pid)


def write_record(path: str, text: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, text)
    except OSError as exc:  # a full disk must not stop the worker: cgroups and the run's mark still find it
        print(f"umemc-wrap: cannot record {path}: {exc.strerror}; starting anyway", file=sys.stderr)


def forget(record: str) -> None:
    """A stale record goes; a read-only or full state dir must not stop the start (said, not fatal)."""
    try:
        os.unlink(record)
    except FileNotFoundError:
        pass
    except OSError as exc:
        print(f"umemc-wrap: cannot remove {record}: {exc.strerror}; starting anyway", file=sys.stderr)


def place(stack: str, model: str, hard: int, soft: int, state: str, record: str) -> None:
    found = kernel.detect(kernel.group_name(stack, state))
    if isinstance(found, str):
        print(f"umemc-wrap: no kernel enforcement for {model}: {found}", file=sys.stderr)
        forget(record)
        return
    version, base = found
    try:
        group = kernel.create(version, base, model, hard, soft)
        kernel.enter_self(version, group)
    except OSError as exc:
        print(f"umemc-wrap: no kernel enforcement for {model}: {exc}", file=sys.stderr)
        return
    write_record(record, cgroup_line(version, group, os.getpid()))


def pass_gate(gate: str) -> str | None:
    """Wait at the model's gate, where the gateway left one: it starts a cold model while the models it evicts for
    it are still stopping (this interpreter's start and the cgroup move overlap their stop), and the worker, which
    allocates at once, runs only after their processes have exited (their memory is free). The gate
    (RunDir.gate) is `until <unix time>` and a `pid starttime name` line a process; the gateway removes it once
    they are stopped, or stops this wrapper first when their stop fails. None to go on; else why not: a victim
    still running at the deadline, or a gate that cannot be read (a corrupt gate never lets a worker start beside
    memory not yet free)."""
    import time

    try:
        with open(gate) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot read its gate {gate}: {exc.strerror}"
    try:
        lines = [line.split() for line in text.splitlines() if line.strip()]
        if not lines or lines[0][0] != "until" or len(lines[0]) != 2:
            raise ValueError
        until = float(lines[0][1])
        waits = [(int(pid), int(start), name) for pid, start, name in lines[1:]]
    except ValueError:
        return f"its gate {gate} is not `until T` and `pid starttime name` lines"
    for pid, start, name in waits:
        if start_time(pid) != start:  # gone (0), or the pid is another process's now
            continue
        if not kernel.wait_exit(pid, max(0.0, until - time.time())):
            return f"{name} (pid {pid}), which it evicts, was still running at its gate's deadline"
    return None


HELPERS_WAIT_S = 60.0  # how long a split model's start waits for the RPC servers of its other nodes


def endpoint_parts(endpoint: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 address in brackets or bare) as (host, port)."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def silent(endpoints: list[str], timeout: float) -> list[str]:
    """The endpoints (HOST:PORT) that do not accept a connection now. Each connection is closed at once: an RPC
    server takes it as a client that left."""
    import socket

    out = []
    for endpoint in endpoints:
        try:
            socket.create_connection(endpoint_parts(endpoint), timeout=timeout).close()
        except (OSError, ValueError):
            out.append(endpoint)
    return out


def wait_helpers(endpoints: list[str], within: float) -> str | None:
    """Wait until every RPC server (HOST:PORT) accepts a connection, at most `within` seconds. None to go on; else
    which ones did not."""
    import time

    deadline = time.monotonic() + within
    left = list(endpoints)
    while True:
        left = silent(left, 1.0)
        if not left:
            return None
        if time.monotonic() >= deadline:
            return (
                f"the RPC server{'s' if len(left) > 1 else ''} of its other nodes at {', '.join(left)} did not "
                f"answer within {within:g} s: start the stack on those nodes (umemc up BUNDLE/nodes/NAME)"
            )
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
