"""Per-worker memory cgroups, so the kernel enforces the hard quota the instant it is crossed.

cgroup v2 (what most users have): `memory.max` = hard quota (the kernel OOM-kills inside the group),
`memory.high` = soft quota (throttling), `memory.oom.group = 1` (the whole worker dies together);
OOM kills are counted in `memory.events` (`oom_kill N`). It needs a delegated subtree: the
memory controller enabled in the `cgroup.subtree_control` of the cgroup umemc runs in.
cgroup v1 (our test machines): `memory.limit_in_bytes` = hard, `memory.soft_limit_in_bytes` = soft,
OOM kills counted in `memory.oom_control` (`oom_kill N`, Linux 4.13+).

Groups are created inside the cgroup umemc itself runs in (nested accounting: they never escape
the limits of a container or a systemd unit), named umemc-<stack>-<run id>/<model>. The exec
wrapper records each group's path in the run's state so the enforcer and `umemc down` find it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import NamedTuple

from . import kernel
from .kernel import group_name as group_name
from .probes.host import alive
from .rundir import run_mark


class Cgroup(NamedTuple):
    version: int
    path: Path

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def set_limits(self, hard: int, soft: int) -> None:
        kernel.set_limits(self.version, str(self.path), hard, soft)

    def oom_kills(self) -> int:
        try:
            text = self._read("memory.events" if self.version == 2 else "memory.oom_control")
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def usage(self) -> int:
        try:
            return int(self._read("memory.current" if self.version == 2 else "memory.usage_in_bytes"))
        except (OSError, ValueError):
            return 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except OSError:
            return []

    def kill_all(self, rounds: int = 50) -> list[int]:
        """SIGKILL every process in the group, again and again until it is empty (a process may fork
        while we read the list); cgroup v2's `cgroup.kill` does it in one step where the kernel has it.
        Returns the pids still inside (none, normally)."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
        for _ in range(rounds):
            pids = [p for p in self.pids() if alive(p)]
            if not pids:
                return []
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)
        return [p for p in self.pids() if alive(p)]

    def remove(self) -> bool:
        """rmdir the group (it must hold no process). True when it is gone."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


class Backend(NamedTuple):
    version: int
    base: Path  # umemc-<stack>-<run>: one group per worker below it

    def group(self, model: str) -> Cgroup:
        return Cgroup(self.version, self.base / model)

    def create(self, model: str, hard: int, soft: int) -> Cgroup:
        return Cgroup(self.version, Path(kernel.create(self.version, str(self.base), model, hard, soft)))

    def groups(self) -> list[Cgroup]:
        if not self.base.is_dir():
            return []
        return [Cgroup(self.version, p) for p in sorted(self.base.iterdir()) if p.is_dir()]

    def pids(self) -> list[int]:
        """Every live process in the run's groups: the way to find what a lost supervisord left."""
        return sorted(p for g in self.groups() for p in g.pids() if alive(p))

    def kill_all(self) -> list[int]:
        """SIGKILL every process in every group of the run; returns the pids that survived."""
        left: list[int] = []
        for g in self.groups():
            left += g.kill_all()
        return left

    def remove_all(self) -> list[Path]:
        """Remove every worker group and the base; returns what could not be removed."""
        left = []
        if self.base.is_dir():
            for child in sorted(p for p in self.base.iterdir() if p.is_dir()):
                group = Cgroup(self.version, child)
                for _ in range(50):  # a killed process may still be exiting
                    if group.remove():
                        break
                    time.sleep(0.1)
                else:
                    left.append(child)
            if not left and not Cgroup(self.version, self.base).remove():
                left.append(self.base)
        return left


def run_backends(state_dir: Path) -> list[Backend]:
    """The cgroup bases of the run whose state is STATE_DIR, found by name (umemc-*-<run id>) below the
    cgroup umemc runs in: no record, no plan.json needed (either may be lost or corrupt)."""
    backend, _ = detect("probe")
    if backend is None:
        return []
    rid = run_mark(state_dir)
    parent = backend.base.parent
    try:
        names = sorted(
            p.name
            for p in parent.iterdir()
            if p.is_dir() and p.name.startswith("umemc-") and p.name.endswith(f"-{rid}")
        )
    except OSError:
        return []
    return [Backend(backend.version, parent / n) for n in names]


def detect(name: str) -> tuple[Backend | None, str]:
    """The cgroup backend available to this process, or None with the reason."""
    found = kernel.detect(name)
    if isinstance(found, str):
        return None, found
    version, base = found
    return Backend(version, Path(base)), "cgroup v2" if version == 2 else "cgroup v1 memory controller"
