"""On a machine with an NVIDIA GPU (a lent device; never in CI): does the driver's per-process figure (nvidia-smi
--query-compute-apps, which NVML gives too) and the process's RSS see CUDA memory, plain and managed?

The question behind not setting GGML_CUDA_ENABLE_UNIFIED_MEMORY on nvidia-unified (docs/PLATFORMS.md): llama.cpp
then allocates with cudaMallocManaged, and a quota that reads the per-process figure plus RSS must see it somewhere.
On a discrete card this measures the driver's side of the question; on a GB10 it answers it whole.

Uses the driver API through ctypes (libcuda.so.1 ships with the driver: nothing to build or install):
cuMemAlloc (plain), cuMemAllocManaged touched by the GPU (cuMemsetD8), and managed memory touched by the CPU.
Prints one line per case: what the driver lists for this pid and what RSS grew by, against the bytes allocated.

    python3 bench/device_cuda_memory.py [--mib 1024]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import time

MiB = 1 << 20
CU_MEM_ATTACH_GLOBAL = 1


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def driver_figure() -> int | None:
    """What nvidia-smi lists for this process (bytes); None where it lists it not at all."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in out.splitlines():
        pid, _, used = (p.strip() for p in line.partition(","))
        if pid == str(os.getpid()):
            return int(used) * MiB if used.isdigit() else None
    return None


def check(what: str, code: int) -> None:
    if code != 0:
        raise SystemExit(f"{what} failed: CUresult {code}")


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("--mib", type=int, default=1024)
    size = args.parse_args().mib * MiB
    cu = ctypes.CDLL("libcuda.so.1")
    check("cuInit", cu.cuInit(0))
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(device), 0))
    name = ctypes.create_string_buffer(128)
    cu.cuDeviceGetName(name, 128, device)
    check("cuCtxCreate", cu.cuCtxCreate_v2(ctypes.byref(context), 0, device))
    time.sleep(0.5)
    base_driver, base_rss = driver_figure() or 0, rss()
    print(f"device {name.value.decode()}; context: driver lists {base_driver / MiB:.0f} MiB, RSS {base_rss / MiB:.0f}")
    cases = []
    plain = ctypes.c_uint64()
    check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(plain), ctypes.c_size_t(size)))
    check("cuMemsetD8", cu.cuMemsetD8_v2(plain, 1, ctypes.c_size_t(size)))
    cu.cuCtxSynchronize()
    cases.append(("cuMemAlloc, set by the GPU", driver_figure(), rss()))
    managed = ctypes.c_uint64()
    check("cuMemAllocManaged", cu.cuMemAllocManaged(ctypes.byref(managed), ctypes.c_size_t(size), CU_MEM_ATTACH_GLOBAL))
    check("cuMemsetD8", cu.cuMemsetD8_v2(managed, 1, ctypes.c_size_t(size)))
    cu.cuCtxSynchronize()
    cases.append(("+ cuMemAllocManaged, set by the GPU", driver_figure(), rss()))
    host = ctypes.c_uint64()
    check("cuMemAllocManaged", cu.cuMemAllocManaged(ctypes.byref(host), ctypes.c_size_t(size), CU_MEM_ATTACH_GLOBAL))
    ctypes.memset(ctypes.c_void_p(host.value), 1, size)
    cases.append(("+ cuMemAllocManaged, set by the CPU", driver_figure(), rss()))
    allocated = 0
    for what, listed, resident in cases:
        allocated += size
        seen = "not listed" if listed is None else f"{(listed - base_driver) / MiB:+.0f} MiB"
        print(
            f"{what}: {allocated / MiB:.0f} MiB allocated in all; the driver's figure {seen}, "
            f"RSS {(resident - base_rss) / MiB:+.0f} MiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
