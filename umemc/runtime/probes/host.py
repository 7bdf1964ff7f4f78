"""One interface to the machine umemc runs on, for every platform: `Processes` (the process table, trees, what a
process holds) and `Box` (available memory, swap, the OS's own pressure signal, the GPU window's use). The
enforcer's quota rules, pressure guard, leak and swap watch, `down`'s sweep and preflight read only these, so
they are the same code on Linux and macOS.

- Linux: umemc.runtime.probes.proc (direct /proc reads on kept-open descriptors) and `LinuxBox`
  (/proc/meminfo, amdgpu's GTT counters): psutil's equivalents cost 5.5-7x the CPU at 50-100 workers
  (bench/sampler.py, bench/RESULTS.md), so Linux keeps them.
- macOS: umemc.runtime.probes.darwin (psutil for the process table, proc_pid_rusage's phys_footprint for what a
  process holds, sysctl for the kernel's pressure level, swap and the wired limit).
- Anything else psutil runs on: psutil alone (`PsutilBox`).

`UMEMC_PROBES` picks another set: `linux`, `psutil`, `darwin`, or `module:function` (a factory taking the
platform kind, GPU window and evict_above: umemc.testing.mac_probes feeds the macOS probes from fixture outputs,
which is how the macOS code paths run in CI)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import NamedTuple, Protocol

from ...names import RUN_MARK
from .swap import Swap


class Processes(Protocol):
    name: str
    memory_figure: str  # rss | phys_footprint: what `memory` reads

    def alive(self, pid: int) -> bool: ...
    def start_time(self, pid: int) -> int: ...
    def run_environ(self, pid: int) -> dict[str, str]: ...
    def cmdline(self, pid: int) -> list[str]: ...
    def pids(self) -> list[int]: ...
    def children(self, pid: int) -> frozenset[int]: ...
    def descendants(self, root: int) -> list[int]: ...
    def memory(self, pid: int) -> int: ...
    def swapped(self, pid: int) -> int | None: ...
    def cpu_ticks(self, pid: int) -> int: ...
    def forget(self, pid: int) -> None: ...
    def prune(self, alive: set[int]) -> None: ...
    def close(self) -> None: ...


class Box(Protocol):
    available_name: str  # what `available` is called on this platform (in messages)

    def available(self) -> int | None: ...
    def swap(self) -> Swap | None: ...
    def level(self) -> str | None: ...
    def os_pressure(self, usable: int) -> float: ...
    def gpu_share(self) -> float: ...


class Probes(NamedTuple):
    processes: Processes
    box: Box
    platform: str  # linux | darwin | another sys.platform
    cgroups: bool  # memory cgroups can exist here (Linux): the kernel may enforce the hard quotas


# -- Linux's box ----------------------------------------------------------------------------------------------


class LinuxBox:
    """MemAvailable re-read from a kept-open /proc/meminfo each sample (the hot path); swap from the same file; the
    GPU window's use from amdgpu's mem_info_gtt_used / mem_info_gtt_total on an AMD APU."""

    available_name = "MemAvailable"

    def __init__(self, kind: str = "cpu", meminfo: str | None = None, drm_root: str | None = None):
        from . import hostroot  # the machine's files, or a recorded machine's (UMEMC_HOST_ROOT)

        self.kind = kind
        self.meminfo = meminfo or str(hostroot.path("/proc/meminfo"))
        self.drm_root = drm_root or str(hostroot.path("/sys/class/drm"))
        self._fd: int | None = None

    def _data(self) -> bytes:
        if self._fd is None:
            self._fd = os.open(self.meminfo, os.O_RDONLY)
        return os.pread(self._fd, 8192, 0)

    def _field(self, data: bytes, key: bytes) -> int | None:
        at = data.find(key + b":")
        if at < 0:
            return None
        return int(data[at + len(key) + 1 : data.index(b"kB", at)]) * 1024

    def available(self) -> int | None:
        return self._field(self._data(), b"MemAvailable")

    def swap(self) -> Swap | None:
        data = self._data()
        total, free = self._field(data, b"SwapTotal"), self._field(data, b"SwapFree")
        return None if total is None or free is None else Swap(total, total - free)

    def level(self) -> str | None:
        return None  # Linux's pressure stall information is not a level

    def os_pressure(self, usable: int) -> float:
        return 0.0

    def gpu_share(self) -> float:
        # Jetson's NvMapMemUsed is no share of a window (NvMapMemFree is nvmap's small free pool, not the room
        # left): the GPU's memory there is the OS's, held by MemAvailable; `umemc doctor` reports the figure
        return gtt_used_share(self.drm_root) if self.kind == "amd-apu" else 0.0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def gtt_used_share(drm_root: str = "/sys/class/drm") -> float:
    """AMD: mem_info_gtt_used / mem_info_gtt_total of the first card that has them (bytes)."""
    try:
        cards = sorted(os.listdir(drm_root))
    except OSError:
        return 0.0
    for card in cards:
        base = f"{drm_root}/{card}/device"
        try:
            used = int(Path(f"{base}/mem_info_gtt_used").read_text())
            total = int(Path(f"{base}/mem_info_gtt_total").read_text())
        except (OSError, ValueError):
            continue
        if total:
            return used / total
    return 0.0


class PsutilBox:
    """Available memory and swap through psutil, for a platform umemc has no probes of its own for."""

    available_name = "available memory"

    def available(self) -> int | None:
        import psutil

        return int(psutil.virtual_memory().available)

    def swap(self) -> Swap | None:
        import psutil

        s = psutil.swap_memory()
        return Swap(int(s.total), int(s.used))

    def level(self) -> str | None:
        return None

    def os_pressure(self, usable: int) -> float:
        return 0.0

    def gpu_share(self) -> float:
        return 0.0


# -- choosing ---------------------------------------------------------------------------------------------------


def probes(
    kind: str = "cpu",
    gpu_window: int | None = None,
    evict_above: float = 0.9,
    *,
    platform: str = sys.platform,
    env: Mapping[str, str] = os.environ,
) -> Probes:
    """The probes of this host (or of the set UMEMC_PROBES names) for a stack of platform `kind`."""
    choice = env.get("UMEMC_PROBES") or ("linux" if platform.startswith("linux") else platform)
    from . import hostroot

    if hostroot.recorded() is not None and hostroot.host_os() == "darwin" and not env.get("UMEMC_PROBES"):
        return recorded_mac(kind, gpu_window, evict_above)
    if choice != "linux":
        site_packages()
    if ":" in choice:
        module, _, factory = choice.partition(":")
        made: Probes = getattr(importlib.import_module(module), factory)(kind, gpu_window, evict_above)
        return made
    if choice == "linux":
        from .proc import LinuxProcesses

        return Probes(LinuxProcesses(), LinuxBox(kind), "linux", cgroups=True)
    if choice == "darwin":  # pragma: no cover - macOS only: CI runs these probes fed from fixtures
        from .darwin import DarwinBox, DarwinProcesses, LibcSysctl, LibprocRusage, psutil_vm

        box = DarwinBox(LibcSysctl(), psutil_vm, gpu_window, evict_above)
        return Probes(DarwinProcesses(LibprocRusage()), box, "darwin", cgroups=False)
    from .psproc import PsutilProcesses

    return Probes(PsutilProcesses(), PsutilBox(), choice, cgroups=choice.startswith("linux"))


def recorded_mac(kind: str, gpu_window: int | None, evict_above: float) -> Probes:
    """A recorded Mac (UMEMC_HOST_ROOT): its box read through its recorded `sysctl` and `vm_stat`; the processes are
    this machine's (the workers umemc starts run here)."""
    from .darwin import CommandSysctl, DarwinBox, parse_vm_stat, vm_figures
    from .tools import answer

    def vm() -> object:
        return vm_figures(parse_vm_stat(answer(["vm_stat"]) or ""))

    box = DarwinBox(CommandSysctl(), vm, gpu_window, evict_above)  # type: ignore[arg-type]
    return Probes(processes(), box, "darwin", cgroups=False)


@cache
def processes() -> Processes:
    """This host's process table, for the code that asks about single processes (alive, start time, the run's
    mark): never switched by UMEMC_PROBES, since records written by one process are read by another."""
    if sys.platform.startswith("linux"):
        from .proc import LinuxProcesses

        return LinuxProcesses()
    site_packages()
    if sys.platform == "darwin":  # pragma: no cover - macOS only
        from .darwin import DarwinProcesses, LibprocRusage

        return DarwinProcesses(LibprocRusage())
    from .psproc import PsutilProcesses

    return PsutilProcesses()


def site_packages() -> None:
    """Python's site step, where this interpreter started without it (the exec wrapper runs with -S: umemc's own
    modules are found from its entry's path), before a third-party module (psutil) is imported."""
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()


def alive(pid: int) -> bool:
    return processes().alive(pid)


def start_time(pid: int) -> int:
    return processes().start_time(pid)


def marked_processes(mark: str, procs: Processes | None = None) -> list[tuple[int, str | None]]:
    """Every live process carrying a run's mark (UMEMC_RUN, set by umemc's exec wrapper and inherited by everything
    it starts), with the model it was started for. One pass over the process table: for `down` and a 5 s sweep."""
    procs = procs or processes()
    me = os.getpid()
    out = []
    for pid in procs.pids():
        if pid == me:
            continue
        env = procs.run_environ(pid)
        if env.get(RUN_MARK) == mark and procs.alive(pid):
            out.append((pid, env.get("UMEMC_MODEL")))
    return out


def tree_memory(procs: Processes, root: int) -> tuple[int, list[int]]:
    """What a process and all its descendants hold (each by the platform's figure), and their pids."""
    pids = procs.descendants(root)
    return sum(procs.memory(p) for p in pids), pids
