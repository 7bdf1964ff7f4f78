"""macOS's probes fed from fixture outputs on any machine: the code umemc runs on a Mac (DarwinProcesses, DarwinBox,
the enforcer over them), run in CI on Linux.

`UMEMC_PROBES=umemc.testing.mac_probes:probes` selects them (the enforcer, preflight); `UMEMC_DARWIN_FIXTURES` names a
directory holding

- `sysctl.txt`: what `sysctl hw.memsize kern.memorystatus_level kern.memorystatus_vm_pressure_level vm.swapusage
  iogpu.wired_limit_mb` prints on a Mac (`name: value` lines), read again at every look, so a test changes the
  machine (its pressure level, its swap) by rewriting the file;
- `vm_stat.txt`: what `vm_stat` prints, read again likewise.

What a process holds comes as a Mac's proc_pid_rusage answers it (a `struct rusage_info_v0`), packed from what the
process really holds here: its resident pages (/proc) as ri_resident_size, and resident plus swapped-out pages as
ri_phys_footprint (on macOS the footprint counts compressed and swapped-out pages too). Real workers that really
allocate are so measured through the macOS code."""

from __future__ import annotations

import os
from pathlib import Path

from ..runtime.probes.darwin import RUSAGE_V0, DarwinBox, DarwinProcesses, SysctlText, parse_vm_stat, vm_figures
from ..runtime.probes.host import Probes
from ..runtime.probes.proc import LinuxProcesses

FIXTURES_ENV = "UMEMC_DARWIN_FIXTURES"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class LinuxBackedRusage:
    """proc_pid_rusage's answer (rusage_info_v0 bytes) for a process of this Linux machine."""

    def __init__(self) -> None:
        self.linux = LinuxProcesses()

    def __call__(self, pid: int) -> bytes | None:
        if not self.linux.alive(pid):
            return None
        resident = self.linux.memory(pid)
        footprint = resident + (self.linux.swapped(pid) or 0)
        ticks = self.linux.cpu_ticks(pid)
        start = self.linux.start_time(pid)
        return RUSAGE_V0.pack(b"\0" * 16, ticks, 0, 0, 0, 0, 0, resident, footprint, start, 0)


def probes(kind: str, gpu_window: int | None, evict_above: float) -> Probes:
    folder = Path(os.environ.get(FIXTURES_ENV, "."))
    sysctl = SysctlText(lambda: _read(folder / "sysctl.txt"))
    box = DarwinBox(sysctl, lambda: vm_figures(parse_vm_stat(_read(folder / "vm_stat.txt"))), gpu_window, evict_above)
    return Probes(DarwinProcesses(LinuxBackedRusage()), box, "darwin", cgroups=False)
