"""What umemc sees of the machine it runs on, and where each figure comes from: the platform kind and why, the memory
the OS sees, the GPU window in force, the memory bus, the kernel's memory pressure (PSI). `umemc doctor` prints
it, `init` starts a stack from it, preflight compares a plan with it. Every file and program is the real machine's
or a recorded one's (umemc.runtime.probes.hostroot); docs/PLATFORMS.md says, per platform, what is read and why.

The figures and their meaning, with sources:

- Memory: Linux's MemTotal (/proc/meminfo, kB): the RAM the kernel manages, less than what is installed (a DGX
  Spark's 128 GB reads 127600748 kB, 121.69 GiB: XuehaiPan/nvitop#208); macOS's hw.memsize (all of it).
- AMD APU: amdgpu sizes its GTT once, when it loads (amdgpu_ttm.c: gtt_size = ttm_tt_pages_limit() <<
  PAGE_SHIFT), so the window in force is the driver's `mem_info_gtt_total` (bytes), not the ttm module's
  `pages_limit` parameter: a write to the parameter at run time moves nothing. amdgpu-dkms installs ship the
  module as `amdttm` (/sys/module/amdttm/parameters/pages_limit: ROCm/legacy-rocm-build#3648, #5595).
- Apple silicon: `iogpu.wired_limit_mb` when set; else Metal's recommendedMaxWorkingSetSize (what the GPU may
  wire, which follows the sysctl when one is set: antirez/ds4#893), asked of Metal where this is a Mac, else
  umemc.stack.presets.apple_default_window's table of measured Macs.
- NVIDIA unified (GB10, Jetson): no window of its own: the GPU allocates from the memory the OS has. A GB10 is
  told by its driver (nvidia-smi's `memory.total` is `[N/A]` on a GPU without memory of its own: nvitop#208,
  llama-swap#782) and, on DGX OS, /etc/dgx-release; never by a product name alone (partner boxes have their own).
  A Jetson by /etc/nv_tegra_release or its device tree's model.
- PSI (/proc/pressure/memory, the kernel's Documentation/accounting/psi.rst): the share of time some (or all)
  runnable tasks stalled on memory, over 10, 60 and 300 s: the first sign of reclaim stalls on a unified box,
  before anything is killed."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ...platforms import apple_default_window
from ...units import gib
from . import hostroot
from .tools import answer

GiB = 1 << 30
NVIDIA_NAME_QUERY = ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
FACTS = "facts.json"  # a recorded Mac's answers that no file or program gives (docs/PLATFORMS.md)


def read(absolute: str, root: Path | None = None) -> str:
    """A machine file's text ('' where it is missing or unreadable), under `root` (default: the machine's)."""
    try:
        return ((root or hostroot.root()) / absolute.lstrip("/")).read_text(errors="replace")
    except OSError:
        return ""


def meminfo(text: str | None = None, root: Path | None = None) -> dict[str, int]:
    """/proc/meminfo as bytes per field (`Name:  N kB`; the HugePages_ counts, which have no unit, as they are)."""
    out = {}
    for line in (read("/proc/meminfo", root) if text is None else text).splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


# -- the platform ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    kind: str
    memory: int  # what the OS sees (MemTotal; hw.memsize), plus an AMD APU's BIOS carve-out the OS never sees
    why: str  # what the detection saw
    carveout: int = 0  # an AMD APU's BIOS carve-out (UMA frame buffer) beyond the 512 MB minimum
    memory_source: str = "/proc/meminfo MemTotal"
    vram: int | None = None  # a discrete GPU's own memory as its driver said it (its GPU window)


CARVEOUT_MIN = 1 << 30  # the 512 MB minimum frame buffer (and the driver's rounding) is no carve-out


def detect(root: Path | None = None, host_os: str | None = None) -> Machine:
    """The platform kind of this machine (or the recorded one; or the tree at `root`) and why."""
    if (host_os or hostroot.host_os()) == "darwin":
        return _detect_mac()
    base = root or hostroot.root()
    mem = meminfo(root=base).get("MemTotal", 0)
    if not mem:
        from ...errors import UsageError

        raise UsageError(f"cannot read MemTotal from {base / 'proc/meminfo'}: name a platform with --platform")
    model = (read("/proc/device-tree/model", base) or read("/sys/class/dmi/id/product_name", base)).rstrip("\0")
    model = model.strip()
    if (base / "etc/nv_tegra_release").exists() or "jetson" in model.lower():
        return Machine("nvidia-unified", mem, f"Jetson ({model or '/etc/nv_tegra_release'})")
    nvidia = nvidia_gpu(base)
    if nvidia is not None:
        name, vram = nvidia
        if vram is None:  # the driver has no memory of its own for it: an integrated GPU (GB10)
            dgx = " on DGX OS" if (base / "etc/dgx-release").exists() else ""
            why = f"{name}{dgx}: nvidia-smi reports no memory of its own (memory.total [N/A]): it shares the RAM"
            return Machine("nvidia-unified", mem, why)
        own = f"{vram / GiB:.1f} GiB of its own" if vram else "memory of its own (nvidia-smi absent: size unknown)"
        return Machine("nvidia-discrete", mem, f"{name} with {own}", vram=vram or None)
    from .drm import amd_apu_cards

    for card, vram in amd_apu_cards(base):
        if vram <= CARVEOUT_MIN:  # the BIOS's minimum: nearly all RAM is the OS's, the GPU maps it through GTT
            return Machine("amd-apu", mem, f"AMD APU ({card}, {gib(vram)} GiB carve-out)")
        # a large UMA frame buffer: RAM the OS never sees (MemTotal is what is left), counted as what it is
        why = f"AMD APU ({card}) with a {gib(vram)} GiB BIOS carve-out"
        return Machine("amd-apu", mem + vram, why, vram)
    return Machine("cpu", mem, "no unified-memory GPU found")


def nvidia_gpu(root: Path | None = None) -> tuple[str, int | None] | None:
    """The first NVIDIA GPU's name and its own memory (None: it has none, `[N/A]`), from nvidia-smi; else from the
    driver's /proc/driver/nvidia/gpus/*/information (a GB10 there, where nvidia-smi is absent, has no memory of its
    own); None without an NVIDIA driver."""
    said = answer(NVIDIA_NAME_QUERY)
    for line in (said or "").splitlines():
        name, _, total = (p.strip() for p in line.partition(","))
        if name:
            return name, int(total) << 20 if total.isdigit() else None
    for info in sorted(((root or hostroot.root()) / "proc/driver/nvidia/gpus").glob("*/information")):
        m = re.search(r"^Model:\s*(.+)$", info.read_text(errors="replace"), re.M)
        if m:
            name = m.group(1).strip()
            return name, None if "GB10" in name else 0
    return None


def _detect_mac() -> Machine:
    from .darwin import CommandSysctl

    sysctl = CommandSysctl()
    brand = sysctl.get("machdep.cpu.brand_string") or ""
    memory = int(sysctl.get("hw.memsize") or 0)
    return Machine("apple" if "Apple" in brand else "cpu", memory, brand or "macOS", memory_source="hw.memsize")


# -- the GPU window in force ----------------------------------------------------------------------------------


class Window(NamedTuple):
    bytes: int | None  # None: no window bounds the models (CPU, NVIDIA unified), or it could not be read
    source: str  # the interface it was read from
    note: str = ""  # what else a person should know (a parameter not yet in force, an estimate)


def gpu_window(machine: Machine) -> Window:
    if machine.kind == "amd-apu":
        return amd_window()
    if machine.kind == "apple":
        return apple_window(machine.memory)
    if machine.kind == "nvidia-unified":
        return Window(None, "none: the GPU allocates from the memory the OS has (MemAvailable)")
    if machine.kind == "nvidia-discrete":  # what detect() read of the driver: nvidia-smi is not asked again
        vram = machine.vram
        return Window(vram, "nvidia-smi memory.total" if vram else "nvidia-smi gave no memory.total")
    return Window(None, "none: no GPU")


class TtmLimit(NamedTuple):
    module: str  # ttm | amdttm (amdgpu-dkms)
    bytes: int


def ttm_limit(root: Path | None = None) -> TtmLimit | None:
    """The GTT page limit the ttm module (or amdgpu-dkms's amdttm) was given, in bytes; None where neither is
    loaded. amdgpu applied it when it loaded: mem_info_gtt_total is what is in force."""
    for module in ("amdttm", "ttm"):  # amdgpu-dkms uses amdttm even where the kernel's ttm is loaded too
        text = read(f"/sys/module/{module}/parameters/pages_limit", root).strip()
        if text.isdigit():
            return TtmLimit(module, int(text) * 4096)
    return None


def gtt_total(root: Path | None = None) -> tuple[str, int] | None:
    """(card, bytes) of the AMD APU's GTT as its driver sized it (mem_info_gtt_total)."""
    from .drm import amd_apu_cards

    for card, _vram in amd_apu_cards(root or hostroot.root()):
        text = read(f"/sys/class/drm/{card}/device/mem_info_gtt_total", root).strip()
        if text.isdigit():
            return card, int(text)
    return None


def amd_window() -> Window:
    found = gtt_total()
    if found is None:
        return Window(None, "no amdgpu GTT (mem_info_gtt_total): the amdgpu driver is not loaded")
    card, total = found
    source = f"amdgpu {card} mem_info_gtt_total"
    limit = ttm_limit()
    if limit is not None and limit.bytes != total:
        return Window(
            total,
            source,
            f"{limit.module}.pages_limit asks for {limit.bytes / GiB:.2f} GiB; amdgpu sized its GTT when it loaded: "
            "the parameter takes effect at the next boot",
        )
    return Window(total, source)


def apple_window(memsize: int) -> Window:
    from .darwin import CommandSysctl

    mb = CommandSysctl().get("iogpu.wired_limit_mb")
    if mb and mb.strip().isdigit() and int(mb) > 0:
        return Window(int(mb) << 20, "iogpu.wired_limit_mb")
    metal = metal_working_set()
    if metal is not None:
        return Window(metal, "Metal recommendedMaxWorkingSetSize")
    default = apple_default_window(memsize)
    how = "measured on Macs of this memory" if default.measured else "estimated: no Mac of this memory measured"
    return Window(default.bytes, f"macOS's default GPU wired limit for {memsize / GiB:g} GiB ({how})", default.source)


def facts() -> dict[str, object]:
    """A recorded Mac's answers that no file or program gives (Metal's working set, the thermal state, the room on
    its swap volume)."""
    where = hostroot.recorded()
    if where is None:
        return {}
    try:
        loaded = json.loads((where / FACTS).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


VM_VOLUME = "/System/Volumes/VM"  # where macOS keeps its swap files


def swap_volume() -> str:
    """Where macOS keeps its swap files: its VM volume, or / where there is none."""
    return VM_VOLUME if os.path.isdir(VM_VOLUME) else "/"


def swap_room(where: str) -> int | None:
    """Free bytes on the volume at `where`: this machine's, or what a recorded Mac's facts.json says of its swap
    volume (None where it was not recorded: the room of the disk replaying it is no figure of that machine)."""
    if hostroot.recorded() is not None:
        value = facts().get("swap_volume_free_bytes")
        return value if isinstance(value, int) and value >= 0 else None
    return shutil.disk_usage(where).free


def metal_working_set() -> int | None:
    """Metal's recommendedMaxWorkingSetSize of the default device, bytes (a recorded machine's facts.json); None
    off a Mac or where Metal does not answer."""
    if hostroot.recorded() is not None:
        value = facts().get("metal_recommended_max_working_set_bytes")
        return value if isinstance(value, int) and value > 0 else None
    if hostroot.host_os() != "darwin":
        return None
    from .darwin import metal_recommended_max_working_set  # pragma: no cover - macOS only

    return metal_recommended_max_working_set()  # pragma: no cover


# -- the kernel's memory pressure -----------------------------------------------------------------------------


class Psi(NamedTuple):
    """/proc/pressure/memory: the share of wall time (0-1) in which some runnable task (`some`), or all of them
    (`full`), stalled on memory, averaged over the last 10, 60 and 300 s."""

    some10: float
    some60: float
    some300: float
    full10: float
    full60: float
    full300: float


_PSI = re.compile(r"^(some|full) avg10=([\d.]+) avg60=([\d.]+) avg300=([\d.]+)", re.M)


def parse_psi(text: str) -> Psi | None:
    found = {m.group(1): [float(m.group(i)) / 100 for i in (2, 3, 4)] for m in _PSI.finditer(text)}
    if "some" not in found:
        return None
    full = found.get("full", [0.0, 0.0, 0.0])
    return Psi(*found["some"], *full)


def psi() -> Psi | None:
    """The kernel's memory pressure; None where the kernel has no PSI (before 4.20, or psi=0, or not Linux)."""
    return parse_psi(read("/proc/pressure/memory"))
