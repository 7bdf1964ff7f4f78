"""GPU memory per process on NVIDIA: `nvidia-smi --query-compute-apps=pid,used_memory
--format=csv,noheader,nounits` prints one `PID, MiB` line per compute process (GB10 may print
`[N/A]`: its memory is system memory and already in RSS). Slow (~50 ms), so sampled rarely."""

from __future__ import annotations

import shutil
import subprocess

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def parse_compute_apps(text: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
            continue  # "[N/A]" or a header
        out[int(parts[0])] = out.get(int(parts[0]), 0) + int(parts[1]) * 1024 * 1024
    return out


def query() -> dict[int, int]:
    if shutil.which("nvidia-smi") is None:
        return {}
    try:
        done = subprocess.run(QUERY, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_compute_apps(done.stdout) if done.returncode == 0 else {}
