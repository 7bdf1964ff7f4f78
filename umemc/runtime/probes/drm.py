"""GPU memory per process from DRM fdinfo (AMD, Intel): the format is specified by the kernel in
Documentation/gpu/drm-usage-stats.rst. For each open file of /dev/dri/*, /proc/PID/fdinfo/FD
holds `drm-client-id`, `drm-pdev` and `drm-memory-<region>: N KiB` lines (amdgpu: vram, gtt,
cpu). Several fds of one process may share a client: dedupe by (pdev, client id). GTT is neither
in RSS nor charged to memory cgroups, so the enforcer adds it to the CPU-side figure."""

from __future__ import annotations

import os

_UNITS = {"": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
REGIONS = ("vram", "gtt")


def parse_fdinfo(text: str) -> tuple[tuple[str, str] | None, dict[str, int]]:
    """-> ((pdev, client id) or None when not a DRM client, {region: bytes})."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if "drm-client-id" not in fields:
        return None, {}
    mem = {}
    for key, value in fields.items():
        if key.startswith("drm-memory-"):
            number, _, unit = value.partition(" ")
            mem[key[len("drm-memory-") :]] = int(number) * _UNITS.get(unit.strip(), 1)
    return (fields.get("drm-pdev", ""), fields["drm-client-id"]), mem


class DrmProbe:
    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._fds: dict[int, list[str]] = {}

    def refresh(self, pids: list[int]) -> None:
        """Find each process's /dev/dri descriptors (a directory scan: done now and then, not per sample)."""
        self._fds = {pid: self._scan(pid) for pid in pids}

    def _scan(self, pid: int) -> list[str]:
        fd_dir = f"{self.proc}/{pid}/fd"
        out = []
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return []
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}").startswith("/dev/dri/"):
                    out.append(fd)
            except OSError:
                continue
        return out

    def process_bytes(self, pid: int) -> dict[str, int]:
        """{region: bytes} for one process, each DRM client counted once."""
        seen: dict[tuple[str, str], dict[str, int]] = {}
        fds = self._fds[pid] if pid in self._fds else self._scan(pid)
        for fd in fds:
            try:
                with open(f"{self.proc}/{pid}/fdinfo/{fd}") as f:
                    client, mem = parse_fdinfo(f.read())
            except OSError:
                continue
            if client is not None:
                seen[client] = mem
        total: dict[str, int] = {}
        for mem in seen.values():
            for region, size in mem.items():
                total[region] = total.get(region, 0) + size
        return total

    def gpu_bytes(self, pids: list[int]) -> int:
        """Device-side bytes (VRAM + GTT) of a process tree."""
        return sum(sum(v for k, v in self.process_bytes(p).items() if k in REGIONS) for p in pids)


# PCI device ids of AMD APUs' integrated GPUs (the PCI ID Repository, pci.ids, vendor 1002): an APU with a large
# BIOS carve-out reports many GiB of "VRAM" that are the machine's own RAM
APU_DEVICE_IDS = frozenset(
    {
        0x1586,  # Strix Halo: Radeon 8050S/8060S (Ryzen AI Max)
        0x150E,  # Strix Point: Radeon 880M/890M
        0x1114,  # Krackan Point: Radeon 840M/860M
        0x15BF, 0x15C8,  # Phoenix / Hawk Point: Radeon 740M-780M
        0x1681,  # Rembrandt: Radeon 660M/680M
        0x164E,  # Raphael: Ryzen 7000 desktop iGPU
        0x1638, 0x1636, 0x164C,  # Cezanne, Renoir, Lucienne
    }
)  # fmt: skip
SMALL_VRAM = 4 << 30  # a GPU whose VRAM is this or less beside a GTT is taken for an APU


def amd_apu_cards(root: str | os.PathLike[str] = "/") -> list[tuple[str, int]]:
    """(card, VRAM bytes) of every AMD integrated GPU (amdgpu's sysfs: /sys/class/drm/cardN/device/{vendor,
    device,mem_info_vram_total,mem_info_gtt_total}, hex ids and bytes)."""
    from pathlib import Path

    out = []
    for dev in sorted(Path(root, "sys/class/drm").glob("card*/device")):
        try:
            vendor = (dev / "vendor").read_text().strip()
            if vendor != "0x1002" or not (dev / "mem_info_gtt_total").exists():
                continue
            vram = int((dev / "mem_info_vram_total").read_text().strip() or 0)
        except (OSError, ValueError):
            continue
        try:
            device = int((dev / "device").read_text().strip() or "0", 16)
        except (OSError, ValueError):
            device = 0  # unknown: the size of its VRAM decides
        if device in APU_DEVICE_IDS or vram <= SMALL_VRAM:
            out.append((dev.parent.name, vram))
    return out
