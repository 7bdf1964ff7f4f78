"""What a worker holds, read from the kernel and the drivers: its process tree's RSS or its cgroup's
charge (kept-open statm, task children), GPU-side bytes (DRM fdinfo on AMD, nvidia-smi now and then on
discrete NVIDIA), its activity, its own ledger; and the machine's memory pressure."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ...contract import CgroupRecord, PlanDoc, WorkerReport, read_optional
from ..cgroups import Cgroup
from ..probes import nvidia
from ..probes.drm import DrmProbe
from ..probes.meminfo import MemAvailable
from ..probes.proc import ProcTree, marked_processes
from ..rundir import RunDir
from ..wrap import run_mark, start_time
from .worker import Worker

NVIDIA_EVERY_S = 2.0


class Sampler:
    def __init__(self, plan: PlanDoc, run_dir: RunDir, proc: str = "/proc"):
        self.run_dir = run_dir
        self.kind = plan.platform.kind
        self.usable = int(plan.capacity.usable_bytes)
        self.proc = ProcTree(proc)
        self.drm = DrmProbe(proc)
        self._meminfo = MemAvailable()
        self._mark = run_mark(run_dir.state)
        self._nvidia: dict[int, int] = {}
        self._last_nvidia = 0.0

    def cpu_side(self, w: Worker) -> int:
        """In its own cgroup, a worker's CPU-side memory is what the kernel charges and limits there
        (RSS would also count shared library pages charged elsewhere); otherwise the tree's RSS."""
        if w.cgroup is not None:
            return w.cgroup.usage()
        return sum(self.proc.rss(p) for p in w.pids)

    def gpu(self, pids: list[int]) -> int:
        """GPU-side bytes not already in RSS: DRM GTT/VRAM (AMD, Intel), NVIDIA per-process memory."""
        if self.kind == "amd-apu":
            return self.drm.gpu_bytes(pids)
        if self.kind == "nvidia-discrete" and self._nvidia:
            return sum(self._nvidia.get(p, 0) for p in pids)
        return 0

    def record(self, w: Worker, cpu_side: int) -> None:
        """A sample: the CPU side just read (kept-open preads) and the GPU side."""
        w.cpu_side, w.gpu_side = cpu_side, self.gpu(w.pids)
        w.peak = max(w.peak, w.usage)

    def refresh_nvidia(self, now: float) -> None:
        if self.kind == "nvidia-discrete" and now - self._last_nvidia >= NVIDIA_EVERY_S:
            self._nvidia, self._last_nvidia = nvidia.query(), now

    def attach_cgroup(self, w: Worker) -> None:
        """The exec wrapper records `version path pid` once it has placed the worker; until then
        (a few ms after start) the worker is sampled by RSS."""
        try:
            rec = CgroupRecord.parse((self.run_dir.cgroups / w.name).read_text())
        except (OSError, ValueError):
            return
        if rec.pid == w.pid:
            w.cgroup = Cgroup(rec.version, rec.path)
            w.oom_seen = w.cgroup.oom_kills()
            if w.allowance:  # the wrapper set the plan's limit: a lease has raised it since
                self.apply_limits(w)

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
        w.pids = self.proc.descendants(w.pid)
        w.escaped = [(p, t) for p, t in w.escaped if p not in w.pids and start_time(p) == t]
        w.pids += [p for p, _ in w.escaped]
        if self.kind == "amd-apu":
            self.drm.refresh(w.pids)
        self.record(w, self.cpu_side(w))
        w.samples.append((now, w.usage))
        w.history.add(now, w.usage)
        cpu = self.proc.cpu_ticks(w.pid)
        if cpu != w.last_cpu:
            w.last_cpu, w.last_active = cpu, now
        doc = read_optional(WorkerReport, self.run_dir.worker_report(w.name))
        w.reserved = doc.reserved_bytes if doc is not None and doc.pid == w.pid else 0

    def find_escaped(self, workers: list[Worker]) -> None:
        """A worker without a cgroup of its own can leave its tree (fork, setsid, fork): its processes still
        carry the run's mark and their model's name (set by the exec wrapper, inherited), so they are found
        and counted against its quota, and killed with it."""
        by_model = {w.name: w for w in workers if w.pid and w.cgroup is None}
        if not by_model:
            return
        for pid, model in marked_processes(self._mark):
            w = by_model.get(model or "")
            if w is not None and pid not in w.pids and pid != w.pid:
                w.escaped.append((pid, start_time(pid)))

    def available(self) -> int | None:
        """The OS's MemAvailable now (bytes)."""
        return self._meminfo.read()

    def pressure(self, workers: list[Worker]) -> float:
        """The conservative one of: 1 - MemAvailable/usable (the OS's view), the workers' own total
        against usable, and the GPU window's used share where the driver tells it."""
        available = self._meminfo.read()
        held = sum(w.usage for w in workers if w.pid)
        gtt = gtt_used_share() if self.kind == "amd-apu" else 0.0
        return max(1 - (available if available is not None else self.usable) / self.usable, held / self.usable, gtt)


def gtt_used_share(drm_root: str = "/sys/class/drm") -> float:
    """AMD: mem_info_gtt_used / mem_info_gtt_total of the first card that has them (bytes)."""
    try:
        cards = sorted(os.listdir(drm_root))
    except OSError:
        return 0.0
    for card in cards:
        base = f"{drm_root}/{card}/device"
        try:
            used = int(Path(f"{base}/mem_info_gtt_used").read_text())
            total = int(Path(f"{base}/mem_info_gtt_total").read_text())
        except (OSError, ValueError):
            continue
        if total:
            return used / total
    return 0.0
