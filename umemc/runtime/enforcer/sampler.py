"""What a worker holds, read through the host's probes (umemc.runtime.probes.host: the same interface on Linux
and macOS): its process tree's memory (RSS from kept-open statm on Linux, phys_footprint on macOS) or its cgroup's
charge, GPU-side bytes (DRM fdinfo on AMD, the NVIDIA driver's per-process figure now and then on discrete and
unified NVIDIA alike; on macOS Metal's buffers are already in the footprint), what of it is swapped out, its
activity, its own ledger; and the machine's memory pressure and swap."""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from ...contract import CgroupRecord, PlanDoc, WorkerReport, read_optional
from ...records import read_text
from ..cgroups import Cgroup
from ..probes import nvidia
from ..probes.drm import DrmProbe
from ..probes.host import Probes, marked_processes, probes
from ..probes.swap import Swap
from ..rundir import RunDir, run_mark
from .worker_state import Worker

NVIDIA_EVERY_S = 2.0
NVIDIA_KINDS = frozenset({"nvidia-discrete", "nvidia-unified"})
T = TypeVar("T")


class OffLoop(Generic[T]):
    """A slow read (nvidia-smi is a process of its own, ~50 ms, up to its 5 s timeout) kept off the enforcer's
    loop, which must see a worker over its hard quota within a sample: asked in a thread of its own at most every
    `every_s`, never two at once; `poll` returns its latest answer at once (`initial` until the first)."""

    def __init__(self, read: Callable[[], T], every_s: float, initial: T, name: str):
        self.read, self.every_s, self.value, self.name = read, every_s, initial, name
        self._last = -math.inf
        self._thread: threading.Thread | None = None
        self.answered = False  # a read has answered (value is no longer `initial`)

    def poll(self, now: float) -> T:
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
        if self._thread is None and now - self._last >= self.every_s:
            self._last = now
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self.value

    def wait(self) -> T:
        """Until the read under way (if any) has answered (tests)."""
        if self._thread is not None:
            self._thread.join()
        return self.value

    def _run(self) -> None:
        try:
            self.value = self.read()
            self.answered = True
        except Exception as exc:  # noqa: BLE001 - a read that fails keeps the last answer; the loop goes on
            print(f"umemc-enforcer: {self.name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


class Sampler:
    def __init__(self, plan: PlanDoc, run_dir: RunDir, host: Probes | None = None):
        self.run_dir = run_dir
        self.kind = plan.platform.kind
        self.usable = int(plan.capacity.usable_bytes)
        self.host = host or probes(plan.platform.kind, plan.platform.gpu_window_bytes, plan.policy.evict_above)
        self.procs = self.host.processes
        self.box = self.host.box
        self.drm = DrmProbe()
        self._mark = run_mark(run_dir.state)
        self.nvidia_reads: OffLoop[dict[int, int]] = OffLoop(nvidia.query, NVIDIA_EVERY_S, {}, "nvidia-processes")
        self.last_swap: Swap | None = None
        self._reports: dict[str, Path] = {}  # each worker's own report's path (built once: read every second)

    def cpu_side(self, w: Worker) -> int:
        """In its own cgroup, a worker's CPU-side memory is what the kernel charges and limits there
        (RSS would also count shared library pages charged elsewhere); otherwise its tree's memory as the
        platform counts it (RSS on Linux, phys_footprint on macOS)."""
        if w.cgroup is not None:
            return w.cgroup.usage()
        return sum(self.procs.memory(p) for p in w.pids)

    def gpu(self, pids: list[int]) -> int:
        """GPU-side bytes not already in the CPU-side figure: DRM GTT/VRAM (AMD, Intel), NVIDIA per-process memory
        (VRAM on a discrete card; on a DGX Spark or Jetson system memory the driver maps for the GPU, in neither the
        process's RSS nor its cgroup's charge: umemc.runtime.probes.nvidia). On macOS a process's Metal buffers are
        in its footprint."""
        if self.kind == "amd-apu" and self.host.platform == "linux":
            return self.drm.gpu_bytes(pids)
        if self.kind in NVIDIA_KINDS:
            figures = self.nvidia_reads.value
            return sum(figures.get(p, 0) for p in pids)
        return 0

    def record(self, w: Worker, cpu_side: int) -> None:
        """A sample: the CPU side just read (kept-open preads) and the GPU side."""
        w.cpu_side, w.gpu_side = cpu_side, self.gpu(w.pids)
        if self.kind in NVIDIA_KINDS and self.nvidia_reads.answered:
            w.gpu_visible = any(p in self.nvidia_reads.value for p in w.pids)
        w.peak = max(w.peak, w.usage)

    def refresh_nvidia(self, now: float) -> None:
        """The NVIDIA driver's per-process figures, asked off the loop every NVIDIA_EVERY_S."""
        if self.kind in NVIDIA_KINDS:
            self.nvidia_reads.poll(now)

    def attach_cgroup(self, w: Worker) -> None:
        """The exec wrapper records `version path pid` once it has placed the worker; until then
        (a few ms after start) the worker is sampled by RSS."""
        rec = self.placed(w)
        if rec is None or rec.pid != w.pid:
            return
        w.cgroup = Cgroup(rec.version, rec.path)
        self.count_ooms_in(w, w.cgroup)
        if w.allowance:  # the wrapper set the plan's limit: a lease has raised it since
            self.apply_limits(w)

    def placed(self, w: Worker) -> CgroupRecord | None:
        """Where the wrapper last placed the worker (None before any run was, or without kernel enforcement)."""
        try:
            return CgroupRecord.parse(read_text(self.run_dir.cgroups / w.name))
        except (OSError, ValueError):
            return None

    def find_oom_group(self, w: Worker, *, from_now: bool = False) -> None:
        """The group the wrapper last placed the worker in, as the one whose OOM kills are its (count_ooms_in)."""
        rec = self.placed(w)
        if rec is not None:
            self.count_ooms_in(w, Cgroup(rec.version, rec.path), from_now=from_now)

    @staticmethod
    def count_ooms_in(w: Worker, group: Cgroup, *, from_now: bool = False) -> None:
        """The group whose OOM kills are the worker's from now on. A group new to the enforcer was made after it
        started (each of its kills is news) unless `from_now` (the enforcer started beside a running stack: what
        the group counted before was said by the enforcer before it)."""
        if w.oom_group == group:
            return
        w.oom_group, w.oom_seen = group, group.oom_kills() if from_now else 0

    def apply_limits(self, w: Worker) -> None:
        """The kernel's limit of the worker's cgroup to its quotas in force (the plan's plus its leases)."""
        if w.cgroup is None:
            return
        try:
            w.cgroup.set_limits(w.hard, w.soft)
        except OSError as exc:  # a group that vanished with its process, a full kernel: the enforcer still kills
            print(f"umemc-enforcer: cannot set {w.name}'s cgroup limit: {exc.strerror}", file=sys.stderr, flush=True)

    def refresh(self, w: Worker, now: float) -> None:
        """The worker's process tree (with what escaped it), its GPU descriptors, activity, its own ledger
        and a 1 Hz usage sample."""
        assert w.pid is not None
        w.pids = self.procs.descendants(w.pid)
        w.escaped = [(p, t) for p, t in w.escaped if p not in w.pids and self.procs.start_time(p) == t]
        w.pids += [p for p, _ in w.escaped]
        if self.kind == "amd-apu" and self.host.platform == "linux":
            self.drm.refresh(w.pids)
        self.record(w, self.cpu_side(w))
        # what `ps` shows: a cgroup is charged only for the pages first touched inside it (a model file cached
        # before the start is charged to whoever read it first), the tree's resident memory counts them all
        w.resident = sum(self.procs.memory(p) for p in w.pids) if w.cgroup is not None else w.cpu_side
        w.samples.append((now, w.usage))
        w.history.add(now, w.usage)
        w.swapped = self.swapped(w.pids)
        cpu = self.procs.cpu_ticks(w.pid)
        if cpu != w.last_cpu:
            w.last_cpu, w.last_active = cpu, now
        report = self._reports.get(w.name)
        if report is None:
            report = self._reports[w.name] = self.run_dir.worker_report(w.name)
        doc = read_optional(WorkerReport, report)
        mine = doc is not None and doc.pid == w.pid
        w.reserved = doc.reserved_bytes if doc is not None and mine else 0
        held = doc.allocator if doc is not None and mine else None
        w.allocator_unused = None if held is None else max(0, held.reserved_bytes - held.allocated_bytes)

    def find_escaped(self, workers: list[Worker]) -> None:
        """A worker without a cgroup of its own can leave its tree (fork, setsid, fork): its processes still
        carry the run's mark and their model's name (set by the exec wrapper, inherited), so they are found
        and counted against its quota, and killed with it."""
        by_model = {w.name: w for w in workers if w.pid and w.cgroup is None}
        if not by_model:
            return
        for pid, model in marked_processes(self._mark, self.procs):
            w = by_model.get(model or "")
            if w is not None and pid not in w.pids and pid != w.pid:
                w.escaped.append((pid, self.procs.start_time(pid)))

    def swapped(self, pids: list[int]) -> int | None:
        """What of a process tree sits in swap, where the platform tells per process (Linux); None where not."""
        known = [s for s in (self.procs.swapped(p) for p in pids) if s is not None]
        return sum(known) if known else None

    def available(self) -> int | None:
        """The memory the OS has available now (bytes): MemAvailable, or macOS's free + inactive pages."""
        return self.box.available()

    def swap(self) -> Swap | None:
        return self.box.swap()

    def pressure(self, workers: list[Worker]) -> float:
        """The conservative one of: 1 - available/usable (the OS's view), the workers' own total against usable,
        the GPU window's used share where the driver tells it (amdgpu's GTT; macOS's wired pages), and the OS's own
        pressure signal where it has one (macOS's memorystatus level)."""
        available = self.box.available()
        held = sum(w.usage for w in workers if w.pid)
        return max(
            1 - (available if available is not None else self.usable) / self.usable,
            held / self.usable,
            self.box.gpu_share(),
            self.box.os_pressure(self.usable),
        )
