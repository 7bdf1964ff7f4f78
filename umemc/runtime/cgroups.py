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
import re
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

from .probes.host import alive
from .rundir import run_mark

CGROUP_ROOT = Path("/sys/fs/cgroup")


def group_name(stack: str, state_dir: Path) -> str:
    return f"umemc-{stack}-{run_mark(state_dir)}"


class Cgroup(NamedTuple):
    version: int
    path: Path

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def set_limits(self, hard: int, soft: int) -> None:
        if self.version == 2:
            (self.path / "memory.max").write_text(str(hard))
            (self.path / "memory.high").write_text(str(max(soft, 1)))
            with contextlib.suppress(OSError):
                (self.path / "memory.oom.group").write_text("1")
            with contextlib.suppress(OSError):
                (self.path / "memory.swap.max").write_text("0")
        else:
            # v1 wants memsw >= limit at every step: raising, memsw goes first; lowering, the limit does
            memsw = self.path / "memory.memsw.limit_in_bytes"  # only with swap accounting: no swap for the worker
            raising = memsw.exists() and hard > int(self._read("memory.limit_in_bytes") or 0)
            if raising:
                memsw.write_text(str(hard))
            (self.path / "memory.limit_in_bytes").write_text(str(hard))
            with contextlib.suppress(OSError):
                (self.path / "memory.soft_limit_in_bytes").write_text(str(soft))
            if not raising:
                with contextlib.suppress(OSError):
                    memsw.write_text(str(hard))

    def enter(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

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


def _own_cgroup(version: int, proc_self: str = "/proc/self/cgroup") -> str | None:
    """The cgroup this process runs in; a process already inside a umemc run's group (a worker
    spawned by supervisord, which sits in the run's `umemc-supervisord` group) gets the cgroup that
    run was created in, so every group of a run is a sibling below one base, never nested."""
    for line in Path(proc_self).read_text().splitlines():
        hid, controllers, path = line.split(":", 2)
        if (version == 2 and hid == "0" and controllers == "") or (version == 1 and "memory" in controllers.split(",")):
            parts = path.split("/")
            inside = [i for i, part in enumerate(parts) if part.startswith("umemc-") and _RUN_SUFFIX.search(part)]
            return "/".join(parts[: inside[0]]) or "/" if inside else path
    return None


_RUN_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # umemc-<stack>-<run id>


def _v2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split(" - ")
        if len(parts) == 2 and parts[1].split()[0] == "cgroup2":
            return Path(parts[0].split()[4])
    return None


class Backend(NamedTuple):
    version: int
    base: Path  # umemc-<stack>-<run>: one group per worker below it

    def group(self, model: str) -> Cgroup:
        return Cgroup(self.version, self.base / model)

    def create(self, model: str, hard: int, soft: int) -> Cgroup:
        self.base.mkdir(exist_ok=True)
        if self.version == 2:
            with contextlib.suppress(OSError):
                (self.base / "cgroup.subtree_control").write_text("+memory")
        g = self.group(model)
        g.path.mkdir(exist_ok=True)
        if hard:  # 0: no limit (supervisord and the enforcer: grouped to be found, never to be killed)
            g.set_limits(hard, soft)
        return g

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
    if not sys.platform.startswith("linux"):
        return None, f"{'macOS' if sys.platform == 'darwin' else sys.platform} has no memory cgroups"
    v2_reason = "cgroup v2 is not mounted"
    mount = _v2_mount()
    if mount is not None:
        own = _own_cgroup(2)
        parent = mount / (own or "/").lstrip("/")
        controllers = (
            (parent / "cgroup.controllers").read_text().split() if (parent / "cgroup.controllers").exists() else []
        )
        if "memory" not in controllers:
            v2_reason = f"cgroup v2 at {parent} has no memory controller"
        elif not os.access(parent, os.W_OK):
            v2_reason = f"cgroup v2 at {parent} is not writable (not delegated)"
        else:
            try:
                if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                    (parent / "cgroup.subtree_control").write_text("+memory")
                return Backend(2, parent / name), "cgroup v2"
            except OSError as exc:
                v2_reason = f"cgroup v2 at {parent}: cannot enable the memory controller for children ({exc.strerror})"
    v1_root = CGROUP_ROOT / "memory"
    if (v1_root / "memory.limit_in_bytes").exists() or (v1_root / "cgroup.procs").exists():
        own = _own_cgroup(1) or "/"
        parent = v1_root / own.lstrip("/")
        if os.access(parent, os.W_OK):
            return Backend(1, parent / name), "cgroup v1 memory controller"
        return None, f"{v2_reason}; cgroup v1 memory controller at {parent} is not writable"
    return None, v2_reason
