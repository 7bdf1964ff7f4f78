"""The enforcer: a program inside the same supervisord (restarted if it dies), reading plan.json. Two run: one
enforces, holding the run's enforcer lock; the other, the standby, waits on the lock, ready, and takes over the
moment the first dies, while supervisord restarts that one. Where the stack has a gateway, the standby is a thread
of the gateway's process (`Standby`: the gateway's imports are most of the enforcer's, so it costs little there,
where a process of its own costs a whole interpreter: bench/own_memory.py), and it hands the lock back to the
restarted enforcer as soon as that one waits for it; without a gateway it is the program umemc-enforcer-standby,
and the restarted one waits as the new standby.

Every sample_interval it reads each worker's whole process tree (kept-open statm, task children)
and its GPU-side memory (DRM fdinfo; nvidia-smi now and then), and
- soft quota crossed: event `soft_limit`, once per crossing (re-armed below 95% of it);
- hard quota crossed: SIGKILL the worker's process group at once, event `hard_limit_kill`
  (by enforcer); supervisord restarts it; after max_kills within kill_window it is left stopped;
- a kernel OOM kill in the worker's cgroup: event `hard_limit_kill` (by kernel);
- usage climbing faster than leak_threshold per minute over leak_window: `leak_suspected`;
- system pressure above evict_above: stop workers, lowest priority first, then least recently
  active, until pressure is below load_below (`evict`); the victim with requests in flight at the
  gateway is waited for (`evict_deferred`), never cut off, and no higher priority taken instead.
A worker near its hard quota is sampled every FAST_S in between, so a fast leak is caught early.

Its parts: `sampler` (what a worker holds, the machine's pressure), `rules` (the quota rules, pure), `checks`
(each rule's answer turned into a kill, a stop or an event), `worker_state` (each worker's quota, measurements and
phase: one state machine), `pressure` (the guard), `status_file` (enforcer.json), `loop` (the loop that runs them).

    python -m umemc.runtime.enforcer --bundle BUNDLE_DIR
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from .. import without_openssl

if TYPE_CHECKING:
    from .loop import Enforcer

__all__ = ["Standby", "main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="umemc-enforcer")
    p.add_argument("--bundle", required=True)
    p.add_argument("--standby", action="store_true", help="leave the lock to umemc-enforcer at a stack's start")
    args = p.parse_args(argv)
    if argv is None:  # this process is the enforcer
        without_openssl()
    from .loop import Enforcer

    enforcer = Enforcer(Path(args.bundle).resolve())
    signal.signal(signal.SIGHUP, enforcer.on_hup)  # a standby told of a new plan while it waits: not its end
    run = enforcer.run_dir
    lock = _take_over(run.enforcer_lock, STANDBY_DEFERS_S if args.standby else 0.0, ready=run.enforcer_ready)
    enforcer.on_hup()  # the plan as it is now, in case it changed while this one waited (read in its first tick)
    try:
        enforcer.run()
    finally:
        if lock >= 0:
            os.close(lock)
    return 0


STANDBY_DEFERS_S = 10.0  # at a stack's start the standby leaves the lock to umemc-enforcer this long, at most
HANDED_BACK_S = 10.0  # a standby that handed the lock back leaves it free this long, at most, to the one it waits for
PROCESS = "umemc-enforcer"  # what an enforcer says of itself in its log


def _take_over(path: Path, defer_s: float, *, ready: Path | None = None, who: str = PROCESS) -> int:
    """The run's enforcer lock, once no other enforcer holds it: two run (umemc-enforcer and its standby), one
    enforces; the other, its imports done and the plan read, waits here and goes on the moment the kernel
    releases the lock of the one that died (a SIGTERM ends the wait). `defer_s`: a free lock is left to the
    other that long (the standby at a stack's start: umemc-enforcer enforces, and writes its own log). `ready`:
    where a process that waits says so (`pid starttime`) while it waits: a standby enforcing in the gateway's
    process gives the lock back to it."""
    fd = _lock_file(path, who)
    if fd is None:
        return -1
    until = time.monotonic() + defer_s
    try:
        while True:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if time.monotonic() >= until:
                break
            fcntl.flock(fd, fcntl.LOCK_UN)  # free: the other has not taken it yet
            time.sleep(0.05)
    except BlockingIOError:
        if ready is not None:
            _say_ready(ready)
        print(f"{who}: standby: another enforcer runs; taking over when it stops", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if ready is not None:
            _unsay_ready(ready)
        print(f"{who}: the enforcer that ran stopped: enforcing", file=sys.stderr, flush=True)
    return fd


def _say_ready(ready: Path) -> None:
    from ...records import pid_line, write_atomic
    from ..probes.host import start_time

    try:
        write_atomic(ready, pid_line(os.getpid(), start_time(os.getpid())))
    except OSError:  # a full disk: the standby in the gateway keeps the lock until it is stopped
        pass


def _unsay_ready(ready: Path) -> None:
    from ..rundir import read_record

    record = read_record(ready)
    if record is not None and record.pid == os.getpid():
        with contextlib.suppress(OSError):
            ready.unlink()


def waits(ready: Path) -> bool:
    """Whether an enforcer process other than this one waits on the lock (its `ready` record names it, alive)."""
    from ..members import same_process
    from ..rundir import read_record

    record = read_record(ready)
    return record is not None and record.pid != os.getpid() and same_process(record)


GATEWAY_STANDBY = "umemc-gateway: standby enforcer"


class _Asked:
    """Whether to stop enforcing: once `stopped` is set, or once `ask` says so; remembers what `ask` said (why the
    loop that asked it ended)."""

    def __init__(self, ask: Callable[[], bool], stopped: threading.Event):
        self.ask, self.stopped, self.said = ask, stopped, False

    def __call__(self) -> bool:
        if self.stopped.is_set():
            return True
        self.said = self.ask()
        return self.said


class Standby:
    """The standby enforcer as a thread of the gateway's process (a daemon thread: it ends with the process). It
    waits on the run's enforcer lock with its Enforcer built (the plan read); once the enforcer process dies it
    enforces, without signal handlers (a thread has none: the gateway passes on its SIGHUP, `on_hup`), until the
    restarted enforcer process waits for the lock (its `enforcer.ready` record), then gives the lock back and
    waits again. An enforcer that fails (a bug) is said, and built afresh a second later."""

    def __init__(self, bundle: Path, pause: Callable[[float], object] | None = None):
        self.bundle = bundle
        self.stopped = threading.Event()
        self.pause = pause or self.stopped.wait
        self.enforcer: Enforcer | None = None
        self.thread = threading.Thread(target=self._serve, name="umemc-enforcer-standby", daemon=True)

    def start(self) -> Standby:
        self.thread.start()
        return self

    def stop(self) -> None:
        """It ends at its next turn, or within a second where it enforces (a wait on the lock is not cut short: the
        thread ends with the process)."""
        self.stopped.set()

    def on_hup(self) -> None:
        """The bundle's plan changed: the enforcer takes it on at its next tick (or when it takes over)."""
        if self.enforcer is not None:
            self.enforcer.on_hup()

    def _serve(self) -> None:
        from .loop import Enforcer  # in this thread: the gateway serves meanwhile

        defer = STANDBY_DEFERS_S
        while not self.stopped.is_set():
            try:
                self.enforcer = enforcer = Enforcer(self.bundle)
                run = enforcer.run_dir
                lock = _take_over(run.enforcer_lock, defer, who=GATEWAY_STANDBY)
                if lock < 0:
                    return  # no lock to be had: the enforcer process enforces without it, and this one not at all
                asked = _Asked(partial(waits, run.enforcer_ready), self.stopped)
                try:
                    enforcer.on_hup()  # the plan as it is now (read in its first tick)
                    enforcer.run(signals=False, until=asked)
                finally:
                    os.close(lock)  # the process that waits has it at once (and takes back its ready record)
                if self.stopped.is_set():
                    return
                if asked.said:
                    print(f"{GATEWAY_STANDBY}: the enforcer process waits: handed the lock back", file=sys.stderr,
                          flush=True)  # fmt: skip
                    defer = HANDED_BACK_S
                else:  # a plan that changes more than its models: enforced afresh on it, at once
                    defer = 0.0
            except Exception as exc:  # noqa: BLE001 - the gateway's process must outlive a bug in its standby
                print(f"{GATEWAY_STANDBY}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                defer = STANDBY_DEFERS_S
                self.pause(1.0)


def _lock_file(path: Path, who: str = PROCESS) -> int | None:
    """The lock's file, opened; something else at its path (a directory, a link: a state dir tampered with) is
    removed first, never followed. None where it still cannot be had: this enforcer then enforces without the
    lock (the standby too, once it cannot have it: two then enforce at once, each saying what it does), said."""
    import shutil

    for _ in (1, 2):
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            problem = exc
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:
                break
    print(f"{who}: cannot lock {path} ({problem}): enforcing without the standby's lock", file=sys.stderr,
          flush=True)  # fmt: skip
    return None
