"""Platform presets: machine facts a stack may name instead of spelling them out.

Every number is a starting point any stack may override in `[platform]`. Sources are
docs/ESTIMATES.md's platform table unless said otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import GiB, MiB


@dataclass(frozen=True)
class PlatformPreset:
    kind: str
    memory: int
    os_reserve: int
    gpu_window: int | None
    note: str
    cpu_cores: int


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
    # NVIDIA GB10 (DGX Spark), 128 GB LPDDR5x shared by CPU and GPU. NVML reports no separate
    # memory ("Not Supported"): the GPU can allocate whatever the OS has available, so the window
    # is everything outside the OS reserve.
    "dgx-spark-128": PlatformPreset(
        kind="nvidia-unified",
        memory=128 * GiB,
        os_reserve=8 * GiB,
        gpu_window=120 * GiB,
        note="no separate GPU ceiling: MemAvailable + SwapFree",
        cpu_cores=20,
    ),  # 10 X925 + 10 A725
    # Jetson AGX Orin 64 GB: nvmap allocates from system RAM (NvMapMemUsed in /proc/meminfo);
    # JetPack's desktop, carve-outs and CUDA take about 4 GiB.
    "jetson-orin-64": PlatformPreset(
        kind="nvidia-unified",
        memory=64 * GiB,
        os_reserve=4 * GiB,
        gpu_window=60 * GiB,
        note="nvmap shares system RAM (NvMapMemUsed/NvMapMemFree)",
        cpu_cores=12,
    ),  # 12 A78AE
}

KINDS = ("amd-apu", "apple", "nvidia-unified", "nvidia-discrete", "cpu")
UNIFIED_KINDS = frozenset({"amd-apu", "apple", "nvidia-unified"})


def default_os_reserve(memory: int) -> int:
    """Without a preset: 8 GiB, or an eighth of RAM on small machines (what practitioners keep for the OS)."""
    return min(8 * GiB, memory // 8)
