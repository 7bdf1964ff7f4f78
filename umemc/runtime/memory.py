"""Really resident memory, quickly: anonymous mappings with transparent huge pages requested
(MADV_HUGEPAGE), filled 2 MiB at a time. Page faults on small pages cost ~350 MB/s on some VMs;
huge pages fault at several GB/s, so placeholders and test leakers reach their sizes and rates."""

from __future__ import annotations

import mmap

STEP = 2 * 1024 * 1024
_PATTERN = b"\x01" * STEP


class Held:
    """Memory that stays resident while the object lives; grow() adds to it."""

    def __init__(self) -> None:
        self.maps: list[mmap.mmap] = []
        self.bytes = 0

    def grow(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        size = -(-nbytes // STEP) * STEP
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        for off in range(0, size, STEP):
            m[off : off + STEP] = _PATTERN  # every page written: resident, not just reserved
        self.maps.append(m)
        self.bytes += size

    def release(self) -> None:
        for m in self.maps:
            m.close()
        self.maps, self.bytes = [], 0
