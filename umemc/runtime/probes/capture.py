"""`umemc doctor --capture FILE.tar.gz`: this machine as umemc reads it, in a form `UMEMC_HOST_ROOT` replays.

Only what umemc reads to learn a machine goes in: the files below (copied as plain files at their paths), the
answers of the programs umemc asks (each recorded as `bin/NAME`, a small sh script that prints what the program
printed for exactly the arguments umemc uses, and says "not recorded" for any other), and on a Mac the two answers
no file or program gives (facts.json: Metal's working set, the thermal state). No environment, no process's
memory, nothing under /home: an owner can attach the file to a bug report, and the tests replay it
(docs/PLATFORMS.md). CAPTURE.json names what was read, when, and by which umemc."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from . import hostroot
from .heat import NVIDIA_QUERY, PMSET
from .machine import FACTS, NVIDIA_NAME_QUERY
from .nvidia import QUERY as NVIDIA_PROCESSES

# the machine's files umemc reads (globs under the root; /proc/sys/vm only the tunables the bundle sets)
FILES = (
    "proc/meminfo",
    "proc/pressure/memory",
    "proc/cmdline",
    "proc/sys/kernel/osrelease",
    *(
        f"proc/sys/vm/{k}"
        for k in (
            "swappiness",
            "overcommit_memory",
            "vfs_cache_pressure",
            "min_free_kbytes",
            "watermark_scale_factor",
            "max_map_count",
        )
    ),
    "proc/device-tree/model",
    "proc/driver/nvidia/gpus/*/information",
    "sys/class/dmi/id/product_name",
    "etc/nv_tegra_release",
    "etc/dgx-release",
    "etc/os-release",
    *(
        f"sys/class/drm/card*/device/{f}"
        for f in (
            "vendor",
            "device",
            "mem_info_vram_total",
            "mem_info_vram_used",
            "mem_info_gtt_total",
            "mem_info_gtt_used",
            "gpu_metrics",
        )
    ),
    *(f"sys/module/{m}/parameters/{p}" for m in ("ttm", "amdttm") for p in ("pages_limit", "page_pool_size")),
    "sys/module/amdgpu/parameters/gttsize",
    "sys/class/kfd/kfd/topology/nodes/*/properties",
    "sys/kernel/debug/dri/*/amdgpu_firmware_info",
    *(
        f"sys/class/hwmon/hwmon*/{f}"
        for f in ("name", "temp*_input", "temp*_label", "temp*_max", "temp*_crit", "power1_average", "power1_input")
    ),
    *(f"sys/class/thermal/thermal_zone*/{f}" for f in ("type", "temp", "trip_point_*_type", "trip_point_*_temp")),
)
SYSCTL_NAMES = (
    "hw.memsize",
    "machdep.cpu.brand_string",
    "iogpu.wired_limit_mb",
    "kern.memorystatus_level",
    "kern.memorystatus_vm_pressure_level",
    "vm.swapusage",
)
# the programs umemc runs to learn a machine, with exactly the arguments it gives them
PROGRAMS: tuple[list[str], ...] = (
    ["uname", "-s"],
    NVIDIA_NAME_QUERY,
    NVIDIA_QUERY,
    NVIDIA_PROCESSES,
    *(["sysctl", n] for n in SYSCTL_NAMES),
    PMSET,
    ["vm_stat"],
    ["memory_pressure"],
)
MAC_ONLY = frozenset({"sysctl", "pmset", "vm_stat", "memory_pressure"})
MAX_FILE = 1 << 20  # a machine file umemc reads is small; anything larger is not one of them


def files(root: Path) -> Iterator[tuple[str, bytes]]:
    """(relative path, bytes) of every machine file under `root` that umemc reads."""
    seen: set[str] = set()
    for pattern in FILES:
        for found in sorted(root.glob(pattern)):
            rel = found.relative_to(root).as_posix()
            if rel in seen or not found.is_file():
                continue
            try:
                with open(found, "rb") as f:
                    data = f.read(MAX_FILE + 1)
            except OSError:
                continue  # root-only (debugfs), or gone between the glob and the read
            if len(data) <= MAX_FILE:
                seen.add(rel)
                yield rel, data


def answers() -> dict[str, list[tuple[list[str], int, str]]]:
    """program -> [(argv, exit code, stdout)] of every program umemc asks that this machine has."""
    out: dict[str, list[tuple[list[str], int, str]]] = {}
    mac = hostroot.host_os() == "darwin"
    for argv in PROGRAMS:
        if argv[0] in MAC_ONLY and not mac:
            continue  # Linux has a `sysctl` of its own, which umemc never asks
        found = hostroot.program(argv[0])
        if found is None:
            continue
        try:
            done = subprocess.run([found, *argv[1:]], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        out.setdefault(argv[0], []).append((argv, done.returncode, done.stdout))
    return out


def script(name: str, recorded: list[tuple[list[str], int, str]]) -> str:
    """bin/NAME: prints what NAME printed for each recorded argument list (its outputs in NAME.out/N)."""
    lines = [
        "#!/bin/sh",
        f"# what `{name}` printed on the machine `umemc doctor --capture` recorded (CAPTURE.json says which)",
        'here=$(dirname "$0")',
        'case "$*" in',
    ]
    for i, (argv, code, _) in enumerate(recorded):
        args = " ".join(argv[1:])
        if "'" in args or any(c < " " for c in args):
            raise ValueError(f"cannot record {argv!r}: a quote or a control character in its arguments")
        lines.append(f"'{args}') cat \"$here/{name}.out/{i}\"; exit {int(code)} ;;")
    lines += ["esac", f'echo "{name}: not recorded: $*" >&2', "exit 2", ""]
    return "\n".join(lines)


def mac_facts() -> dict[str, object]:
    """Metal's working set, the thermal state and the room for swap files, where this is a Mac (a recorded one's,
    replayed)."""
    if hostroot.host_os() != "darwin":
        return {}
    from .heat import macos_thermal_state
    from .machine import metal_working_set, swap_room, swap_volume

    return {
        "metal_recommended_max_working_set_bytes": metal_working_set(),
        "thermal_state": macos_thermal_state(),
        "swap_volume_free_bytes": swap_room(swap_volume()),
    }


def capture(out: Path, version: str) -> dict[str, object]:
    """Write the machine into `out` (a .tar.gz), atomically; returns what CAPTURE.json says."""
    entries: dict[str, tuple[bytes, int]] = {rel: (data, 0o644) for rel, data in files(hostroot.root())}
    programs = answers()
    for name, recorded in programs.items():
        entries[f"bin/{name}"] = (script(name, recorded).encode(), 0o755)
        for i, (_, _, stdout) in enumerate(recorded):
            entries[f"bin/{name}.out/{i}"] = (stdout.encode(), 0o644)
    facts = mac_facts()
    if facts:
        entries[FACTS] = (json.dumps(facts, indent=2).encode(), 0o644)
    about: dict[str, object] = {
        "captured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "umemc": version,
        "files": sorted(r for r in entries if not r.startswith("bin/")),
        "programs": {n: [" ".join(a) for a, _, _ in r] for n, r in sorted(programs.items())},
    }
    entries["CAPTURE.json"] = (json.dumps(about, indent=2).encode(), 0o644)
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for rel, (data, mode) in sorted(entries.items()):
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return about
