"""Processes through psutil: the same interface as umemc.runtime.probes.proc (Linux's direct /proc reads) on
every platform psutil supports (macOS, the BSDs, Linux). psutil.Process objects are kept per pid so a pid
reused by a new process is never mistaken for the old one (psutil checks the creation time)."""

from __future__ import annotations

import psutil

RUN_KEYS = ("UMEMC_RUN", "UMEMC_MODEL")
TICKS = 100  # start_time and cpu_ticks in hundredths of a second, like Linux's USER_HZ
ERRORS = (psutil.Error, OSError, ValueError)


class PsutilProcesses:
    name = "psutil"
    memory_figure = "rss"

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}

    def _proc(self, pid: int, *, check: bool = True) -> psutil.Process | None:
        """The kept Process of `pid`; `check`: make sure it is still that process (one more system call: the
        per-sample memory read skips it, the once-a-second tree walk that replaces the set does not)."""
        p = self._procs.get(pid)
        if p is not None and (not check or p.is_running()):
            return p
        try:
            p = psutil.Process(pid)
        except ERRORS:
            self._procs.pop(pid, None)
            return None
        self._procs[pid] = p
        return p

    # -- identity -----------------------------------------------------------------------------
    def alive(self, pid: int) -> bool:
        p = self._proc(pid)
        try:
            return p is not None and p.status() != psutil.STATUS_ZOMBIE
        except ERRORS:
            return False

    def start_time(self, pid: int) -> int:
        p = self._proc(pid)
        try:
            return 0 if p is None else round(p.create_time() * TICKS)
        except ERRORS:
            return 0

    def run_environ(self, pid: int) -> dict[str, str]:
        p = self._proc(pid)
        try:
            env = {} if p is None else p.environ()
        except ERRORS:
            return {}
        return {k: env[k] for k in RUN_KEYS if k in env}

    def cmdline(self, pid: int) -> list[str]:
        p = self._proc(pid)
        try:
            return [] if p is None else list(p.cmdline())
        except ERRORS:
            return []

    def pids(self) -> list[int]:
        return list(psutil.pids())

    # -- trees --------------------------------------------------------------------------------
    def children(self, pid: int) -> frozenset[int]:
        p = self._proc(pid)
        try:
            return frozenset() if p is None else frozenset(c.pid for c in p.children())
        except ERRORS:
            return frozenset()

    def descendants(self, root: int) -> list[int]:
        """The root and every descendant, from one table of parents (psutil builds it once per call)."""
        p = self._proc(root)
        if p is None:
            return [root]
        try:
            return [root, *(c.pid for c in p.children(recursive=True))]
        except ERRORS:
            return [root]

    # -- memory -------------------------------------------------------------------------------
    def memory(self, pid: int) -> int:
        p = self._proc(pid, check=False)
        try:
            return 0 if p is None else int(p.memory_info().rss)
        except ERRORS:
            self.forget(pid)
            return 0

    def swapped(self, pid: int) -> int | None:
        """Unknown here: psutil gives a process's swap only on Linux, by reading every mapping (smaps: far too slow
        for a sample); the machine's swap (Box.swap) is watched instead."""
        return None

    def cpu_ticks(self, pid: int) -> int:
        p = self._proc(pid)
        try:
            t = None if p is None else p.cpu_times()
        except ERRORS:
            return 0
        return 0 if t is None else round((t.user + t.system) * TICKS)

    def forget(self, pid: int) -> None:
        self._procs.pop(pid, None)

    def prune(self, alive: set[int]) -> None:
        for pid in [p for p in self._procs if p not in alive]:
            self.forget(pid)

    def close(self) -> None:
        self._procs.clear()
