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
