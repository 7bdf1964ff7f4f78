"""The enforcer: a program inside the same supervisord (restarted if it dies), reading plan.json. Two run: one
enforces, holding the run's enforcer lock; the other (umemc-enforcer-standby) waits on the lock, ready, and takes
over the moment the first dies, while supervisord restarts that one as the new standby.

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
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

from .. import without_openssl

__all__ = ["main"]


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
    lock = _take_over(enforcer.run_dir.enforcer_lock, STANDBY_DEFERS_S if args.standby else 0.0)
    enforcer.reopen_log()
    enforcer.on_hup()  # the plan as it is now, in case it changed while this one waited (read in its first tick)
    try:
        enforcer.run()
    finally:
        if lock >= 0:
            os.close(lock)
    return 0


STANDBY_DEFERS_S = 10.0  # at a stack's start the standby leaves the lock to umemc-enforcer this long, at most


def _take_over(path: Path, defer_s: float) -> int:
    """The run's enforcer lock, once no other enforcer holds it: two run (umemc-enforcer and its standby), one
    enforces; the other, its imports done and the plan read, waits here and goes on the moment the kernel
    releases the lock of the one that died (a SIGTERM ends the wait). `defer_s`: a free lock is left to the
    other that long (the standby at a stack's start: umemc-enforcer enforces, and writes its own log)."""
    fd = _lock_file(path)
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
        print("umemc-enforcer: standby: another enforcer runs; taking over when it stops", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("umemc-enforcer: the enforcer that ran stopped: enforcing", file=sys.stderr, flush=True)
    return fd


def _lock_file(path: Path) -> int | None:
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
    print(f"umemc-enforcer: cannot lock {path} ({problem}): enforcing without the standby's lock", file=sys.stderr,
          flush=True)  # fmt: skip
    return None
