"""Linux: processes read straight from /proc. Resident pages from `statm` read with pread on kept-open
descriptors (docs/ESTIMATES.md: 1.4 µs a read), children from /proc/PID/task/*/children (59 µs, instead of
scanning all of /proc), swapped pages from `status`. Never `ps`, never smaps on the hot path. The same
interface on every other platform is umemc.runtime.probes.psproc (psutil); bench/sampler.py measures why
Linux keeps these reads."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")
RUN_KEYS = (b"UMEMC_RUN", b"UMEMC_MODEL")


class LinuxProcesses:
    """The machine's processes as /proc shows them; statm descriptors are cached per pid."""

    name = "linux /proc"
    memory_figure = "rss"  # what the kernel's OOM killer and a memory cgroup charge follow

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._fds: dict[int, int] = {}

    # -- identity -----------------------------------------------------------------------------
    def alive(self, pid: int) -> bool:
        """Running and not a zombie (a zombie also stays listed in its cgroup until it is reaped)."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except (OSError, IndexError):
            return False

    def start_time(self, pid: int) -> int:
        """Field 22 of /proc/PID/stat (clock ticks since boot): with the pid, it names one process for good."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                return int(f.read().rsplit(b")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            return 0

    def run_environ(self, pid: int) -> dict[str, str]:
        """The run's mark and model (UMEMC_RUN, UMEMC_MODEL) from a process's initial environment."""
        try:
            with open(f"{self.proc}/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            return {}
        out = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep and key in RUN_KEYS:
                out[key.decode()] = value.decode(errors="replace")
        return out

    def cmdline(self, pid: int) -> list[str]:
        try:
            with open(f"{self.proc}/{pid}/cmdline", "rb") as f:
                return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            return []

    def pids(self) -> list[int]:
        return [int(e.name) for e in os.scandir(self.proc) if e.name.isdigit()]

    # -- trees --------------------------------------------------------------------------------
    def children(self, pid: int) -> frozenset[int]:
        """Direct children (one small read per thread: cheap enough to run every sample)."""
        out: set[int] = set()
        try:
            tasks = os.listdir(f"{self.proc}/{pid}/task")
        except OSError:
            return frozenset()
        for tid in tasks:
            try:
                with open(f"{self.proc}/{pid}/task/{tid}/children", "rb") as f:
                    out.update(int(c) for c in f.read().split())
            except OSError:
                pass
        return frozenset(out)

    def descendants(self, root: int) -> list[int]:
        out, stack = [], [root]
        while stack:
            pid = stack.pop()
            out.append(pid)
            stack.extend(self.children(pid))
        return out

    # -- memory -------------------------------------------------------------------------------
    def memory(self, pid: int) -> int:
        """Resident bytes (statm's second field), 0 for a process that is gone."""
        fd = self._fds.get(pid)
        try:
            if fd is None:
                fd = os.open(f"{self.proc}/{pid}/statm", os.O_RDONLY)
                self._fds[pid] = fd
            fields = os.pread(fd, 128, 0).split()
            return int(fields[1]) * PAGE
        except (OSError, IndexError, ValueError):
            self.forget(pid)
            return 0

    def swapped(self, pid: int) -> int | None:
        """VmSwap of /proc/PID/status (kB): what of the process the kernel has written to swap."""
        try:
            with open(f"{self.proc}/{pid}/status", "rb") as f:
                text = f.read()
        except OSError:
            return None
        at = text.find(b"VmSwap:")
        if at < 0:
            return None  # a kernel thread, or a kernel without swap accounting
        return int(text[at + 7 : text.index(b"kB", at)]) * 1024

    def cpu_ticks(self, pid: int) -> int:
        """utime + stime of one process (an activity signal for least-recently-used eviction)."""
        try:
            with open(f"{self.proc}/{pid}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            return int(rest[11]) + int(rest[12])
        except (OSError, IndexError, ValueError):
            return 0

    def forget(self, pid: int) -> None:
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def prune(self, alive: set[int]) -> None:
        for pid in [p for p in self._fds if p not in alive]:
            self.forget(pid)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)
