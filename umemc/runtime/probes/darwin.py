"""macOS (Apple silicon): what a process holds, the machine's memory pressure, swap and the GPU's wired limit.

Each figure is read through a small source with two implementations: the system call a Mac answers in
microseconds (ctypes: sysctlbyname, proc_pid_rusage; psutil for the VM page counts), and the text of the
command that prints the same figure, parsed here (`sysctl`, `vm_stat`, `memory_pressure`). The tests feed the
parsers, and the whole sampler, with fixture outputs in the commands' exact formats; the ctypes calls run only
on a Mac.

- A process's memory is the larger of its **phys_footprint** and its resident size (proc_pid_rusage,
  `struct rusage_info_v0` of <sys/resource.h>). The footprint is the figure jetsam kills by and Activity
  Monitor's Memory column: dirty private memory, compressed pages (so memory macOS compressed or swapped out
  still counts) and the IOKit memory the process owns, which is where Metal buffers are; the resident size
  holds what the footprint leaves out: mmap'd weights (file-backed pages).
- Pressure: `kern.memorystatus_level` (percent of memory free, as jetsam sees it; `memory_pressure` prints
  the same figure as "System-wide memory free percentage") and `kern.memorystatus_vm_pressure_level`
  (1 normal, 2 warn, 4 critical: the level Activity Monitor colours its graph by).
- Swap: `vm.swapusage` (macOS compresses, then swaps, instead of OOM-killing: swap that grows while the stack
  runs is the failure to catch).
- The GPU window in force: `iogpu.wired_limit_mb` (0 = macOS's default, which Metal reports to a runtime as
  recommendedMaxWorkingSetSize: llama.cpp logs it), and the machine's wired pages (`vm_stat`'s "Pages wired
  down"; Metal's resident buffers are wired), a conservative GPU-side use since it also holds the kernel's own.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .psproc import PsutilProcesses
from .swap import Swap

MiB = 1 << 20

# -- sysctl ----------------------------------------------------------------------------------------------


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl NAME…` / `sysctl -a` output: one `name: value` line per variable (sysctl(8) on macOS)."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name and " " not in name:
            out[name] = value.strip()
    return out


_SWAP = re.compile(r"(total|used|free) = ([\d.]+)([KMG])")
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_swapusage(value: str) -> Swap | None:
    """`vm.swapusage`'s value as sysctl prints it: `total = 2048.00M  used = 1066.25M  free = 981.75M  (encrypted)`
    (sysctl(8) formats struct xsw_usage in MiB with two decimals)."""
    found = {k: round(float(n) * _UNIT[u]) for k, n, u in _SWAP.findall(value)}
    if "total" not in found or "used" not in found:
        return None
    return Swap(found["total"], found["used"])


class Sysctl(Protocol):
    def get(self, name: str) -> str | None: ...


class SysctlText:
    """Variables from `sysctl` output: a fixture's text, or `read` run again each time (a file being rewritten)."""

    def __init__(self, read: Callable[[], str]):
        self._read = read

    def get(self, name: str) -> str | None:
        return parse_sysctl(self._read()).get(name)


class CommandSysctl:
    """`sysctl NAME` itself (a few ms: for preflight, not the sampling loop)."""

    def get(self, name: str) -> str | None:
        from .tools import answer

        said = answer(["sysctl", name])
        return None if said is None else parse_sysctl(said).get(name)


class LibcSysctl:  # pragma: no cover - macOS only
    """sysctlbyname(3) through ctypes (microseconds: the sampling loop's source), answering in sysctl(8)'s text so
    that one parser reads both. Integers are read at the width the kernel gives (4 or 8 bytes)."""

    def __init__(self) -> None:
        import ctypes
        import ctypes.util

        self._ct = ctypes
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    def _raw(self, name: str) -> bytes | None:
        ct = self._ct
        size = ct.c_size_t(0)
        if self._libc.sysctlbyname(name.encode(), None, ct.byref(size), None, ct.c_size_t(0)) != 0:
            return None
        buf = ct.create_string_buffer(size.value)
        if self._libc.sysctlbyname(name.encode(), buf, ct.byref(size), None, ct.c_size_t(0)) != 0:
            return None
        return bytes(buf.raw[: size.value])

    def get(self, name: str) -> str | None:
        raw = self._raw(name)
        if raw is None:
            return None
        if name == "vm.swapusage":  # struct xsw_usage { u64 total, avail, used; u32 pagesize; bool encrypted }
            total, _avail, used = struct.unpack_from("<QQQ", raw)
            return f"total = {total / MiB:.2f}M  used = {used / MiB:.2f}M  free = {(total - used) / MiB:.2f}M"
        if len(raw) in (4, 8):
            return str(int.from_bytes(raw, "little", signed=len(raw) == 4))
        return raw.rstrip(b"\0").decode(errors="replace")


# -- vm_stat and memory_pressure ---------------------------------------------------------------------------


@dataclass(frozen=True)
class VmFigures:
    """The machine's memory as the VM system counts it, in bytes."""

    available: int  # free (with speculative) + inactive: what psutil and Activity Monitor call available
    wired: int  # wired down: the kernel's own and every resident Metal buffer


_PAGE_SIZE = re.compile(r"page size of (\d+) bytes")


def parse_vm_stat(text: str) -> dict[str, int]:
    """`vm_stat` (no interval): a header `Mach Virtual Memory Statistics: (page size of 16384 bytes)`, then one
    `Label:   N.` line per counter, some labels in quotes; counts of pages. The page size is under "page size"."""
    out = {}
    m = _PAGE_SIZE.search(text)
    if m:
        out["page size"] = int(m.group(1))
    for line in text.splitlines()[1:]:
        label, sep, value = line.rpartition(":")
        value = value.strip().rstrip(".")
        if sep and value.isdigit():
            out[label.strip().strip('"')] = int(value)
    return out


def vm_figures(stat: dict[str, int]) -> VmFigures:
    """vm_stat prints free pages without the speculative ones (free_count - speculative_count), so both are added
    back; the same sum psutil's virtual_memory().available makes from host_statistics64."""
    page = stat.get("page size", 16384)
    free = stat.get("Pages free", 0) + stat.get("Pages speculative", 0)
    return VmFigures((free + stat.get("Pages inactive", 0)) * page, stat.get("Pages wired down", 0) * page)


def psutil_vm() -> VmFigures:  # pragma: no cover - macOS only (psutil's wired exists there)
    import psutil

    vm = psutil.virtual_memory()
    return VmFigures(int(vm.available), int(getattr(vm, "wired", 0)))


_FREE_PCT = re.compile(r"System-wide memory free percentage:\s*(\d+)%")


def parse_memory_pressure(text: str) -> int | None:
    """`memory_pressure` (no arguments) ends with `System-wide memory free percentage: 62%`: the figure
    kern.memorystatus_level holds. For a macOS whose sysctl lacks that variable."""
    m = _FREE_PCT.search(text)
    return int(m.group(1)) if m else None


# -- proc_pid_rusage ---------------------------------------------------------------------------------------

# struct rusage_info_v0 (<sys/resource.h>, xnu bsd/sys/resource.h): uint8_t ri_uuid[16], then uint64_t
# ri_user_time, ri_system_time, ri_pkg_idle_wkups, ri_interrupt_wkups, ri_pageins, ri_wired_size,
# ri_resident_size, ri_phys_footprint, ri_proc_start_abstime, ri_proc_exit_abstime. Later flavours only append.
RUSAGE_INFO_V0 = 0
RUSAGE_V0 = struct.Struct("<16s10Q")


@dataclass(frozen=True)
class Rusage:
    user_time: int  # in mach absolute time units
    system_time: int
    wired: int
    resident: int
    footprint: int
    start_abstime: int


def parse_rusage_v0(raw: bytes) -> Rusage:
    f = RUSAGE_V0.unpack_from(raw)
    return Rusage(user_time=f[1], system_time=f[2], wired=f[6], resident=f[7], footprint=f[8], start_abstime=f[9])


RusageSource = Callable[[int], "bytes | None"]


class LibprocRusage:  # pragma: no cover - macOS only
    """proc_pid_rusage(pid, RUSAGE_INFO_V0, &buf) of libproc: no entitlement needed for the user's own processes."""

    def __init__(self) -> None:
        import ctypes
        import ctypes.util

        self._ct = ctypes
        self._lib = ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib", use_errno=True)

    def __call__(self, pid: int) -> bytes | None:
        buf = self._ct.create_string_buffer(512)  # more than any flavour: a newer kernel may write more
        if self._lib.proc_pid_rusage(pid, RUSAGE_INFO_V0, buf) != 0:
            return None
        return bytes(buf.raw[: RUSAGE_V0.size])


class DarwinProcesses(PsutilProcesses):
    """psutil for the process table and trees; proc_pid_rusage for what a process holds."""

    name = "macOS proc_pid_rusage"
    memory_figure = "phys_footprint"

    def __init__(self, rusage: RusageSource):
        super().__init__()
        self._rusage = rusage

    def usage(self, pid: int) -> Rusage | None:
        raw = self._rusage(pid)
        return None if raw is None else parse_rusage_v0(raw)

    def memory(self, pid: int) -> int:
        """The larger of the footprint (jetsam's figure: Metal buffers and compressed pages included) and the
        resident size (mmap'd weights, which the footprint leaves out)."""
        u = self.usage(pid)
        return 0 if u is None else max(u.footprint, u.resident)


# -- the machine -------------------------------------------------------------------------------------------

PRESSURE_LEVELS = {1: "normal", 2: "warn", 4: "critical"}


class DarwinBox:
    """The machine's side: available memory and wired pages, swap, the kernel's pressure level, the wired limit."""

    available_name = "available memory (free + inactive)"

    def __init__(self, sysctl: Sysctl, vm: Callable[[], VmFigures], gpu_window: int | None, evict_above: float):
        self.sysctl, self.vm = sysctl, vm
        self.gpu_window = gpu_window
        self.evict_above = evict_above

    def _int(self, name: str) -> int | None:
        value = self.sysctl.get(name)
        try:
            return None if value is None else int(value.split()[0])
        except (ValueError, IndexError):
            return None

    def available(self) -> int | None:
        return self.vm().available

    def swap(self) -> Swap | None:
        value = self.sysctl.get("vm.swapusage")
        return None if value is None else parse_swapusage(value)

    def level(self) -> str | None:
        """normal | warn | critical (kern.memorystatus_vm_pressure_level)."""
        n = self._int("kern.memorystatus_vm_pressure_level")
        return None if n is None else PRESSURE_LEVELS.get(n, str(n))

    def os_pressure(self, usable: int) -> float:
        """The kernel's own view as a pressure on the stack's usable memory: the free share jetsam sees
        (kern.memorystatus_level x RAM) against what the stack may use; at least evict_above while the kernel
        says warn (no cold start is admitted, nothing is evicted yet: the guard's hysteresis), 1.0 at critical."""
        out = 0.0
        free_pct, memsize = self._int("kern.memorystatus_level"), self._int("hw.memsize")
        if free_pct is not None and memsize and usable:
            out = max(0.0, 1 - free_pct / 100 * memsize / usable)
        level = self.level()
        if level == "critical":
            out = max(out, 1.0)
        elif level == "warn":
            out = max(out, self.evict_above)
        return out

    def gpu_share(self) -> float:
        """Wired pages against the GPU window: Metal's resident buffers are wired (with the kernel's own wired
        memory, so this errs high)."""
        if not self.gpu_window:
            return 0.0
        return self.vm().wired / self.gpu_window

    def wired_limit(self) -> int | None:
        """iogpu.wired_limit_mb in bytes; 0 means macOS's default; None: no such variable (before macOS 14)."""
        mb = self._int("iogpu.wired_limit_mb")
        return None if mb is None else mb * MiB


def default_wired_limit(memsize: int) -> int:
    """What iogpu.wired_limit_mb = 0 gives (Metal's recommendedMaxWorkingSetSize) where Metal cannot be asked: the
    table of measured Macs (umemc.platforms) the presets budget with too."""
    from ...platforms import apple_default_window

    return apple_default_window(memsize).bytes


# -- asking Metal and Foundation (ctypes into the Objective-C runtime; macOS only) ------------------------------

THERMAL_STATES = {0: "nominal", 1: "fair", 2: "serious", 3: "critical"}  # NSProcessInfoThermalState


def _objc_send(restype: object) -> Callable[..., object]:  # pragma: no cover - macOS only
    import ctypes
    import ctypes.util

    objc = ctypes.CDLL(ctypes.util.find_library("objc"))
    address = ctypes.cast(objc.objc_msgSend, ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(restype, ctypes.c_void_p, ctypes.c_void_p)(address)  # type: ignore[arg-type]


def _selector(name: bytes) -> int:  # pragma: no cover - macOS only
    import ctypes
    import ctypes.util

    objc = ctypes.CDLL(ctypes.util.find_library("objc"))
    objc.sel_registerName.restype = ctypes.c_void_p
    return int(objc.sel_registerName(name))


def metal_recommended_max_working_set() -> int | None:  # pragma: no cover - macOS only
    """[MTLCreateSystemDefaultDevice() recommendedMaxWorkingSetSize]: the bytes the GPU may wire now (it follows
    iogpu.wired_limit_mb where that is set: antirez/ds4#893). None where Metal gives no device."""
    import ctypes

    try:
        metal = ctypes.CDLL("/System/Library/Frameworks/Metal.framework/Metal")
        metal.MTLCreateSystemDefaultDevice.restype = ctypes.c_void_p
        device = metal.MTLCreateSystemDefaultDevice()
        if not device:
            return None
        size = _objc_send(ctypes.c_uint64)(device, _selector(b"recommendedMaxWorkingSetSize"))
    except (OSError, AttributeError):
        return None
    return int(size) if isinstance(size, int) and size > 0 else None


def thermal_state() -> str | None:  # pragma: no cover - macOS only
    """[[NSProcessInfo processInfo] thermalState]: macOS's thermal pressure (nominal, fair, serious, critical),
    readable without root. On Apple silicon `pmset -g therm` reports no speed limit at all (exelban/stats#749,
    macmade/Hot#80): this is the level macOS throttles by."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL("/System/Library/Frameworks/Foundation.framework/Foundation")
        objc = ctypes.CDLL(ctypes.util.find_library("objc"))
        objc.objc_getClass.restype = ctypes.c_void_p
        info = _objc_send(ctypes.c_void_p)(objc.objc_getClass(b"NSProcessInfo"), _selector(b"processInfo"))
        state = _objc_send(ctypes.c_long)(info, _selector(b"thermalState"))
    except (OSError, AttributeError):
        return None
    return THERMAL_STATES.get(state) if isinstance(state, int) else None
