"""Strix Halo (gfx1151) and ROCm checks for `umemc up` on an amd-apu stack: the kernel, the MES firmware the
GPU runs, the GPU's gfx target against what the runtime was built for (where it can be read), and the
deprecated GTT parameter. The known-bad combinations and their sources are in docs/STRIX-HALO.md; each
finding says what to do. Every path is read below `root`, so tests use fixture trees in the files' own
formats (the kernel's /proc/sys/kernel/osrelease and /proc/cmdline, KFD's topology `properties`, amdgpu's
debugfs `amdgpu_firmware_info`, module parameters in /sys/module)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path

from .findings import Finding
from .llamabuild import Device, backends, devices, libraries, vulkan_check

GFX1151 = 110501  # KFD's gfx_target_version of Strix Halo (major 11, minor 5, stepping 1)
# MES firmware that hangs gfx1151 compute queues ("MES failed to respond to msg=REMOVE_QUEUE", memory access
# faults): shipped in linux-firmware 20251125 (ROCm/legacy-rocm-build#5724). A firmware newer than it, or the
# older 0x82 with amdgpu.cwsr_enable=0, is what the reporters ran stably.
BAD_MES = {0x83: "ROCm/legacy-rocm-build#5724 (GPU hangs and memory access faults under ROCm compute)"}
# kernels with reports against gfx1151 compute: (major, minor) -> (what, source, fix)
BAD_KERNELS: dict[tuple[int, int], tuple[str, str, str]] = {
    (6, 14): (
        "MES queue-removal hangs under llama.cpp's ROCm backend",
        "ROCm/legacy-rocm-build#5151, ROCm/TheRock#1413",
        "a newer kernel (the reporters moved on to 6.16+), or amdgpu.cwsr_enable=0 on the kernel command line",
    ),
    (7, 0): (
        "a ~300x slower mmap'd weight load on gfx1151",
        "ROCm/legacy-rocm-build#6530",
        "keep mmap = false for llama.cpp models (umemc's default on amd-apu), or another kernel",
    ),
}
# every gfx1151 report in docs/STRIX-HALO.md comes from a kernel of 6.14 or later: older ones are untested there
TESTED_SINCE = (6, 14)


# preflight's findings, each about the host (a warning only under --simulate)
host_passed = partial(Finding.passed, host=True)
host_failed = partial(Finding.failed, host=True)


def kernel_version(root: Path) -> tuple[int, int] | None:
    try:
        text = (root / "proc/sys/kernel/osrelease").read_text()
    except OSError:
        return None
    m = re.match(r"(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def gfx_targets(root: Path) -> list[int]:
    """gfx_target_version of every GPU node KFD lists (0 for CPU nodes, left out)."""
    out = []
    for props in sorted((root / "sys/class/kfd/kfd/topology/nodes").glob("*/properties")):
        try:
            for line in props.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "gfx_target_version" and value.strip() not in ("", "0"):
                    out.append(int(value))
        except (OSError, ValueError):
            continue
    return out


def mes_firmware(root: Path) -> int | None:
    """The MES firmware version amdgpu reports in debugfs (root only; None when it cannot be read)."""
    for info in sorted((root / "sys/kernel/debug/dri").glob("*/amdgpu_firmware_info")):
        try:
            for line in info.read_text().splitlines():
                m = re.match(r"MES feature version: \d+, firmware version: 0x([0-9a-fA-F]+)", line.strip())
                if m:
                    return int(m.group(1), 16)
        except OSError:
            continue
    return None


def cmdline(root: Path) -> list[str]:
    try:
        return (root / "proc/cmdline").read_text().split()
    except OSError:
        return []


def built_targets(executable: str | None) -> set[str] | None:
    """The gfx targets a llama.cpp HIP build carries (clang offload bundle ids `amdgcn-amd-amdhsa--gfxNNNN` in
    the ggml-hip library next to the binary); None when there is no such library to read."""
    libs = libraries(executable, "hip") if executable is not None else []
    if not libs:
        return None
    targets: set[str] = set()
    pattern = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)")
    for lib in libs:
        try:
            targets |= {m.decode() for m in pattern.findall(lib.read_bytes())}
        except OSError:
            continue
    return targets


def check(
    root: Path,
    executables: dict[str, str | None],
    env: dict[str, dict[str, str]],
    window: int | None = None,
    list_devices: Callable[[str, dict[str, str]], list[Device] | None] = devices,
) -> list[Finding]:
    """All findings for an amd-apu host. executables: model -> its runtime's executable (llama.cpp ones);
    env: model -> the model's own environment; window: the plan's GPU window. A Vulkan build (umemc.runtime
    .llamabuild) is asked which devices it sees; ROCm's own settings do not concern it."""
    out = [*_kernel(root), *_firmware(root), *_gtt_parameter(root)]
    vulkan = {m: exe for m, exe in executables.items() if exe is not None and "Vulkan" in backends(exe)}
    for model, program in sorted(vulkan.items()):
        out += vulkan_check(model, program, env.get(model, {}), window, list_devices(program, env.get(model, {})))
    rocm_free = {m for m, program in vulkan.items() if "ROCm" not in backends(program)}
    gfx = gfx_targets(root)
    strix = GFX1151 in gfx
    if gfx:
        out.append(host_passed("gfx target", "GPU " + ", ".join(_gfx_name(v) for v in gfx)))
    for model, variables in sorted(env.items()):
        if strix and "HSA_OVERRIDE_GFX_VERSION" in variables and model not in rocm_free:
            out.append(
                host_failed(
                    "gfx target",
                    f"models.{model}.env sets HSA_OVERRIDE_GFX_VERSION={variables['HSA_OVERRIDE_GFX_VERSION']}: on "
                    "gfx1151 it makes ROCm load kernels built for another GPU",
                    (f"remove HSA_OVERRIDE_GFX_VERSION from models.{model}.env (use a gfx1151 build)",),
                )
            )
    for model, exe in sorted(executables.items()):
        targets = built_targets(exe)
        if strix and targets is not None and "gfx1151" not in targets:
            out.append(
                host_failed(
                    "gfx target",
                    f"models.{model}: {exe} was built for {', '.join(sorted(targets)) or 'no GPU'}, not gfx1151",
                    ("rebuild llama.cpp with -DGGML_HIP=ON -DAMDGPU_TARGETS=gfx1151",),
                )
            )
    return out


def _kernel(root: Path) -> list[Finding]:
    version = kernel_version(root)
    if version is None:
        return []
    text = f"kernel {version[0]}.{version[1]}"
    if version < TESTED_SINCE:
        return [
            host_failed(
                "kernel",
                f"{text} is older than every kernel the gfx1151 (Strix Halo) reports in docs/STRIX-HALO.md ran "
                f"({TESTED_SINCE[0]}.{TESTED_SINCE[1]} and later)",
                ("install a newer kernel (your distribution's HWE or mainline package)",),
                advisory=True,
            )
        ]
    known = BAD_KERNELS.get(version)
    if known is None:
        return [host_passed("kernel", text)]
    what, source, fix = known
    if version == (6, 14) and "amdgpu.cwsr_enable=0" in cmdline(root):
        return [host_passed("kernel", f"{text} with amdgpu.cwsr_enable=0 (the workaround for {source})")]
    return [host_failed("kernel", f"{text}: {what} ({source})", (fix,), advisory=True)]


def _firmware(root: Path) -> list[Finding]:
    mes = mes_firmware(root)
    if mes is None:
        return []
    if mes in BAD_MES:
        return [
            host_failed(
                "firmware",
                f"MES firmware 0x{mes:08x}: {BAD_MES[mes]}",
                (
                    "update linux-firmware past 20251125 (or amdgpu-install's firmware), then reboot",
                    "meanwhile: amdgpu.cwsr_enable=0 on the kernel command line",
                ),
            )
        ]
    return [host_passed("firmware", f"MES firmware 0x{mes:08x}")]


def _gtt_parameter(root: Path) -> list[Finding]:
    try:
        gttsize = int((root / "sys/module/amdgpu/parameters/gttsize").read_text())
    except (OSError, ValueError):
        return []
    if gttsize == -1:
        return []
    return [
        host_failed(
            "gpu window",
            f"amdgpu.gttsize={gttsize} is set: the parameter is deprecated, ttm.pages_limit bounds the GTT",
            ("remove amdgpu.gttsize from the kernel command line and modprobe.d; see kernel/README.md",),
            advisory=True,
        )
    ]


def _gfx_name(version: int) -> str:
    major, rest = divmod(version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor}{stepping:x}"
