"""The exec wrapper's text records (part of the runtime contract, umemc/contract.py): named tuples, so the wrapper,
which starts every process of a stack, imports nothing heavy (`dataclasses` alone was a third of its start)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import NamedTuple


def write_atomic(path: Path, text: str, mode: int = 0o600, durable: bool = False) -> None:
    """Replace a small state file in one step (a reader sees the old or the new, never half), with
    its mode set at creation: a secret is never briefly readable by others. durable: on disk before it
    returns (the file and the directory entry fsynced), for what has been promised to a client."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with open(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class PidRecord(NamedTuple):
    """state/pids/<name>: `pid starttime` (field 22 of /proc/PID/stat: with the pid, one process)."""

    name: str
    pid: int
    start: int

    def render(self) -> str:
        return f"{self.pid} {self.start}\n"

    @classmethod
    def parse(cls, name: str, text: str) -> PidRecord:
        pid, start = text.split()[:2]
        return cls(name, int(pid), int(start))


class CgroupRecord(NamedTuple):
    """state/cgroups/<name>: `version path pid` of the memory cgroup the wrapper put the process in."""

    version: int
    path: Path
    pid: int

    def render(self) -> str:
        return f"{self.version} {self.path} {self.pid}\n"

    @classmethod
    def parse(cls, text: str) -> CgroupRecord:
        version, path, pid = text.split()[:3]
        return cls(int(version), Path(path), int(pid))
