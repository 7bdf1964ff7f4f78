"""Linux: processes read straight from /proc. The files the enforcer reads every sample or every second (statm,
stat, status, each thread's children) are read with pread on descriptors kept open per process: the kernel makes a
/proc file's content afresh at each read from offset 0, so a sample is one pread (0.6 µs) instead of an open, a
read and a close (9 µs here; docs/ESTIMATES.md has the figures). Children come from /proc/PID/task/*/children
(instead of scanning all of /proc), swapped pages from `status`. Never `ps`, never smaps on the hot path. The same
interface on every other platform is umemc.runtime.probes.psproc (psutil); bench/sampler.py measures why Linux keeps
these reads."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")
RUN_KEYS = (b"UMEMC_RUN", b"UMEMC_MODEL")
READ_MAX = 64 * 1024  # a /proc file read through a kept descriptor; one this long or longer is read whole instead


def _keep_at_most() -> int:
    """How many descriptors may be kept open: half of this process's limit (the rest for its sockets and logs)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 512 if soft == resource.RLIM_INFINITY else max(0, soft // 2)


class LinuxProcesses:
    """The machine's processes as /proc shows them; statm descriptors are cached per pid."""

    name = "linux /proc"
    memory_figure = "rss"  # what the kernel's OOM killer and a memory cgroup charge follow

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._fds: dict[int, dict[str, int]] = {}  # pid -> its files' kept descriptors, by name under /proc/PID
        self._threads: dict[int, dict[str, int]] = {}  # pid -> its threads' children files' descriptors, by tid
        self._kept = 0
        self._cap = _keep_at_most()

    def _pread(self, files: dict[str, int], name: str, path: str) -> bytes:
        """The file at `path` from its start, through its descriptor kept in `files` under `name` (past the cap:
        opened, read and closed). OSError where it cannot be read: the process (or thread) is gone, the descriptor
        closed."""
        fd = files.get(name)
        if fd is None:
            if self._kept >= self._cap:
                with open(path, "rb") as f:
                    return f.read()
            fd = files[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._kept += 1
        try:
            data = os.pread(fd, READ_MAX, 0)
        except OSError:
            self._close(files, name)
            raise
        if len(data) < READ_MAX:
            return data
        with open(path, "rb") as f:  # longer than a kept read takes (children of thousands of processes)
            return f.read()

    def _own(self, pid: int, name: str) -> bytes:
        """/proc/PID/NAME (statm, stat, status), kept open per process."""
        return self._pread(self._fds.setdefault(pid, {}), name, f"{self.proc}/{pid}/{name}")

    def _close(self, files: dict[str, int], name: str) -> None:
        os.close(files.pop(name))
        self._kept -= 1

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
        """Direct children: each thread's children file (a thread that forked lists its own), one pread each."""
        out: set[int] = set()
        try:
            tasks = os.listdir(f"{self.proc}/{pid}/task")
        except OSError:
            self.forget(pid)  # gone: what was kept open of it too
            return frozenset()
        kept = self._threads.setdefault(pid, {})
        where = f"{self.proc}/{pid}/task/"
        for tid in tasks:
            try:
                listed = self._pread(kept, tid, f"{where}{tid}/children")
                if listed:  # most threads fork nothing
                    out.update(map(int, listed.split()))
            except (OSError, ValueError):
                pass
        if len(kept) > len(tasks):
            for tid in kept.keys() - set(tasks):  # threads that ended
                self._close(kept, tid)
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
        try:
            return int(self._own(pid, "statm").split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            self.forget(pid)
            return 0

    def swapped(self, pid: int) -> int | None:
        """VmSwap of /proc/PID/status (kB): what of the process the kernel has written to swap."""
        try:
            text = self._own(pid, "status")
        except OSError:
            return None
        at = text.find(b"VmSwap:")
        if at < 0:
            return None  # a kernel thread, or a kernel without swap accounting
        return int(text[at + 7 : text.index(b"kB", at)]) * 1024

    def cpu_ticks(self, pid: int) -> int:
        """utime + stime of one process (an activity signal for least-recently-used eviction)."""
        try:
            rest = self._own(pid, "stat").rsplit(b")", 1)[1].split()
            return int(rest[11]) + int(rest[12])
        except (OSError, IndexError, ValueError):
            return 0

    def forget(self, pid: int) -> None:
        for files in (self._fds.pop(pid, {}), self._threads.pop(pid, {})):
            for name in list(files):
                self._close(files, name)

    def prune(self, alive: set[int]) -> None:
        for pid in [p for p in self._fds.keys() | self._threads.keys() if p not in alive]:
            self.forget(pid)

    def close(self) -> None:
        for pid in list(self._fds.keys() | self._threads.keys()):
            self.forget(pid)
