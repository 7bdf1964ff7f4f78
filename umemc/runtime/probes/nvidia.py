"""GPU memory per process on NVIDIA, from the driver's own accounting.

- NVML, through nvidia-ml-py (`import pynvml`) where it is installed: per device,
  `nvmlDeviceGetComputeRunningProcesses`, each process's `pid` and `usedGpuMemory` in bytes (None where the
  driver says the value is not available). In-process, about a millisecond.
- `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits` otherwise, or for what NVML
  could not say: one `PID, MiB` line per compute process (the fields `nvidia-smi --help-query-compute-apps`
  lists; a value the driver cannot give reads `[N/A]`, one the GPU does not support `[Not Supported]`). A
  process of its own, ~50 ms: sampled every NVIDIA_EVERY_S.

Each process is counted from one source, never both. What the figure is depends on the machine: on a discrete
card it is VRAM; on a GB10 (DGX Spark) or a Jetson, where the GPU allocates from system memory, it is memory the
driver maps for the GPU, which is neither in the process's RSS nor charged to its memory cgroup (so a worker
could outgrow its quota unseen): the enforcer adds it to the worker's CPU side on both kinds."""

from __future__ import annotations

from typing import Any

from .tools import answer

QUERY = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
MiB = 1024 * 1024


def parse_compute_apps(text: str) -> dict[int, int | None]:
    """pid -> bytes from nvidia-smi's csv lines (a pid listed twice, on two devices, is summed); None for a process
    whose figure the driver could not give (`[N/A]`, `[Not Supported]`)."""
    out: dict[int, int | None] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue  # a blank line, or a header where the format was not asked for
        pid, mib = int(parts[0]), parts[1]
        if not mib.isdigit():
            out.setdefault(pid, None)
            continue
        out[pid] = (out.get(pid) or 0) + int(mib) * MiB
    return out


def smi() -> dict[int, int | None] | None:
    """nvidia-smi's answer; None where it is not installed or does not answer."""
    text = answer(QUERY)
    return None if text is None else parse_compute_apps(text)


def nvml() -> dict[int, int | None] | None:
    """NVML's answer (every device's compute processes); None where nvidia-ml-py is not installed or NVML does not
    start (no driver)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses, and more where the library is absent
        return None
    try:
        out: dict[int, int | None] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                used: Any = proc.usedGpuMemory
                if isinstance(used, int) and used >= 0:
                    out[proc.pid] = (out.get(proc.pid) or 0) + used
                else:
                    out.setdefault(proc.pid, None)
        return out
    except Exception:  # noqa: BLE001 - a device that stops answering mid-way: no figure rather than half of one
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def query() -> dict[int, int]:
    """pid -> bytes of GPU memory, each process from one source: NVML's figure where it gives one, else
    nvidia-smi's (asked only when NVML is absent or left a process without a figure). A process no source can
    give a figure for is left out."""
    first = nvml()
    if first is not None and all(v is not None for v in first.values()):
        return {pid: v for pid, v in first.items() if v is not None}
    second = smi() or {}
    out: dict[int, int] = {}
    for pid in {*(first or {}), *second}:
        figure = (first or {}).get(pid)
        if figure is None:
            figure = second.get(pid)
        if figure is not None:
            out[pid] = figure
    return out
