"""One worker as the enforcer sees it: its quota (fixed by the plan), what was last measured, and one
explicit state machine for what the enforcer did with its process. supervisord's own process state
(STARTING, RUNNING, …) is a separate fact, read on every poll.

    DOWN ──start──▶ UP ──over hard quota──▶ KILLED ──restarted──▶ UP
                     │ └─kernel OOM in its group─▶ OOM_KILLED ──exit──▶ DOWN
                     └─exit──▶ DOWN                    (either kill, max_kills times in kill_window) ──▶ GIVEN_UP
    (a run the kernel killed before it was ever sampled counts too: DOWN ──max_kills──▶ GIVEN_UP)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..supervisor import ProcState
from .series import Series

if TYPE_CHECKING:
    from ..cgroups import Cgroup


class Phase(Enum):
    DOWN = "down"  # no process of its own (not started, stopped, exited)
    UP = "up"  # a process is sampled
    KILLED = "killed"  # the enforcer killed it and recorded the exit; supervisord has not restarted it yet
    OOM_KILLED = "oom_killed"  # the kernel killed in its cgroup; its exit, when seen, is that kill
    GIVEN_UP = "given_up"  # killed max_kills times within kill_window: left stopped until started again


# A killed worker's process is no longer sampled (no pid): its next move is a new process (UP) or the give-up, never
# an exit seen (DOWN). A worker the kernel killed in is still sampled: its exit is seen (DOWN) before a new process
# is (UP). tests/runtime/test_lifecycle_edges.py holds every edge to a move the loop's tests make.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.DOWN: frozenset({Phase.UP, Phase.GIVEN_UP}),
    Phase.UP: frozenset({Phase.DOWN, Phase.KILLED, Phase.OOM_KILLED}),
    Phase.KILLED: frozenset({Phase.UP, Phase.GIVEN_UP}),
    Phase.OOM_KILLED: frozenset({Phase.DOWN, Phase.KILLED, Phase.GIVEN_UP}),
    Phase.GIVEN_UP: frozenset({Phase.UP}),  # someone started it again (`umemc up`, supervisorctl)
}


class Finding(Enum):
    """What is reported once per crossing (or per process): raised, then re-armed."""

    SOFT = "soft_limit"  # re-armed below SOFT_REARM of the soft quota
    LEAK = "leak_suspected"  # re-armed by the next start
    SWAP = "swapping"  # re-armed once under a quarter of rules.SWAP_WORKER


class IllegalTransition(RuntimeError):
    """A bug: the enforcer tried a transition the table does not allow."""


@dataclass(frozen=True)
class Quota:
    name: str
    hard: int
    soft: int
    priority: int
    estimate: int


@dataclass
class Worker:
    quota: Quota
    phase: Phase = Phase.DOWN
    # hears every change of phase as it is made, (from, to, why): the enforcer writes it to the event log as a
    # `state` event, so no path moves a worker silently
    announce: Callable[[str, str, str | None], None] | None = field(default=None, repr=False, compare=False)
    state: ProcState = ProcState.UNKNOWN  # supervisord's
    raised: set[Finding] = field(default_factory=set)
    last_event: str | None = None
    # the process (pid is set while it is sampled)
    pid: int | None = None
    pids: list[int] = field(default_factory=list)
    escaped: list[tuple[int, int]] = field(default_factory=list)  # (pid, start) of processes that left its tree
    ended: deque[int] = field(default_factory=lambda: deque(maxlen=8))  # pids killed and recorded as exited
    cgroup: Cgroup | None = None  # the group its current process was placed in (it is sampled by its charge)
    # the group its runs are placed in, kept across its restarts: the kernel's count of OOM kills there is
    # cumulative, and a run killed before the enforcer saw its process is still one kill (oom_seen: those said)
    oom_group: Cgroup | None = None
    oom_seen: int = 0
    started: float = 0.0
    restarts: int = -1
    running_since: float | None = None
    pending_exit: dict[str, Any] | None = None  # the cause its exit will be recorded with (a kernel kill)
    # what was measured
    cpu_side: int = 0  # what its quota is held to: its cgroup's charge where it has one, else its tree's resident
    resident: int = 0  # its tree's resident memory as `ps` shows it (1 Hz); with a cgroup, the charge can be less
    gpu_side: int = 0
    gpu_visible: bool | None = None  # NVIDIA: the driver gave a figure for one of its processes (None: not NVIDIA)
    peak: int = 0
    swapped: int | None = None  # what of its tree is in swap, where the platform tells per process (Linux)
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=120))  # 1 Hz: the recent rate
    history: Series = field(default_factory=lambda: Series(300.0))  # the leak window, downsampled (set by the loop)
    kills: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    reserved: int = 0  # what the worker's own ledger (umemc.worker) reports
    allocator_unused: int | None = None  # its caching allocator's reserved - allocated, where it reports them
    # llama.cpp: its host-side buffers as its own log states them (read once it settled) plus the plan's process
    # overhead; what its tree holds beyond that is drift (fragmentation of the C heap, a leak)
    buffers_expected: int | None = None
    allowance: int = 0  # live gateway leases that raise this worker's quotas (a ComfyUI workflow's models)
    last_active: float = 0.0
    last_cpu: int = -1
    drift: float | None = None  # measured / estimate - 1, once checked

    @property
    def name(self) -> str:
        return self.quota.name

    @property
    def beyond_buffers(self) -> int | None:
        """What its process tree holds beyond its buffers and overhead (llama.cpp, once known)."""
        return None if self.buffers_expected is None or not self.pid else max(0, self.resident - self.buffers_expected)

    @property
    def usage(self) -> int:
        return self.cpu_side + self.gpu_side

    @property
    def hard(self) -> int:
        """The hard quota in force: the plan's, raised by its leases."""
        return self.quota.hard + self.allowance

    @property
    def soft(self) -> int:
        return self.quota.soft + self.allowance

    @property
    def given_up(self) -> bool:
        return self.phase is Phase.GIVEN_UP

    def to(self, phase: Phase, why: str | None = None) -> None:
        if phase is not self.phase and phase not in TRANSITIONS[self.phase]:
            raise IllegalTransition(f"{self.name}: {self.phase.value} -> {phase.value}")
        was, self.phase = self.phase, phase
        if phase is not was and self.announce is not None:
            self.announce(was.value, phase.value, why)

    def lost(self) -> None:
        """Its process is no longer sampled (an exit seen, or killed by the enforcer)."""
        self.pid, self.pids, self.cpu_side, self.gpu_side, self.swapped = None, [], 0, 0, None
        self.resident = 0

    def forget(self) -> None:
        """Its process changed: everything measured and reported of the last one is forgotten."""
        self.lost()
        self.peak = 0
        self.samples.clear()
        self.history.clear()
        self.raised.clear()
        self.drift, self.running_since, self.pending_exit = None, None, None
        self.buffers_expected = None

    def began(self, pid: int, now: float) -> None:
        """A new process of its own is sampled from now on."""
        self.pid, self.started, self.cgroup = pid, now, None
        self.to(Phase.UP, f"its process (pid {pid}) is sampled")
