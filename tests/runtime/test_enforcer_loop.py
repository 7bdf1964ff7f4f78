"""The enforcer's loop against fakes, in milliseconds: its probes (what each process holds, the machine's
memory), supervisord (its process table, its stops) and the kill are given; a tick is driven by hand. The real
processes, cgroups and supervisord are tests/runtime/test_enforcement.py's; these hold the loop's decisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.runtime.enforcer.loop import Enforcer
from umemc.runtime.enforcer.worker_state import Phase
from umemc.runtime.event_log import EventLog
from umemc.runtime.probes.host import Probes, PsutilBox
from umemc.runtime.probes.swap import Swap
from umemc.stack.resolve import load_stack

MiB = 1024 * 1024
STACK = """version = 1
name = "loop"
[platform]
kind = "cpu"
memory = "16GiB"
os_reserve = "1GiB"
[policy]
kernel_enforcement = "off"
max_kills = 2
kill_window = "10m"
{policy}[models.w]
runtime = "command"
command = ["serve"]
memory = "100MiB"
"""  # hard quota: 100 MiB x 1.1 = 110 MiB; soft: 100 MiB


class FakeProcesses:
    """What each process holds (bytes), set by the test; one process per worker, no children."""

    name = "fake"
    memory_figure = "rss"

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def alive(self, pid: int) -> bool:
        return pid in self.held

    def start_time(self, pid: int) -> int:
        return pid

    def run_environ(self, pid: int) -> dict[str, str]:
        return {}

    def cmdline(self, pid: int) -> list[str]:
        return []

    def pids(self) -> list[int]:
        return list(self.held)

    def children(self, pid: int) -> frozenset[int]:
        return frozenset()

    def descendants(self, root: int) -> list[int]:
        return [root] if root in self.held else []

    def memory(self, pid: int) -> int:
        return self.held.get(pid, 0)

    def swapped(self, pid: int) -> int | None:
        return 0

    def cpu_ticks(self, pid: int) -> int:
        return 0

    def forget(self, pid: int) -> None:
        pass

    def prune(self, alive: set[int]) -> None:
        pass

    def close(self) -> None:
        pass


class FakeBox(PsutilBox):
    """12 GiB available, no swap; no pressure level, no GPU window (as psutil's box says of any machine)."""

    def available(self) -> int | None:
        return 12 << 30

    def swap(self) -> Swap | None:
        return None


class FakeSupervisor:
    """supervisord's process table as the test sets it; stops recorded."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Any]] = {}
        self.stops: list[tuple[str, bool]] = []

    def run(self, name: str, pid: int) -> None:
        self.table[name] = {"name": name, "statename": "RUNNING", "pid": pid, "exitstatus": 0, "spawnerr": ""}

    def call(self, method: str, *args: Any) -> Any:
        assert method == "supervisor.getPID"
        return 1

    def processes(self) -> dict[str, dict[str, Any]]:
        return {n: dict(info) for n, info in self.table.items()}

    def try_stop(self, name: str, *, wait: bool = True) -> str | None:
        self.stops.append((name, wait))
        self.table[name] |= {"statename": "STOPPED", "pid": 0}
        return None


class Loop:
    """An enforcer of the stack above over the fakes; `kills` are the trees it killed."""

    def __init__(self, tmp_path: Path, policy: str = "", kernel: str = "off") -> None:
        stack = STACK.format(policy=policy).replace('kernel_enforcement = "off"', f'kernel_enforcement = "{kernel}"')
        (tmp_path / "stack.toml").write_text(stack)
        bundle = tmp_path / "run" / "bundle"
        build(make_plan(load_stack(tmp_path / "stack.toml")), bundle, files_later=True)
        (tmp_path / "run" / "state").mkdir(parents=True)
        self.procs, self.sv = FakeProcesses(), FakeSupervisor()
        self.kills: list[tuple[int, list[int]]] = []
        host = Probes(self.procs, FakeBox(), "linux", cgroups=False)  # type: ignore[arg-type]
        self.enforcer = Enforcer(bundle, host, self.sv, lambda pid, pids: self.kills.append((pid, list(pids))))  # type: ignore[arg-type]
        self.log = EventLog(tmp_path / "run" / "state" / "events.db")

    def start(self, pid: int, held: int) -> None:
        """supervisord (re)started the worker as `pid`, holding `held` bytes; the enforcer sees it at its next
        tick (supervisord's children changed)."""
        self.sv.run("w", pid)
        self.procs.held[pid] = held
        self.enforcer._gone = True

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        """w's events but its changes of phase (states())."""
        return [(e.kind, e.detail) for e in self.log.since(0) if e.model == "w" and e.kind != "state"]

    def states(self) -> list[tuple[str, str, str | None]]:
        return [
            (e.detail["from"], e.detail["to"], e.detail["why"])
            for e in self.log.since(0)
            if e.kind == "state" and e.model == "w"
        ]


def test_a_worker_over_its_hard_quota_is_killed_at_the_tick_that_sees_it(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.start(4001, 50 * MiB)
    loop.enforcer.tick()
    w = loop.enforcer.workers["w"]
    assert (w.pid, w.usage, w.phase, loop.kills) == (4001, 50 * MiB, Phase.UP, [])
    loop.procs.held[4001] = 110 * MiB + 1  # one byte over 110 MiB
    loop.enforcer.tick()
    assert loop.kills == [(4001, [4001])]
    assert w.phase is Phase.KILLED and w.pid is None
    assert [k for k, _ in loop.events()] == ["start", "soft_limit", "hard_limit_kill", "exit"]
    assert loop.states() == [
        ("down", "up", "its process (pid 4001) is sampled"),
        ("up", "killed", "over its hard quota"),
    ]
    kill = dict(loop.events())["hard_limit_kill"]
    assert (kill["by"], kill["pid"], kill["usage_bytes"], kill["hard_bytes"]) == (
        "enforcer",
        4001,
        110 * MiB + 1,
        110 * MiB,
    )
    assert dict(loop.events())["exit"] == {
        "pid": 4001,
        "state": "KILLED",
        "exitstatus": None,
        "signal": "SIGKILL",
        "cause": "hard quota (enforcer)",
        "peak_bytes": 110 * MiB + 1,
    }


def test_at_the_hard_quota_is_not_over_it(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.start(4001, 110 * MiB)
    loop.enforcer.tick()
    loop.enforcer.tick()
    assert loop.kills == [] and loop.enforcer.workers["w"].phase is Phase.UP


def test_max_kills_in_the_window_leave_it_stopped(tmp_path: Path) -> None:
    """max_kills = 2: the second kill within kill_window gives up, asks supervisord to stop it (without waiting:
    the loop must not block on a stop) and says so once."""
    loop = Loop(tmp_path)
    loop.start(4001, 200 * MiB)
    loop.enforcer.tick()
    loop.start(4002, 200 * MiB)  # supervisord restarted it, still leaking
    loop.enforcer.tick()
    assert loop.kills == [(4001, [4001]), (4002, [4002])]
    assert loop.sv.stops == [("w", False)]
    assert loop.enforcer.workers["w"].phase is Phase.GIVEN_UP
    kinds = [k for k, _ in loop.events()]
    assert kinds.count("give_up") == 1 and kinds[-1] == "give_up"
    assert dict(loop.events())["give_up"]["kills"] == 2


class V1Group:
    """The worker's cgroup v1 group as the kernel shows it (Documentation/admin-guide/cgroup-v1/memory.rst:
    `memory.oom_control` holds `oom_kill_disable`, `under_oom` and, since Linux 4.13, `oom_kill N`;
    `memory.usage_in_bytes` the charge), and the wrapper's record of where it placed a run (`version path pid`)."""

    def __init__(self, tmp_path: Path, record: Path) -> None:
        self.path, self.record, self.killed = tmp_path / "cg" / "umemc-loop-r1" / "w", record, 0
        self.path.mkdir(parents=True)
        self.charge(0)
        self.count()

    def placed(self, pid: int, charge: int) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.record.write_text(f"1 {self.path} {pid}\n")
        self.charge(charge)

    def charge(self, charge: int) -> None:
        (self.path / "memory.usage_in_bytes").write_text(f"{charge}\n")

    def oom_kill(self) -> None:
        """The kernel killed the run in the group: its count goes up, its charge is freed."""
        self.killed += 1
        self.count()
        self.charge(0)

    def count(self) -> None:
        (self.path / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {self.killed}\n")


def test_a_run_the_kernel_killed_before_its_first_sample_is_a_kill(tmp_path: Path) -> None:
    """On a busy box supervisord can restart a leaker and the kernel kill it again (its group's limit) before the
    enforcer ever samples that run: it is still one kill towards max_kills (2 here), so the give-up stops the worker
    in its back-off, before a third run. (The enforcer once read the group only through a sampled process and took
    the group's count as seen when it attached to the next run: the kill was lost, a third run started.)"""
    loop = Loop(tmp_path, kernel="auto")
    group = V1Group(tmp_path, loop.enforcer.run_dir.cgroups / "w")
    loop.start(4001, 50 * MiB)
    group.placed(4001, 40 * MiB)
    loop.enforcer.tick()
    w = loop.enforcer.workers["w"]
    assert (w.pid, w.usage) == (4001, 40 * MiB)  # sampled by its group's charge
    # the kernel kills the first run; supervisord backs off
    group.oom_kill()
    del loop.procs.held[4001]
    loop.sv.table["w"] |= {"statename": "BACKOFF", "pid": 0}
    loop.enforcer._gone = True
    loop.enforcer.tick()
    # the second run: placed, killed, supervisord backing off again, all between two ticks
    group.placed(4002, 0)
    group.oom_kill()
    loop.enforcer._gone = True
    loop.enforcer.tick()
    kills = [d for k, d in loop.events() if k == "hard_limit_kill"]
    assert kills == [
        {"by": "kernel", "pid": 4001, "oom_kills": 1, "hard_bytes": 110 * MiB, "cgroup": str(group.path)},
        {"by": "kernel", "pid": 4002, "oom_kills": 1, "hard_bytes": 110 * MiB, "cgroup": str(group.path)},
    ]
    assert [d for k, d in loop.events() if k == "exit"] == [
        {"pid": 4001, "state": "BACKOFF", "exitstatus": None, "signal": "SIGKILL",
         "cause": "hard quota (kernel, cgroup OOM)", "peak_bytes": 40 * MiB},
    ]  # fmt: skip
    assert loop.sv.stops == [("w", False)] and w.phase is Phase.GIVEN_UP
    give_up = [d for k, d in loop.events() if k == "give_up"]
    assert give_up == [{"reason": "2 hard-limit kills within 600 s: left stopped", "kills": 2}]


def test_an_enforcer_taking_over_says_only_the_kernels_later_kills(tmp_path: Path) -> None:
    """A restarted enforcer (or the standby taking over) finds kills already counted in a worker's group: the one
    before it said them. Only a kill after it took over is news."""
    loop = Loop(tmp_path, kernel="auto")
    group = V1Group(tmp_path, loop.enforcer.run_dir.cgroups / "w")
    group.placed(4001, 50 * MiB)
    group.oom_kill()  # before this enforcer
    loop.start(4002, 50 * MiB)
    group.placed(4002, 50 * MiB)
    loop.enforcer.count_ooms_from_now()
    loop.enforcer.tick()
    assert [k for k, _ in loop.events()] == ["start"]
    group.oom_kill()
    loop.enforcer._gone = True
    loop.enforcer.tick()
    kills = [d for k, d in loop.events() if k == "hard_limit_kill"]
    assert [(d["pid"], d["oom_kills"]) for d in kills] == [(4002, 1)]


def test_a_stop_someone_asked_for_is_no_restart(tmp_path: Path) -> None:
    """The gateway evicted the worker and started it again on demand between two polls: the exit the enforcer
    then sees is that stop, and the restart count stays 0."""
    loop = Loop(tmp_path)
    loop.start(4001, 50 * MiB)
    loop.enforcer.tick()
    loop.log.add("evict", "w", by="gateway", for_model="other")
    loop.start(4002, 50 * MiB)
    loop.enforcer.tick()
    exits = [d for k, d in loop.events() if k == "exit"]
    assert exits == [{"pid": 4001, "state": "RUNNING", "exitstatus": None, "cause": "stopped", "peak_bytes": 50 * MiB}]
    assert loop.enforcer.workers["w"].restarts == 0
    loop.start(4003, 50 * MiB)  # and one nobody asked for is a restart
    loop.enforcer.tick()
    assert loop.enforcer.workers["w"].restarts == 1


def test_a_slow_read_never_holds_the_loop() -> None:
    """nvidia-smi (heat, per-process GPU memory) can take seconds: the loop asks it in a thread of its own and
    goes on with the last answer; one read at a time, at most every every_s."""
    import threading

    from umemc.runtime.enforcer.sampler import OffLoop

    go, reads = threading.Event(), []

    def read() -> int:
        reads.append(1)
        go.wait()
        return len(reads)

    slow = OffLoop(read, every_s=2.0, initial=0, name="slow")
    assert slow.poll(now=100.0) == 0  # asked, not waited for
    assert slow.poll(now=103.0) == 0  # due again, but the first is still under way: not asked twice
    go.set()
    assert slow.wait() == 1 and len(reads) == 1
    go.clear()
    assert slow.poll(now=104.0) == 1  # answered; 4 s since the first ask: asked again, the last answer meanwhile
    go.set()
    assert slow.wait() == 2
    assert slow.poll(now=105.0) == 2 and len(reads) == 2  # 1 s since: not due


def test_the_workers_allocator_cache_is_in_its_status(tmp_path: Path) -> None:
    """A torch worker's own report (umemc.worker) says what its caching allocator holds beyond its tensors: the
    enforcer's status carries it for that process only (a report of an earlier process of the model is stale)."""
    import json
    import time

    from umemc.contract import AllocatorFigures, WorkerReport, dump

    loop = Loop(tmp_path)
    loop.start(4001, 50 * MiB)
    report = loop.enforcer.run_dir.worker_report("w")
    report.parent.mkdir(parents=True, exist_ok=True)

    def says(pid: int) -> None:
        held = AllocatorFigures(device="cuda", reserved_bytes=3 << 30, allocated_bytes=2 << 30, inactive_split_bytes=0)
        doc = WorkerReport(model="w", pid=pid, reserved_bytes=0, hard_bytes=110 * MiB, reservations=[], allocator=held)
        report.write_text(dump(doc))

    def unused() -> object:
        loop.enforcer.tick()
        loop.enforcer.slow_tick(time.time())
        return json.loads(loop.enforcer.run_dir.status.read_text())["models"]["w"]["allocator_unused_bytes"]

    says(4001)
    assert unused() == 1 << 30
    says(3999)  # another process's
    assert unused() is None


def test_a_llama_cpp_worker_holding_more_than_its_buffers_is_seen(tmp_path: Path) -> None:
    """Once it has settled, a llama.cpp worker's host-side buffers as its own log states them (here a real
    llama-server's load, tests/recorded/llama-server-vulkan/: CPU_Mapped 28.69 MiB of weights, Vulkan_Host
    0.38 MiB of output and 4.26 MiB of compute; Vulkan0 is the device's) and the plan's overhead are what its
    processes should hold: anything beyond is drift, in its status and, where it lasts, a defragment restart's."""
    import json
    import time

    from umemc.runtime.enforcer.checks import DRIFT_SETTLE_S

    recorded = Path(__file__).resolve().parents[1] / "recorded" / "llama-server-vulkan" / "load-smollm2.excerpt.log"
    loop = Loop(tmp_path)
    plan = loop.enforcer.plan
    plan.models["w"] = msgspec.structs.replace(plan.models["w"], reports_buffers=True)
    overhead = plan.models["w"].estimate_parts.overhead_bytes
    log = loop.enforcer.run_dir.log("w", "err")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(recorded.read_text())
    host = round(28.69 * MiB) + round(0.38 * MiB) + round(4.26 * MiB)
    loop.start(4001, host + overhead + 3 * MiB)
    loop.enforcer.tick()
    w = loop.enforcer.workers["w"]
    now = time.time()
    loop.enforcer.slow_tick(now)
    assert w.beyond_buffers is None  # not settled: its buffers are not read yet
    loop.enforcer.slow_tick(now + DRIFT_SETTLE_S + 1)
    assert (w.buffers_expected, w.beyond_buffers) == (host + overhead, 3 * MiB)
    loop.procs.held[4001] = host + overhead - MiB  # below: nothing beyond
    loop.enforcer.slow_tick(now + DRIFT_SETTLE_S + 2)
    assert w.beyond_buffers == 0
    loop.procs.held[4001] = host + overhead + 7 * MiB
    loop.enforcer.slow_tick(now + DRIFT_SETTLE_S + 3)
    doc = json.loads(loop.enforcer.run_dir.status.read_text())
    assert doc["models"]["w"]["beyond_buffers_bytes"] == 7 * MiB


def test_a_worker_given_up_and_started_again_is_enforced_again(tmp_path: Path) -> None:
    """After the give-up someone starts it again (`umemc up`, supervisorctl): its new process is sampled and held to
    its quota like any other."""
    loop = Loop(tmp_path)
    for pid in (4001, 4002):  # two kills within the window: given up
        loop.start(pid, 200 * MiB)
        loop.enforcer.tick()
    w = loop.enforcer.workers["w"]
    assert w.phase is Phase.GIVEN_UP
    loop.start(4003, 50 * MiB)
    loop.enforcer.tick()
    assert (w.phase, w.pid, w.usage) == (Phase.UP, 4003, 50 * MiB)
    assert loop.states()[-2:] == [
        ("killed", "given_up", "2 hard-quota kills within 600 s"),
        ("given_up", "up", "its process (pid 4003) is sampled"),
    ]


def test_a_kernel_kill_the_worker_survived_then_the_enforcers(tmp_path: Path) -> None:
    """cgroup v1 may kill a child of the worker only: the kernel's kill is counted, the worker's own process lives
    on, and once it holds more than its hard quota the enforcer kills it too (two kills within the window: left
    stopped)."""
    loop = Loop(tmp_path, kernel="auto")
    group = V1Group(tmp_path, loop.enforcer.run_dir.cgroups / "w")
    loop.start(4001, 50 * MiB)
    group.placed(4001, 50 * MiB)
    loop.enforcer.tick()
    group.killed += 1  # a child killed; the worker's process, and its charge, stay
    group.count()
    group.charge(200 * MiB)
    loop.enforcer._gone = True
    loop.enforcer.tick()
    assert loop.kills == [(4001, [4001])]
    assert [(f, t) for f, t, _ in loop.states()] == [
        ("down", "up"),
        ("up", "oom_killed"),
        ("oom_killed", "killed"),
        ("killed", "given_up"),
    ]


def test_two_kernel_kills_between_samples_give_up_at_once(tmp_path: Path) -> None:
    """Both kills of max_kills counted at one look (the kernel killed twice in the worker's group between two of
    the enforcer's samples): it is left stopped at once."""
    loop = Loop(tmp_path, kernel="auto")
    group = V1Group(tmp_path, loop.enforcer.run_dir.cgroups / "w")
    loop.start(4001, 50 * MiB)
    group.placed(4001, 50 * MiB)
    loop.enforcer.tick()
    group.killed += 2
    group.count()
    loop.enforcer._gone = True
    loop.enforcer.tick()
    assert loop.sv.stops == [("w", False)]
    kills = [(d["by"], d["oom_kills"]) for k, d in loop.events() if k == "hard_limit_kill"]
    assert kills == [("kernel", 2)]
    assert [(f, t) for f, t, _ in loop.states()] == [("down", "up"), ("up", "oom_killed"), ("oom_killed", "given_up")]
