"""An `umemc up` in progress, as `down` sees it: `up` holds an exclusive flock on RUN/up.lock from its first step
(before preflight, before the run dir holds anything) until it returns, the file naming its pid and start time.
A `down` that finds the lock held stops that `up` first (SIGINT: it ends as an interrupted command does) and waits
for the lock, so the stack never comes up behind a `down` that said it had nothing to stop. The kernel drops a
flock with its holder, so a killed `up` leaves no lock behind."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

from ..contract import PidRecord
from ..records import read_text
from .probes.host import alive, start_time


class UpInProgress(RuntimeError):
    """Another `umemc up` holds this run dir."""


def hold(path: Path) -> int:
    """The lock for this process (its descriptor, kept open until `up` returns); UpInProgress where another `up`
    holds it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        other = holder(path)
        raise UpInProgress(f"another `umemc up` (pid {other.pid if other else '?'}) is bringing this run up") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {start_time(os.getpid())}\n".encode())
    return fd


def holder(path: Path) -> PidRecord | None:
    """The `up` holding the lock now (its pid record), None where none does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            record = PidRecord.parse("umemc-up", read_text(path, 256))
        except (OSError, ValueError):
            return PidRecord("umemc-up", 0, 0)
        return record if alive(record.pid) and start_time(record.pid) == record.start else PidRecord("umemc-up", 0, 0)
    else:
        return None
    finally:
        os.close(fd)


def stop_up(path: Path, patience_s: float = 60.0) -> PidRecord | None:
    """Stop the `up` holding the lock, if one does, and wait until it let go (at most `patience_s`): the `up`
    stopped, or None. TimeoutError where it holds on."""
    record = holder(path)
    if record is None:
        return None
    if record.pid:
        try:
            os.kill(record.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + patience_s
    while holder(path) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the `umemc up` in progress (pid {record.pid}) did not stop within {patience_s:g} s")
        time.sleep(0.05)
    return record
