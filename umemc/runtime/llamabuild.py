"""What a llama.cpp build carries and sees: its ggml GPU backends (the backend libraries cmake puts beside the
programs: libggml-vulkan.so for -DGGML_VULKAN=ON, libggml-hip.so for -DGGML_HIP=ON, libggml-cuda.so, ...) and
the devices it finds at start (`llama-server --list-devices`, common/arg.cpp: one line a device, `  NAME:
DESCRIPTION (TOTAL MiB, FREE MiB free)`, or `  (none)`). A Vulkan build's `--help` and `--version` read exactly as
a CPU build's (recorded in tests/recorded/llama-server-vulkan/): only these two tell it apart.

On an amd-apu host a Vulkan build (Mesa's RADV driver) is what many Strix Halo owners run where ROCm fails; its
checks here: it must see the GPU at all (llama.cpp leaves out CPU renderers such as Mesa's llvmpipe, so a box
without RADV lists no device and the model runs on the CPU), the device must not be a CPU renderer (one made
visible by GGML_VK_VISIBLE_DEVICES), and the memory the driver reports to llama.cpp bounds what llama.cpp's own fit
offloads. Its memory is accounted as a ROCm build's is: amdgpu's DRM fdinfo per process (Mesa's RADV is a client
of the same kernel driver), GTT against the plan's GPU window."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from .findings import Finding

MiB = 1024 * 1024
TIMEOUT_S = 30.0  # a driver's first initialization (ROCm's) can take seconds
# ggml's backend libraries and the name of the backend each builds in
LIBRARIES = {"vulkan": "Vulkan", "hip": "ROCm", "cuda": "CUDA", "metal": "Metal", "sycl": "SYCL", "musa": "MUSA"}
SOFTWARE = ("llvmpipe", "lavapipe", "swiftshader")  # CPU renderers behind a Vulkan device
_DEVICE = re.compile(
    r"^\s+(?P<name>(?P<backend>[A-Za-z]+)\d+): (?P<what>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)$"
)

host_passed = partial(Finding.passed, host=True)
host_failed = partial(Finding.failed, host=True)


@dataclass(frozen=True)
class Device:
    name: str  # Vulkan0
    backend: str  # Vulkan
    description: str  # what the driver calls it
    total_bytes: int
    free_bytes: int

    @property
    def software(self) -> bool:
        """A CPU renderer, not a GPU."""
        return any(s in self.description.lower() for s in SOFTWARE)


def parse_devices(text: str) -> list[Device]:
    """The devices of `--list-devices` output (none: [])."""
    out = []
    for line in text.splitlines():
        if m := _DEVICE.match(line.rstrip()):
            total, free = int(m.group("total")) * MiB, int(m.group("free")) * MiB
            out.append(Device(m.group("name"), m.group("backend"), m.group("what"), total, free))
    return out


def located(executable: str) -> Path | None:
    found = shutil.which(executable) if "/" not in executable else executable
    return Path(found).resolve() if found is not None and os.path.isfile(found) else None


def libraries(executable: str, backend: str) -> list[Path]:
    """ggml's library for `backend` (a key of LIBRARIES) beside the program or in ../lib (an installed build)."""
    here = located(executable)
    if here is None:
        return []
    name = f"libggml-{backend}.so*"
    return sorted([*here.parent.glob(name), *here.parent.parent.glob(f"lib/{name}")])


def backends(executable: str) -> set[str]:
    """The GPU backends the build carries, by name (Vulkan, ROCm, CUDA, ...): empty for a CPU build, or a static
    build whose libraries are inside the program."""
    return {name for lib, name in LIBRARIES.items() if libraries(executable, lib)}


def devices(executable: str, env: dict[str, str] | None = None) -> list[Device] | None:
    """The devices the build finds here, asked of the program with the model's environment; None when it cannot
    be asked (missing, failing, or past TIMEOUT_S)."""
    here = located(executable)
    if here is None:
        return None
    try:
        done = subprocess.run(
            [str(here), "--list-devices"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, **(env or {})},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or "Available devices:" not in done.stdout + done.stderr:
        return None
    return parse_devices(done.stdout + done.stderr)


RADV = (
    "install Mesa's Vulkan driver for AMD GPUs, RADV (Debian and Ubuntu: mesa-vulkan-drivers; Fedora: "
    "mesa-vulkan-drivers); `vulkaninfo --summary` then lists the GPU"
)


def vulkan_check(
    model: str, executable: str, env: dict[str, str], window: int | None, found: list[Device] | None
) -> list[Finding]:
    """A Vulkan build's findings on an amd-apu host, from the devices it `found` (None: not asked)."""
    if found is None:
        return []
    gpus = [d for d in found if d.backend == "Vulkan" and not d.software]
    if not gpus:
        software = [d for d in found if d.software]
        if software:
            said = (
                f"{software[0].name} is {software[0].description.split(' (')[0]}, Mesa's CPU renderer, not the GPU"
                + (" (made visible by GGML_VK_VISIBLE_DEVICES)" if "GGML_VK_VISIBLE_DEVICES" in env else "")
            )
        else:
            said = "it sees no GPU (`--list-devices`: none): the model would run on the CPU"
        return [host_failed("vulkan", f"models.{model}: {executable} is a Vulkan build of llama.cpp; {said}", (RADV,))]
    gpu = max(gpus, key=lambda d: d.total_bytes)
    text = f"models.{model}: Vulkan build, {gpu.name} {gpu.description}, {gpu.total_bytes // MiB} MiB"
    if window is not None and gpu.total_bytes < window:
        return [
            host_failed(
                "vulkan",
                f"{text} reported to llama.cpp, less than the plan's GPU window ({window // MiB} MiB): llama.cpp's "
                "fit keeps layers on the CPU beyond what the driver reports",
                (
                    "the driver reports what the GPU's memory settings give it: the BIOS's dedicated GPU memory and "
                    "the GTT limit (ttm.pages_limit, kernel/README.md); or lower the stack's gpu_window",
                ),
                advisory=True,
            )
        ]
    return [host_passed("vulkan", text)]
