"""The enforcer's checks: each turns a quota rule's answer (umemc.runtime.enforcer.rules, pure) into what is done
about it, a kill, a stop or an event, once per crossing. The loop (loop.py) decides when each runs: `hard` on every
sample and between samples for a worker near its quota, `soft` on every sample, the rest once a second."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any

from ...contract import ModelDoc, PlanDoc
from ...lockfile import host_bytes, local, totals
from ..event_log import EventLog
from ..llamalog import metal_working_set, parse_buffers
from ..rundir import RunDir
from ..supervisor import ANSWERING, ProcState, Supervisor
from . import rules
from .helpers import HelperWatch, answering
from .sampler import OffLoop, Sampler
from .worker_state import Finding, Phase, Worker

DRIFT_SETTLE_S = 5.0  # after supervisord calls it RUNNING (itself 5 s after the start)
HELPERS_EVERY_S = 1.0  # a split model stopped for a lost helper: how often its helpers are asked if they are back
LOG_TAIL = 512 * 1024  # of a llama.cpp worker's logs, for its buffer report


class Checks:
    """Given what they use: the plan (`plan`, replaced when the loop adopts a new one), the sampler, supervisord,
    the kill of a worker's tree and the event log (`events`, replaced when the loop reopens it)."""

    def __init__(
        self,
        plan: PlanDoc,
        run_dir: RunDir,
        sampler: Sampler,
        supervisor: Supervisor,
        kill: Callable[[int, list[int]], None],
        events: EventLog,
    ):
        self.plan, self.run_dir, self.sampler, self.supervisor, self.kill = plan, run_dir, sampler, supervisor, kill
        self.events = events
        self.swap_base: int | None = None  # the machine's swap in use when the enforcer started
        self.swap_raised = False
        self.gpu_limit: int | None = None  # the GPU's working-set limit as a runtime reported it (Metal)
        self.watches: dict[str, HelperWatch] = {}  # split models: the RPC servers of their other nodes

    @staticmethod
    def _crossing(w: Worker, finding: Finding, crossed: bool | None) -> bool:
        """A rule's answer onto the worker's raised findings (True: crossed now, say so; False: back below, it may
        be said again; None: no change). True when the event is due."""
        if crossed:
            w.raised.add(finding)
        elif crossed is False:
            w.raised.discard(finding)
        return bool(crossed)

    def soft(self, w: Worker) -> None:
        crossed = rules.soft_crossing(w.usage, w.soft, raised=Finding.SOFT in w.raised)
        if self._crossing(w, Finding.SOFT, crossed):
            self._event(w, "soft_limit", usage_bytes=w.usage, soft_bytes=w.soft, pid=w.pid)

    def hard(self, w: Worker, now: float) -> None:
        if w.pid is None or not rules.over_hard(w.usage, w.hard):
            return
        pid, usage = w.pid, w.usage
        self.kill(pid, w.pids)
        w.kills.append(now)
        self._event(
            w,
            "hard_limit_kill",
            by="enforcer",
            pid=pid,
            usage_bytes=usage,
            hard_bytes=w.hard,
            **({"allowance_bytes": w.allowance} if w.allowance else {}),
            cpu_bytes=w.cpu_side,
            gpu_bytes=w.gpu_side,
        )
        # the kill is its exit: recorded as one (the next poll must not report an exit status for it)
        self._event(w, "exit", pid=pid, state="KILLED", **rules.ENFORCER_KILL, peak_bytes=max(w.peak, usage))
        w.ended.append(pid)
        w.lost()
        if w.phase is not Phase.GIVEN_UP:
            w.to(Phase.KILLED, "over its hard quota")
        self._give_up(w, now)

    def kernel(self, w: Worker) -> None:
        """The kernel's OOM kills in the worker's group since the last look. Read from the group its runs are placed
        in, whether or not a process of its own is sampled now: a run killed before its first sample (a fast
        leak on a busy box) is still a kill, counted towards the give-up before supervisord starts another."""
        if w.oom_group is None and self.plan.policy.kernel_enforcement == "auto":
            self.sampler.find_oom_group(w)
        if w.oom_group is None:
            return
        kills = w.oom_group.oom_kills()
        if kills < w.oom_seen:  # the group was made anew: its count started again
            w.oom_seen = 0
        if kills <= w.oom_seen:
            return
        now = time.time()
        w.kills.extend([now] * (kills - w.oom_seen))
        placed = self.sampler.placed(w) if w.pid is None else None  # a run never sampled: the last one placed
        self._event(
            w,
            "hard_limit_kill",
            by="kernel",
            pid=w.pid if placed is None else placed.pid,
            oom_kills=kills - w.oom_seen,
            hard_bytes=w.hard,
            cgroup=str(w.oom_group.path),
        )
        w.oom_seen = kills
        if w.pid is not None:
            w.pending_exit = rules.KERNEL_KILL  # its exit, when seen, was this kill (v1 may have killed a child only)
        if w.phase is Phase.UP:
            w.to(Phase.OOM_KILLED, "the kernel killed in its cgroup (its hard quota)")
        self._give_up(w, now)

    def _give_up(self, w: Worker, now: float) -> None:
        pol = self.plan.policy
        kills = rules.give_up_due(w.kills, now, pol.kill_window_s, pol.max_kills)
        if kills is None or w.given_up:
            return
        w.to(Phase.GIVEN_UP, f"{kills} hard-quota kills within {pol.kill_window_s:g} s")
        failed = self.supervisor.try_stop(w.name, wait=False)
        self._event(
            w,
            "give_up",
            reason=f"{kills} hard-limit kills within {pol.kill_window_s:g} s: left stopped",
            kills=kills,
            **({"stop": failed} if failed else {}),
        )

    def leak(self, w: Worker) -> None:
        """A steady climb over the whole leak window (its samples downsampled to span it: any window works)."""
        if Finding.LEAK in w.raised or not w.history.spans_window():
            return
        window = w.history.window
        detail = rules.leak(w.history.points(), window, self.plan.policy.leak_threshold_bytes, w.usage, w.hard)
        if detail is not None:
            w.raised.add(Finding.LEAK)
            self._event(w, "leak_suspected", **detail)

    def swap(self, w: Worker) -> None:
        """A worker with part of itself in swap answers from disk (where the platform tells per process)."""
        crossed = rules.swap_crossing(w.swapped, rules.SWAP_WORKER, raised=Finding.SWAP in w.raised)
        if self._crossing(w, Finding.SWAP, crossed):
            self._event(w, "swapping", swapped_bytes=w.swapped, usage_bytes=w.usage, pid=w.pid)

    def box_swap(self) -> None:
        """The machine's swap grown since the enforcer started: on macOS, which compresses and swaps instead of
        killing, this is how a stack too large for the machine shows (and where no per-process figure exists)."""
        swap = self.sampler.last_swap = self.sampler.swap()
        if swap is None:
            return
        if self.swap_base is None:
            self.swap_base = swap.used
        grown = swap.used - self.swap_base
        crossed = rules.swap_crossing(grown, rules.box_swap_threshold(self.sampler.usable), raised=self.swap_raised)
        if crossed:
            self.swap_raised = True
            level = self.sampler.box.level()
            self.events.add(
                "swapping", None, swap_used_bytes=swap.used, grown_bytes=grown, **({"level": level} if level else {})
            )
        elif crossed is False:
            self.swap_raised = False

    def drift(self, w: Worker, now: float) -> None:
        """Once a worker has settled, compare what it holds (and, for llama.cpp, what its own log
        says it allocated) with the plan's estimate: more than 5% over is `estimate_drift`."""
        if w.state is not ProcState.RUNNING:
            return
        if w.running_since is None:
            w.running_since = now
        estimate = w.quota.estimate
        if w.drift is not None or now - w.running_since < DRIFT_SETTLE_S or not estimate:
            return
        m = self.plan.models[w.name]
        detail = self._llama_log_drift(w, m) if m.reports_buffers else {}
        # what it holds as `ps` counts it (with a cgroup the charge misses a model file's pages cached before)
        over = (max(w.cpu_side, w.resident) + w.gpu_side) / estimate - 1
        if detail or over > rules.DRIFT:
            w.drift = max(over, detail.get("buffers_over", -1.0))
            self._event(
                w,
                "estimate_drift",
                measured_bytes=max(w.cpu_side, w.resident) + w.gpu_side,
                estimate_bytes=estimate,
                over_pct=round(over * 100, 1),
                source=m.estimate_source,
                **detail,
            )
        else:
            w.drift = over  # within 5%: checked, nothing to report

    def _llama_log_drift(self, w: Worker, m: ModelDoc) -> dict[str, Any]:
        """llama.cpp's own buffers against the plan (estimate_drift's detail); its host-side buffers and the plan's
        overhead become what its tree is expected to hold from now on (beyond: Worker.beyond_buffers)."""
        name = w.name
        text = ""
        for suffix in ("err", "out"):
            log = self.run_dir.log(name, suffix)
            with contextlib.suppress(OSError), log.open("rb") as f:
                f.seek(max(0, log.stat().st_size - LOG_TAIL))
                text += f.read().decode(errors="replace")
        self._gpu_limit(name, text)
        parts = m.estimate_parts
        reported = local(parse_buffers(text))  # a split's main part: its own devices, never its helpers'
        if reported:
            w.buffers_expected = host_bytes(reported) + parts.overhead_bytes
        return rules.buffers_drift(totals(reported), parts.weights_bytes + parts.kv_bytes + parts.compute_bytes)

    def _gpu_limit(self, name: str, log: str) -> None:
        """Metal's working-set limit as llama.cpp reports it at start: below the plan's GPU window, allocations
        fail before the budget says they should (the wired limit in force is not the one the plan was built for)."""
        limit = metal_working_set(log)
        window = self.plan.platform.gpu_window_bytes
        if limit is None or limit == self.gpu_limit:
            return
        self.gpu_limit = limit
        if window is not None and limit < window:
            self.events.add("gpu_limit", name, limit_bytes=limit, gpu_window_bytes=window)

    def helpers(self, w: Worker) -> None:
        """A split model (umemc.runtime.enforcer.helpers): stopped when its llama-server loses the connection to an
        RPC server of another node, started again once they all answer."""
        m = self.plan.models.get(w.name)
        if m is None or not m.rpc:
            return
        watch = self.watches.get(w.name)
        if watch is None or watch.endpoints != m.rpc:
            watch = self.watches[w.name] = HelperWatch(m.rpc)
        if watch.lost:
            if watch.back is None:  # asked off the loop: a helper box gone dark makes a connect wait its timeout
                watch.back = OffLoop(lambda: answering(m.rpc), HELPERS_EVERY_S, initial=False, name="helpers")
            if w.state in ANSWERING or not watch.back.poll(time.time()):
                return  # someone started it (its wrapper waits for them), or they are still away
            watch.lost, watch.back = [], None
            self._event(w, "helpers_back", endpoints=m.rpc)
            self.supervisor.ensure_started(w.name)
            return
        if not w.pid:
            return
        gone = watch.gone(w.pid)
        if gone:
            watch.lost = gone
            self._event(w, "helper_lost", endpoints=gone)
            w.pending_exit = {"exitstatus": None, "cause": "stopped"}  # its exit is this stop, never a crash
            why = self.supervisor.try_stop(w.name, wait=False)
            if why is not None and why != "not running":
                print(f"umemc-enforcer: {w.name} lost {', '.join(gone)} and was not stopped: {why}", file=sys.stderr,
                      flush=True)  # fmt: skip

    def _event(self, w: Worker, kind: str, **detail: Any) -> None:
        w.last_event = kind
        self.events.add(kind, w.name, **detail)
