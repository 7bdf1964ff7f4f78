"""Platform presets: machine facts a stack may name instead of spelling them out.

Every number is a starting point any stack may override in `[platform]`. Sources are
docs/ESTIMATES.md's platform table unless said otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

from ..platforms import apple_default_window
from ..units import GiB, MiB


class PlatformPreset(NamedTuple):
    kind: str
    memory: int
    os_reserve: int
    gpu_window: int | None
    note: str
    cpu_cores: int


# What the OS of a machine sees (MemTotal), where it is less than the installed RAM by more than the kernel's own
# share: a preset budgets that, since the rest is never the OS's to give (sources in the presets' comments).
SPARK_MEMTOTAL = 127600748 * 1024
ORIN_64_MEMTOTAL = 62841 * MiB

PLATFORM_PRESETS: dict[str, PlatformPreset] = {
    # AMD Ryzen AI Max+ 395 with 128 GB LPDDR5X; BIOS carve-out (UMA frame buffer) at its 512 MB
    # minimum, so nearly all RAM is system memory and the GPU maps it through GTT. The GPU window
    # is the kernel's `ttm.pages_limit` (4 KiB pages = GiB x 262144): 120 GiB = 31457280 pages, so
    # the GPU can map everything but the 8 GiB kept for the OS. `amdgpu.gttsize` is deprecated.
    "strix-halo-128": PlatformPreset(
        kind="amd-apu",
        memory=128 * GiB,
        os_reserve=8 * GiB,
        gpu_window=120 * GiB,
        note="GTT limit via ttm.pages_limit=31457280 (120 GiB)",
        cpu_cores=16,
    ),  # Zen 5, 16 cores
    # Apple M-series with 128 GB: Metal's wired limit `iogpu.wired_limit_mb` defaults to about 84%
    # of RAM at this size (107.5 GiB = 110080 MiB); raise it in the stack and the bundle's
    # LaunchDaemon sets it at boot.
    "apple-silicon-128": PlatformPreset(
        kind="apple",
        memory=128 * GiB,
        os_reserve=8 * GiB,
        gpu_window=110080 * MiB,
        note="stock iogpu.wired_limit_mb (about 84% of RAM)",
        cpu_cores=16,
    ),  # M4 Max: 12P + 4E
    # Smaller Macs: the same stock rule as default_gpu_window (3/4 of RAM above 32 GiB).
    **{
        f"apple-silicon-{gb}": PlatformPreset(
            kind="apple",
            memory=gb * GiB,
            os_reserve=min(8 * GiB, gb * GiB // 8),
            gpu_window=gb * GiB * 3 // 4,
            note="stock iogpu.wired_limit_mb (about 75% of RAM)",
            cpu_cores=cores,
        )
        for gb, cores in ((36, 12), (48, 14), (64, 16), (96, 12))
    },  # M3 Pro 36 GB, M4 Pro 48 GB, M4 Max 64 GB, M2 Max 96 GB
    # Ryzen AI Max 64 GB: the same layout as the 128 GB box, GTT up to all but the OS reserve.
    "strix-halo-64": PlatformPreset(
        kind="amd-apu",
        memory=64 * GiB,
        os_reserve=8 * GiB,
        gpu_window=56 * GiB,
        note="GTT limit via ttm.pages_limit=14680064 (56 GiB)",
        cpu_cores=16,
    ),
    # NVIDIA GB10 (DGX Spark), 128 GB LPDDR5x shared by CPU and GPU. The OS sees 121.69 GiB of it
    # (MemTotal 127600748 kB: XuehaiPan/nvitop#208): the rest is the firmware's and the GPU's own, so
    # the preset budgets what the OS sees (a preset of 128 GiB left the OS 1.7 GiB, not its 8). NVML
    # reports no separate memory ("Not Supported"): the GPU allocates whatever the OS has, so the
    # window is everything outside the OS reserve.
    "dgx-spark-128": PlatformPreset(
        kind="nvidia-unified",
        memory=SPARK_MEMTOTAL,
        os_reserve=8 * GiB,
        gpu_window=SPARK_MEMTOTAL - 8 * GiB,
        note="the 121.69 GiB the OS sees of 128 GB; no separate GPU ceiling: MemAvailable + SwapFree",
        cpu_cores=20,
    ),  # 10 X925 + 10 A725
    # Jetson AGX Orin 64 GB: the OS sees 62841 MiB (61.4 GiB: tegrastats' `RAM …/62841MB` on
    # JetPack 6); nvmap allocates from that RAM (NvMapMemUsed in /proc/meminfo); JetPack's desktop
    # and CUDA take about 4 GiB.
    "jetson-orin-64": PlatformPreset(
        kind="nvidia-unified",
        memory=ORIN_64_MEMTOTAL,
        os_reserve=4 * GiB,
        gpu_window=ORIN_64_MEMTOTAL - 4 * GiB,
        note="the 61.4 GiB the OS sees of 64 GB; nvmap shares system RAM (NvMapMemUsed/NvMapMemFree)",
        cpu_cores=12,
    ),  # 12 A78AE
}

_ORDER = ("strix-halo", "apple-silicon", "dgx-spark", "jetson-orin")  # by family, larger machines first
PLATFORM_PRESETS = dict(
    sorted(PLATFORM_PRESETS.items(), key=lambda kv: (_ORDER.index(kv[0].rsplit("-", 1)[0]), -kv[1].memory))
)

KINDS = ("amd-apu", "apple", "nvidia-unified", "nvidia-discrete", "cpu")
UNIFIED_KINDS = frozenset({"amd-apu", "apple", "nvidia-unified"})


def default_os_reserve(memory: int) -> int:
    """Without a preset: 8 GiB, or an eighth of RAM on small machines (what practitioners keep for the OS)."""
    return min(8 * GiB, memory // 8)


def default_gpu_window(kind: str, memory: int, os_reserve: int) -> int | None:
    """The GPU window of a machine whose stack does not give one (None: it must be given).

    apple: macOS's stock GPU working-set limit (Metal's recommendedMaxWorkingSetSize, what
    iogpu.wired_limit_mb = 0 means): apple_default_window's table of measured Macs.
    amd-apu: everything outside the OS reserve (the bundle's ttm.pages_limit sets exactly that).
    nvidia-unified: the GPU allocates whatever the OS has available.
    nvidia-discrete: the card's VRAM, which nothing else tells."""
    if kind == "apple":
        return apple_default_window(memory).bytes
    if kind in ("amd-apu", "nvidia-unified"):
        return memory - os_reserve
    return None
