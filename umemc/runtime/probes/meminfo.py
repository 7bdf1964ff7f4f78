"""/proc/meminfo: MemAvailable, swap, and Jetson's NvMap counters (values in kB)."""

from __future__ import annotations


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


class MemAvailable:
    """MemAvailable in bytes, re-read each call from a kept-open descriptor (the enforcer's hot path)."""

    def __init__(self, path: str = "/proc/meminfo"):
        import os

        self._os = os
        self.fd = os.open(path, os.O_RDONLY)

    def read(self) -> int | None:
        data = self._os.pread(self.fd, 8192, 0)
        at = data.find(b"MemAvailable:")
        if at < 0:
            return None
        return int(data[at + 13 : data.index(b"kB", at)]) * 1024

    def close(self) -> None:
        self._os.close(self.fd)
