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
