"""The page cache of model files, where the GPU cannot take it back in time.

On a machine whose GPU allocates from system memory through its own driver (a GB10 / DGX Spark, a Jetson:
`nvidia-unified`), memory the kernel would hand back from its file cache on demand is counted as available
(MemAvailable), but a CUDA allocation does not wait for that reclaim: a warm cache of model files pushes a load
into out-of-memory, and owners drop caches before loading (`sync; echo 1 > /proc/sys/vm/drop_caches`, for the
whole machine). umemc does the narrow part of that itself: the clean cached pages of the stack's own model files
that no process maps, released with posix_fadvise(POSIX_FADV_DONTNEED) (the kernel drops only clean, unmapped,
unlocked pages of that file: a running worker's mapped weights stay). The gateway does it before each cold start
there and for the started model's file once it serves (its weights are in the GPU's buffers by then), `umemc up`
once its hot workers serve.

How much of a file is cached is read with mincore(2) over a read-only mapping of it (a page is reported resident
whether or not this process touched it)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..contract import ModelDoc

PAGE = mmap.PAGESIZE
CHUNK = 1 << 30  # mincore over a mapping of at most 1 GiB at a time: its vector is 256 KiB


def _libc() -> ctypes.CDLL | None:
    """libc with mmap, munmap and mincore declared once; None where there is none to load."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mincore"):
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


_LIBC = _libc()


def cached_bytes(path: Path) -> int | None:
    """Bytes of the file in the page cache now (whole pages, the last one cut to the file's size); None where the
    platform cannot tell (no mincore) or the file cannot be read."""
    if _LIBC is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        total = 0
        for offset in range(0, size, CHUNK):
            length = min(CHUNK, size - offset)
            resident = _resident_pages(fd, offset, length)
            if resident is None:
                return None
            total += resident * PAGE
        return min(total, size)
    finally:
        os.close(fd)


def _resident_pages(fd: int, offset: int, length: int) -> int | None:
    """Pages of [offset, offset + length) of the file in the cache: mincore over a read-only shared mapping made
    and unmade through libc (Python's mmap objects do not give their address)."""
    assert _LIBC is not None
    libc = _LIBC
    start = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    if start is None or start == ctypes.c_void_p(-1).value:
        return None
    try:
        vector = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
        if libc.mincore(start, length, vector) != 0:
            return None
        flags = bytes(vector)  # bit 0: resident; the others are reserved and zero
        return len(flags) - flags.count(0)
    finally:
        libc.munmap(start, length)


def model_files(models: Iterable[ModelDoc]) -> list[Path]:
    """The files of these models (weights and projectors), each once."""
    return sorted({Path(f) for m in models for f in (m.model_file, m.mmproj_file) if f})


def release(paths: Iterable[Path]) -> int:
    """Ask the kernel to drop the cached pages of each file nobody maps; returns the bytes no longer cached (by
    mincore before and after; 0 where that cannot be read). A file that is gone or unreadable is skipped."""
    freed = 0
    for path in paths:
        before = cached_bytes(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            continue
        finally:
            os.close(fd)
        after = cached_bytes(path)
        if before is not None and after is not None:
            freed += max(0, before - after)
    return freed
