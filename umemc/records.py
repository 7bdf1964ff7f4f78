"""The exec wrapper's text records (part of the runtime contract, umemc/contract.py): plain
dataclasses, so the wrapper, which starts every process of a stack, imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PidRecord:
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


@dataclass(frozen=True)
class CgroupRecord:
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
