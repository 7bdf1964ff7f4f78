"""The gateway's scheduler against a fake supervisord, in milliseconds (the end-to-end tests with real processes
are tests/runtime/test_gateway.py): admission, queues, drains, leases and pressure, each decision checked by what
the scheduler asked of supervisord and what it recorded. The fake is a process table in memory that answers
supervisord's XML-RPC calls the scheduler makes (getAllProcessInfo, start, stop, getPID): a started program is
RUNNING and healthy at once, unless the test holds it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.conftest import start_of
from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import GatewayState, PlanDoc, read
from umemc.runtime.event_log import EventLog
from umemc.runtime.gateway.core import Admit
from umemc.runtime.gateway.lifecycle import Phase
from umemc.runtime.gateway.model import Model, Refused
from umemc.runtime.gateway.scheduler import Scheduler
from umemc.runtime.rundir import RunDir
from umemc.stack.resolve import load_stack

GiB = 1 << 30


# a fake worker's pid: none a process can have (Linux's pids stay below PID_MAX_LIMIT, 2**22), so the gateway's
# check of who listens on a port cannot find a live stranger under it (a fake pid 1002 once was a real process)
NO_SUCH_PID = 1 << 22


class FakeSupervisor:
    def __init__(self, running: tuple[str, ...] = ()) -> None:
        self.states = dict.fromkeys(running, "RUNNING")
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.hold: set[str] = set()  # programs that stay STARTING (not healthy) until released
        self.asked = threading.Event()  # a start was asked (from the scheduler's worker thread)

    def processes(self) -> dict[str, dict[str, Any]]:
        return {
            n: {"name": n, "statename": s, "pid": NO_SUCH_PID + i, "spawnerr": ""}
            for i, (n, s) in enumerate(self.states.items())
        }

    def ensure_started(self, name: str) -> None:
        self.started.append(name)
        self.states[name] = "STARTING" if name in self.hold else "RUNNING"
        self.asked.set()

    def try_stop(self, name: str, *, wait: bool) -> str | None:
        self.stopped.append(name)
        if self.states.get(name) not in ("RUNNING", "STARTING"):
            return "not running"
        self.states[name] = "STOPPED"
        return None

    def call(self, method: str, *args: Any) -> Any:
        assert method == "supervisor.getPID"
        return 4242


CPU_4G = 'kind = "cpu"\nmemory = "4GiB"\nos_reserve = "1GiB"'
STACK = """version = 1
name = "fast"
[platform]
{platform}
[gateway]
port = 10999
queue = {queue}
queue_timeout = "{queue_timeout}"
drain_timeout = "{drain_timeout}"
"""  # budget: 3 GiB usable x 0.85 = 2.55 GiB, two models of 1 GiB (1.1 GiB hard) fit, three do not


def model(name: str, priority: int, mode: str = "hot", memory: str = "1GiB", concurrency: int = 1) -> str:
    return (
        f'[models.{name}]\nruntime = "command"\ncommand = ["serve", "{{port}}"]\nmemory = "{memory}"\n'
        f'priority = {priority}\nmode = "{mode}"\nmax_concurrency = {concurrency}\n'
    )


def scheduler(tmp_path: Path, models: str, sv: FakeSupervisor, platform: str = CPU_4G, **gw: Any) -> Scheduler:
    settings = {"queue": 8, "queue_timeout": "5s", "drain_timeout": "5s", "platform": platform} | gw
    (tmp_path / "stack.toml").write_text(STACK.format(**settings) + models)
    bundle = tmp_path / "run" / "bundle"
    build(make_plan(load_stack(tmp_path / "stack.toml")), bundle)
    run = RunDir.of_bundle(bundle)
    run.state.mkdir(parents=True, exist_ok=True)
    sched = Scheduler(read(PlanDoc, bundle / "plan.json"), run, sv, EventLog(run.events))  # type: ignore[arg-type]

    async def healthy(m: Model) -> bool:
        return sv.states.get(m.name) == "RUNNING"

    sched.sync.probe = healthy
    return sched


def running(sched: Scheduler, body: Callable[[Scheduler], Awaitable[None]]) -> None:
    """Run `body` on a started scheduler (its pump, no background polls), then close it."""

    async def go() -> None:
        await sched.start(background=False)
        try:
            await asyncio.wait_for(body(sched), 10)
        finally:
            await sched.close()

    asyncio.run(go())


def kinds(sched: Scheduler) -> list[tuple[str, str | None]]:
    """The decisions the log records (without the changes of phase they made: states())."""
    return [(e.kind, e.model) for e in decisions(sched)]


def decisions(sched: Scheduler) -> list[Any]:
    return [e for e in sched.events.since(0) if e.kind != "state"]


def states(sched: Scheduler, name: str) -> list[tuple[str, str, str | None]]:
    """The model's changes of phase, as the log has them: (from, to, why)."""
    return [
        (e.detail["from"], e.detail["to"], e.detail["why"])
        for e in sched.events.since(0)
        if e.kind == "state" and e.model == name
    ]


async def settled(sched: Scheduler) -> None:
    """Until no start is in flight (each is awaited, not slept for)."""
    while starts := [m.starting for m in sched.models.values() if m.starting is not None]:
        await asyncio.gather(*starts, return_exceptions=True)


def test_a_ready_model_serves_its_slots_first_come_first_served(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 50, concurrency=1), sv)
    order: list[int] = []

    async def body(s: Scheduler) -> None:
        a = s.models["a"]
        assert a.ready  # start() found it running and healthy

        async def request(i: int, hold: asyncio.Event) -> None:
            async with s.slots.slot(a):
                order.append(i)
                await hold.wait()

        holds = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.create_task(request(i, holds[i])) for i in range(3)]
        while not order:
            await asyncio.sleep(0)
        assert (order, s.slots["a"].in_flight, s.slots["a"].queued) == ([0], 1, 2)
        for i in range(3):
            holds[i].set()
            while len(order) < min(i + 2, 3):
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2] and s.slots["a"].in_flight == 0

    running(sched, body)


def test_a_full_queue_refuses_at_once_with_when_to_try_again(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 50, concurrency=1), sv, queue=1)

    async def body(s: Scheduler) -> None:
        a, hold = s.models["a"], asyncio.Event()

        async def request() -> None:
            async with s.slots.slot(a):
                await hold.wait()

        first, second = asyncio.create_task(request()), asyncio.create_task(request())
        while s.slots["a"].queued < 1:
            await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            await s.slots.acquire(a)
        assert (refused.value.code, refused.value.message) == (
            "queue_full",
            "model a: 1 requests in flight and 1 queued (max_concurrency 1, queue 1)",
        )
        assert refused.value.retry_after == 2  # its latency (1 s before any was measured) x 2 in line / 1 slot
        hold.set()
        await asyncio.gather(first, second)

    running(sched, body)


def test_interleaved_requests_for_a_cold_model_start_it_once(tmp_path: Path) -> None:
    sv = FakeSupervisor()
    sv.hold.add("c")
    sched = scheduler(tmp_path, model("c", 50, mode="cold", concurrency=4), sv)

    async def body(s: Scheduler) -> None:
        c = s.models["c"]

        async def request() -> float:
            async with s.slots.slot(c) as waited:
                return waited

        tasks = [asyncio.create_task(request()) for _ in range(3)]
        assert await asyncio.to_thread(sv.asked.wait, 5)
        assert c.life.phase is Phase.STARTING and sv.started == ["c"] and s.slots["c"].queued == 3
        sv.states["c"] = "RUNNING"  # it answers its health URL now
        assert len(await asyncio.gather(*tasks)) == 3
        assert sv.started == ["c"] and c.cold_starts == 1
        assert kinds(s) == [("cold_start", "c")]

    running(sched, body)


def test_a_starting_worker_is_asked_often_and_supervisord_seldom(tmp_path: Path) -> None:
    """While a cold worker starts, its health URL is asked every 2 ms in its first half second (then every 10 ms to
    its first second, then every HEALTH_POLL_S), supervisord's process table every HEALTH_POLL_S: asking supervisord
    (XML-RPC) every 10 ms kept a core busy while the worker was starting."""
    from umemc.runtime.gateway.process import HEALTH_POLL_S, poll_interval

    assert [poll_interval(t) for t in (0.0, 0.49, 0.5, 0.99, 1.0, 60.0)] == [0.002, 0.002, 0.01, 0.01, 0.1, 0.1]

    class Counting(FakeSupervisor):
        tables = 0

        def processes(self) -> dict[str, dict[str, Any]]:
            self.tables += 1
            return super().processes()

    sv = Counting()
    sv.hold.add("c")  # STARTING throughout: the worker's own answer decides
    sched = scheduler(tmp_path, model("c", 50, mode="cold"), sv)
    probes: list[float] = []

    async def healthy(m: Model) -> bool:
        probes.append(time.monotonic())
        return len(probes) == 12

    sched.sync.probe = healthy

    async def body(s: Scheduler) -> None:
        sv.tables = 0
        async with s.slots.slot(s.models["c"]):
            pass
        took = probes[-1] - probes[0]
        assert len(probes) == 12 and took >= 11 * 0.002
        assert sv.tables <= 1 + took / HEALTH_POLL_S + 1 < len(probes)  # once at once, then every HEALTH_POLL_S

    running(sched, body)


def test_supervisords_table_is_asked_where_it_may_have_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where supervisord's children can be read, a round asks its XML-RPC table only where it may have changed: its
    children changed, a program is STARTING, BACKOFF or STOPPING, the gateway started or stopped one, or
    TABLE_EVERY_S passed; else the last answer serves (an idle stack's table is the same round after round). A
    crash seen through the children moves the model DOWN in that round."""
    from umemc.runtime.gateway import sync

    class Counting(FakeSupervisor):
        tables = 0

        def processes(self) -> dict[str, dict[str, Any]]:
            self.tables += 1
            return super().processes()

    sv = Counting(running=("a",))
    sched = scheduler(tmp_path, model("a", 50) + model("c", 40, mode="cold"), sv)
    kids = {frozenset({1000})}
    sched.sync.children = lambda pid: next(iter(kids)) if pid == 4242 else frozenset({-1})
    monkeypatch.setattr(sync, "TABLE_EVERY_S", 3600.0)

    def now(k: frozenset[int]) -> None:
        kids.clear()
        kids.add(k)

    async def body(s: Scheduler) -> None:
        asked = sv.tables  # the start's own look
        assert s.sync.supervisord_pid == 4242 and s.models["a"].ready
        for _ in range(3):
            await s.sync.refresh()
        assert sv.tables == asked  # nothing changed: not asked
        sv.states["a"] = "EXITED"  # it crashed; supervisord reaped it
        now(frozenset())
        await s.sync.refresh()
        assert (sv.tables, s.models["a"].life.phase) == (asked + 1, Phase.DOWN)
        sv.states["a"] = "STARTING"  # supervisord restarts it
        now(frozenset({1001}))
        await s.sync.refresh()
        await s.sync.refresh()  # STARTING: asked again, though its children did not change
        assert sv.tables == asked + 3
        sv.states["a"] = "RUNNING"  # startsecs passed: no process started or ended
        await s.sync.refresh()
        await s.sync.refresh()
        assert (sv.tables, s.models["a"].life.phase) == (asked + 4, Phase.READY)
        async with s.slots.slot(s.models["c"]):  # the gateway starts a program: its own asks, and the next round's
            pass
        started = sv.tables
        now(frozenset({1001, 1002}))
        await s.sync.refresh()
        await s.sync.refresh()
        assert sv.tables == started + 1
        monkeypatch.setattr(sync, "TABLE_EVERY_S", 0.0)
        await s.sync.refresh()
        assert sv.tables == started + 2  # at least every TABLE_EVERY_S
        s.sync.children = None  # a platform where they cannot be read: every round
        monkeypatch.setattr(sync, "TABLE_EVERY_S", 3600.0)
        await s.sync.refresh()
        await s.sync.refresh()
        assert sv.tables == started + 4

    running(sched, body)


def test_a_cold_start_evicts_the_lower_priority_idle_model_only(tmp_path: Path) -> None:
    """Room for two: hot `lo` (10) and `mid` (30) run idle; a request for cold `hi` (50) stops `lo` alone."""
    sv = FakeSupervisor(running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30) + model("hi", 50, mode="cold"), sv)

    async def body(s: Scheduler) -> None:
        async with s.slots.slot(s.models["hi"]):
            pass
        assert (sv.stopped, sv.started) == (["lo"], ["hi"])
        assert kinds(s) == [("evict", "lo"), ("cold_start", "hi")]
        evict = decisions(s)[0].detail
        assert (evict["for_model"], evict["for_priority"], evict["by"]) == ("hi", 50, "gateway")
        assert s.models["lo"].evicted and s.models["lo"].status_word == "evicted"
        # every change of phase announced itself, with its reason, as it was made
        assert states(s, "hi") == [("down", "starting", None), ("starting", "ready", None)]
        assert states(s, "lo")[-2:] == [("ready", "stopping", "evicted for hi"), ("stopping", "down", "evicted for hi")]

    running(sched, body)


def test_among_equal_priorities_the_cheapest_to_bring_back_gives_way(tmp_path: Path) -> None:
    """Room for two of 1 GiB: `slow` (its last start took 9 s) and `quick` (0.3 s) run idle at priority 50, and
    `quick` was used last, so least-recently-used alone would pick `slow`. What bringing each back costs decides
    (9 s is three doublings past the 2 s under which every start counts as quick): `quick` goes for `new`
    (priority 60), and its eviction says why. A model never started on demand is costed by its size at 1 GiB/s:
    1 GiB -> 1.0 s."""
    sv = FakeSupervisor(running=("slow", "quick"))
    sched = scheduler(tmp_path, model("slow", 50) + model("quick", 50) + model("new", 60, mode="cold"), sv)

    async def body(s: Scheduler) -> None:
        s.models["slow"].last_cold_start_s, s.models["quick"].last_cold_start_s = 9.0, 0.3
        s.slots["slow"].last_used, s.slots["quick"].last_used = 100.0, 200.0
        async with s.slots.slot(s.models["new"]):
            pass
        assert (sv.stopped, sv.started) == (["quick"], ["new"])
        evict = decisions(s)[0].detail
        assert (evict["restore_s"], evict["restore_from"], evict["for_priority"]) == (0.3, "measured", 60)
        s.models["quick"].last_cold_start_s = None
        assert s.admission.restore_cost(s.models["quick"]) == (1.0, "size")

    running(sched, body)


def test_a_shared_name_goes_to_the_loaded_model_else_the_cheapest_to_start(tmp_path: Path) -> None:
    """`small` (512 MiB) and `large` (1 GiB) both serve "coder". Nothing loaded: the cheaper to start, by size at
    1 GiB/s (0.5 s against 1 s), answers; once `large` alone runs, it answers (warm first), and status says so."""
    from umemc.runtime.gateway import views

    shared = 'serves = ["coder"]\n'
    models = model("small", 50, "cold", "512MiB") + shared + model("large", 50, "cold") + shared
    sv = FakeSupervisor()
    sched = scheduler(tmp_path, models, sv)

    async def body(s: Scheduler) -> None:
        assert s.slots.route("coder").name == "small"
        async with s.slots.slot(s.slots.route("coder")):
            pass
        assert sv.started == ["small"]
        await s.actions.stop_now(s.models["small"], drain=True)
        await s.actions.start_now(s.models["large"])
        await settled(s)
        assert s.slots.route("coder").name == "large"
        assert views.status(s)["groups"] == {"coder": {"models": ["small", "large"], "answers_now": "large"}}

    running(sched, body)


def test_starts_that_cost_alike_leave_the_choice_to_least_recently_used(tmp_path: Path) -> None:
    """0.3 s and 1.5 s are both quick (under 2 s): the one idle longer goes, whatever the measurement's noise."""
    sv = FakeSupervisor(running=("a", "b"))
    sched = scheduler(tmp_path, model("a", 50) + model("b", 50) + model("new", 60, mode="cold"), sv)

    async def body(s: Scheduler) -> None:
        s.models["a"].last_cold_start_s, s.models["b"].last_cold_start_s = 0.3, 1.5
        s.slots["a"].last_used, s.slots["b"].last_used = 200.0, 100.0
        async with s.slots.slot(s.models["new"]):
            pass
        assert sv.stopped == ["b"]

    running(sched, body)


class Gated(FakeSupervisor):
    """Reads the gate a start finds when supervisord is asked to start it; `refuse` names programs whose stop
    supervisord refuses."""

    def __init__(self, gates: Path, running: tuple[str, ...] = (), refuse: tuple[str, ...] = ()) -> None:
        super().__init__(running)
        self.gates, self.refuse = gates, refuse
        self.found: list[str | None] = []

    def ensure_started(self, name: str) -> None:
        gate = self.gates / name
        self.found.append(gate.read_text() if gate.exists() else None)
        super().ensure_started(name)

    def try_stop(self, name: str, *, wait: bool) -> str | None:
        if name in self.refuse:
            self.stopped.append(name)
            return "supervisord refused: FAILED: it ignores SIGTERM"
        return super().try_stop(name, wait=wait)


def test_a_cold_start_waits_behind_a_gate_while_its_victim_stops(tmp_path: Path) -> None:
    """Where the victim's process is on record (its wrapper's `pid starttime`), the cold model is started while the
    victim stops, behind a gate that names that process (the model's wrapper waits there for its exit: see
    tests/runtime/test_gate.py), valid for 10 minutes; the gate goes once the victim is stopped. Without the record
    (this file's other tests), the victim is stopped first, as before."""
    sv = Gated(tmp_path / "run" / "state" / "gates", running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30) + model("hi", 50, mode="cold"), sv)
    (sched.run.pids).mkdir(parents=True)
    (sched.run.pids / "lo").write_text(f"{os.getpid()} {start_of(os.getpid())}\n")  # a live process stands for lo's

    async def body(s: Scheduler) -> None:
        before = time.time()
        async with s.slots.slot(s.models["hi"]):
            pass
        assert (sv.stopped, sv.started) == (["lo"], ["hi"])
        assert sv.found[0] is not None
        until, victim = sv.found[0].splitlines()
        assert victim == f"{os.getpid()} {start_of(os.getpid())} lo"
        # written to the millisecond (rounded): within half of one of the bounds
        assert until.startswith("until ") and before + 600 - 0.0005 <= float(until.split()[1]) <= time.time() + 600.0005
        assert not (s.run.gates / "hi").exists()
        assert kinds(s) == [("evict", "lo"), ("cold_start", "hi")]

    running(sched, body)


def test_a_victims_record_naming_a_gone_process_means_no_gate(tmp_path: Path) -> None:
    """The wrapper could not rewrite lo's record when lo last started (a full disk): it names a process that is
    gone, so the gate could not hold the start; lo is stopped first, then the model starts, and no gate is left."""
    sv = Gated(tmp_path / "run" / "state" / "gates", running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30) + model("hi", 50, mode="cold"), sv)
    gone = subprocess.Popen(["true"])
    gone.wait()
    (sched.run.pids).mkdir(parents=True)
    (sched.run.pids / "lo").write_text(f"{gone.pid} 12345\n")
    (sched.run.gates).mkdir(parents=True)
    (sched.run.gates / "hi").write_text("until 1\n")  # what a gateway killed mid-start left

    async def body(s: Scheduler) -> None:
        async with s.slots.slot(s.models["hi"]):
            pass
        assert (sv.stopped, sv.started, sv.found) == (["lo"], ["hi"], [None])

    running(sched, body)


def test_a_gated_start_whose_victim_will_not_stop_is_stopped_before_its_gate_goes(tmp_path: Path) -> None:
    """supervisord refuses to stop the victim: the model started behind the gate is stopped (its wrapper, still
    waiting, never runs the worker), then the gate goes; the request is refused with the reason."""
    sv = Gated(tmp_path / "run" / "state" / "gates", running=("lo", "mid"), refuse=("lo",))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30) + model("hi", 50, mode="cold"), sv)
    (sched.run.pids).mkdir(parents=True)
    (sched.run.pids / "lo").write_text(f"{os.getpid()} {start_of(os.getpid())}\n")  # a live process stands for lo's

    async def body(s: Scheduler) -> None:
        with pytest.raises(Refused) as refused:
            async with s.slots.slot(s.models["hi"]):
                pass
        why = "supervisord refused: FAILED: it ignores SIGTERM"
        assert refused.value.message == f"could not stop lo to make room: {why}"
        assert (sv.stopped, sv.started) == (["lo", "hi"], ["hi"])
        assert sv.states["hi"] == "STOPPED" and s.models["lo"].ready
        assert not (s.run.gates / "hi").exists()
        assert kinds(s) == [("evict_failed", "lo"), ("cold_start_failed", "hi")]

    running(sched, body)


def test_a_busy_victim_serves_its_batch_then_gives_way(tmp_path: Path) -> None:
    """`lo` has a request in flight and one queued when `hi` needs its room (and `top` outranks `hi`): it drains
    (the queued one is served), then it is stopped and `hi` starts. (An idle victim of higher priority would be
    evicted before a busy one is drained: the policy's order.)"""
    sv = FakeSupervisor(running=("lo", "top"))
    sched = scheduler(tmp_path, model("lo", 10) + model("top", 90) + model("hi", 50, mode="cold"), sv)
    served: list[str] = []

    async def body(s: Scheduler) -> None:
        lo, hold = s.models["lo"], asyncio.Event()

        async def request(name: str, wait: asyncio.Event | None = None) -> None:
            async with s.slots.slot(s.models[name], Admit.QUEUE):
                served.append(name)
                if wait is not None:
                    await wait.wait()

        first = asyncio.create_task(request("lo", hold))
        queued = asyncio.create_task(request("lo"))
        while s.slots["lo"].queued < 1:
            await asyncio.sleep(0)
        hi = asyncio.create_task(request("hi"))
        while lo.life.phase is not Phase.DRAINING:
            await asyncio.sleep(0)
        assert s.models["hi"].draining_for == ["lo"] and sv.stopped == []
        hold.set()
        await asyncio.gather(first, queued, hi)
        assert served == ["lo", "lo", "hi"] and (sv.stopped, sv.started) == (["lo"], ["hi"])

    running(sched, body)


def test_a_drain_that_times_out_abandons_the_eviction_not_the_request(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("lo", "top"))
    models = model("lo", 10) + model("top", 90) + model("hi", 50, mode="cold")
    sched = scheduler(tmp_path, models, sv, drain_timeout="50ms", queue_timeout="200ms")

    async def body(s: Scheduler) -> None:
        lo, hold = s.models["lo"], asyncio.Event()

        async def busy() -> None:
            async with s.slots.slot(lo):
                await hold.wait()

        task = asyncio.create_task(busy())
        while s.slots["lo"].in_flight < 1:
            await asyncio.sleep(0)
        with pytest.raises(Refused) as refused:
            async with s.slots.slot(s.models["hi"]):
                pass
        assert refused.value.code == "insufficient_memory"
        assert refused.value.message.startswith("model hi could not start within 0.2 s: ")
        assert lo.life.phase is Phase.READY and sv.stopped == [] and "lo" in s.undrainable
        assert kinds(s) == [("drain_timeout", "hi")]
        hold.set()
        await task
        assert "lo" not in s.undrainable  # idle again: it may be drained next time

    running(sched, body)


def test_a_start_that_can_never_be_admitted_is_refused_at_once(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 90) + model("big", 50, mode="cold", memory="2GiB"), sv)

    async def body(s: Scheduler) -> None:
        t0 = time.monotonic()
        with pytest.raises(Refused) as refused:
            await s.slots.acquire(s.models["big"], Admit.REFUSE_NOW)
        assert time.monotonic() - t0 < 1 and refused.value.code == "not_admissible"
        assert sv.started == [] and kinds(s) == [("refused", "big")]

    running(sched, body)


def test_leases_evict_refuse_release_and_expire(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30), sv)

    async def body(s: Scheduler) -> None:
        lease, decision, _ = await s.actions.grant_lease("comfy", GiB, 0, 20, 60, None, None)
        assert lease is not None and decision.evict == ["lo"] and sv.stopped == ["lo"]
        assert [x.id for x in s.book.live()] == [lease.id]
        assert lease.id in (s.run.gateway_state.read_text())  # on disk before the client hears of it
        none, refused, need = await s.actions.grant_lease("job", GiB, 0, 20, 60, None, None)
        assert none is None and not refused.fits
        # at 31 it outranks `mid` (30), the one idle model left to stop
        assert s.actions.grant_at(need) == (31, s.admission.decide(replace(need, priority=31)))
        assert s.admission.decide(replace(need, priority=31)).evict == ["mid"]
        assert s.actions.release_lease(lease.id) is not None and s.book.live() == []
        short, _, _ = await s.actions.grant_lease("job", GiB, 0, 20, 60, None, None)
        assert short is not None
        await s.housekeeping_once(now=time.time() + 61)  # past its ttl; lo fits again: restored
        await settled(s)
        assert s.book.live() == [] and sv.started == ["lo"] and s.models["lo"].ready
        expected = ["lease_grant", "evict", "lease_release", "lease_grant", "lease_expire", "restore", "cold_start"]
        assert [k for k, _ in kinds(s)] == expected

    running(sched, body)


def test_a_lease_that_cannot_be_recorded_is_not_granted(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("lo",))
    sched = scheduler(tmp_path, model("lo", 10), sv)
    sched.run.gateway_state.mkdir()  # gateway.json cannot be replaced by a file: every write fails

    async def body(s: Scheduler) -> None:
        with pytest.raises(Refused) as refused:
            await s.actions.grant_lease("comfy", GiB, 0, 20, 60, None, None)
        assert refused.value.code == "state_unwritable" and s.book.leases == {} and sv.stopped == []

    running(sched, body)


def test_pressure_waits_for_a_busy_victim_then_evicts_it(tmp_path: Path) -> None:
    sv = FakeSupervisor(running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30), sv)

    async def body(s: Scheduler) -> None:
        hold = asyncio.Event()

        async def busy() -> None:
            async with s.slots.slot(s.models["lo"]):
                await hold.wait()

        task = asyncio.create_task(busy())
        while s.slots["lo"].in_flight < 1:
            await asyncio.sleep(0)
        assert await s.actions.relieve_pressure(0.95) == {"action": "deferred", "model": "lo"}
        assert await s.actions.relieve_pressure(0.95) == {"action": "deferred", "model": "lo"}  # said once
        hold.set()
        await task
        assert await s.actions.relieve_pressure(0.95) == {"action": "evicting", "model": "lo"}
        while s.models["lo"].life.phase is not Phase.DOWN:
            await asyncio.sleep(0)
        assert sv.stopped == ["lo"] and not s.models["lo"].evicted  # for pressure: it stays down
        assert kinds(s) == [("evict_deferred", "lo"), ("evict", "lo")]

    running(sched, body)


def test_pressure_takes_no_worker_supervisord_has_stopped_since_the_last_poll(tmp_path: Path) -> None:
    """The enforcer gave up on the lowest-priority worker and stopped it a moment ago; the gateway's last poll still
    saw it running. Pressure now stops the next one in the policy's order, not the one already down."""
    sv = FakeSupervisor(running=("lo", "mid"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30), sv)

    async def body(s: Scheduler) -> None:
        sv.states["lo"] = "STOPPED"  # behind the gateway's back (the enforcer's give-up)
        assert await s.actions.relieve_pressure(0.95) == {"action": "evicting", "model": "mid"}
        while s.models["mid"].life.phase is not Phase.DOWN:
            await asyncio.sleep(0)
        assert sv.stopped == ["mid"]

    running(sched, body)


def test_a_plan_that_changes_only_models_is_taken_on_in_place(tmp_path: Path) -> None:
    """`umemc up` on a running stack whose models changed (Scheduler.adopt): an added model is routed (by its
    alias too), a removed one no longer (its queued request is refused; the one in flight finishes and lets its
    slot go), a changed one serves by its new settings; a plan that changes more is not taken on."""
    sv = FakeSupervisor(running=("a", "b"))
    sched = scheduler(tmp_path, model("a", 50) + model("b", 40), sv)
    sched.sync.plan_digest = "before"
    bundle = tmp_path / "run" / "bundle"

    def next_plan(models: str, **gw: Any) -> PlanDoc:
        settings = {"queue": 8, "queue_timeout": "5s", "drain_timeout": "5s", "platform": CPU_4G} | gw
        (tmp_path / "stack.toml").write_text(STACK.format(**settings) + models)
        build(make_plan(load_stack(tmp_path / "stack.toml")), bundle)
        return read(PlanDoc, bundle / "plan.json")

    async def body(s: Scheduler) -> None:
        b = s.models["b"]
        await s.slots.acquire(b)  # in flight
        queued = asyncio.create_task(s.slots.acquire(b))
        while s.slots["b"].queued != 1:
            await asyncio.sleep(0)
        wider = next_plan(model("a", 50, concurrency=2) + model("c", 30, mode="cold") + 'aliases = ["see"]\n')
        assert s.adopt(wider, "after")
        with pytest.raises(Refused, match="^model b was removed from the stack$"):
            await queued
        s.slots.release(b)  # the request in flight ends after its model left
        assert (list(s.models), s.slots.route("see").name, s.models["a"].max_concurrency) == (["a", "c"], "c", 2)
        with pytest.raises(Refused, match=r"^model 'b' is not in this stack \(known: a, c, see\)$"):
            s.slots.route("b")
        adopted = [e.detail for e in s.events.since(0) if e.kind == "plan_adopted"]
        assert adopted == [{"by": "gateway", "added": ["c"], "changed": ["a"], "removed": ["b"]}]
        state = read(GatewayState, s.run.gateway_state)
        assert (sorted(state.models), state.plan_sha256) == (["a", "c"], "after")
        assert not s.adopt(next_plan(model("a", 50), queue=9), "queue")  # the gateway's own settings: a restart
        assert list(s.models) == ["a", "c"] and s.sync.plan_digest == "after"

    running(sched, body)


def test_a_child_that_exits_within_supervisords_start_call_is_a_start_to_watch() -> None:
    """supervisord reaps the child inside startProcess: one that already exited answers SPAWN_ERROR (and is in
    BACKOFF, retried as any other), which is a start whose end the scheduler then watches (FATAL, said with its
    log), not 'supervisord did not answer'; ALREADY_STARTED is a start too; any other fault is a failure."""
    import xmlrpc.client

    from umemc.runtime.supervisor import Supervisor

    class Answers(Supervisor):
        def __init__(self, fault: int) -> None:
            self.fault = fault

        def call(self, method: str, *args: Any) -> Any:
            assert (method, args) == ("supervisor.startProcess", ("x", False))
            raise xmlrpc.client.Fault(self.fault, f"fault {self.fault}: x")

    Answers(50).ensure_started("x")  # SPAWN_ERROR
    Answers(60).ensure_started("x")  # ALREADY_STARTED
    with pytest.raises(xmlrpc.client.Fault, match="fault 10: x"):
        Answers(10).ensure_started("x")  # BAD_NAME


@pytest.mark.parametrize("measure", ["allocator", "beyond_buffers"])
def test_a_worker_whose_allocator_stays_fragmented_is_restarted_at_a_quiet_moment(tmp_path: Path, measure: str) -> None:
    """policy.restart_fragmented_above = 0.25: a hot worker whose allocator holds more than a quarter of its hard
    quota beyond its tensors (the enforcer's figure; a llama.cpp worker: what its processes hold beyond its
    buffers) for FRAGMENTED_FOR_S, with no request for QUIET_S, is stopped and restored in the next round; not
    before it has held that long, not while it serves, and not a stop that counts as a restart."""
    from umemc.contract import EnforcerStatus, WorkerStatus, dump
    from umemc.runtime.gateway import views
    from umemc.runtime.gateway.housekeeping import FRAGMENTED_FOR_S, QUIET_S

    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 50) + "[policy]\nrestart_fragmented_above = 0.25\n", sv)
    hard = sched.models["a"].plan.quota_hard_bytes
    seen: list[tuple[float, list[str], list[str]]] = []

    figure = "allocator_unused_bytes" if measure == "allocator" else "beyond_buffers_bytes"

    def status(unused: int) -> None:
        w = WorkerStatus(pid=1000, rss_bytes=1, gpu_bytes=0, peak_bytes=1, restarts=0, started=0.0, last_event=None,
                         given_up=False, drift=None, reserved_bytes=0, **{figure: unused})  # fmt: skip
        doc = EnforcerStatus(time=time.time(), pid=1, pressure=0.1, events_error=None, events_moved_to=None,
                             models={"a": w})  # fmt: skip
        sched.run.status.write_text(dump(doc))

    async def body(s: Scheduler) -> None:
        t0 = s.slots["a"].last_used + QUIET_S + 1  # quiet from the start
        status(hard // 4)  # at the share: not over it
        await s.housekeeping_once(now=t0)
        status(hard // 4 + 1)
        await s.housekeeping_once(now=t0 + 1)  # over it from now on
        assert views.status(s)["models"]["a"]["held_beyond_bytes"] == hard // 4 + 1  # shown as the enforcer saw it
        await s.housekeeping_once(now=t0 + FRAGMENTED_FOR_S)  # not yet as long
        seen.append((t0, list(sv.stopped), list(sv.started)))
        async with s.slots.slot(s.models["a"]):  # it serves: never restarted under a request
            await s.housekeeping_once(now=t0 + FRAGMENTED_FOR_S + 2)
        seen.append((t0, list(sv.stopped), list(sv.started)))
        await s.housekeeping_once(now=time.time() + QUIET_S + FRAGMENTED_FOR_S + 3)  # quiet again, long enough
        await s.housekeeping_once(now=time.time() + QUIET_S + FRAGMENTED_FOR_S + 4)  # the restore round
        await settled(s)  # the restore's start runs beside the round
        seen.append((t0, list(sv.stopped), list(sv.started)))
        kinds = [(e.kind, e.detail) for e in s.events.since(0) if e.kind in ("defragment", "restore")]
        detail = kinds[0][1]
        seen.append((0.0, [k for k, _ in kinds], [str(detail["unused_bytes"] == hard // 4 + 1), detail["measure"]]))

    running(sched, body)
    assert [x[1:] for x in seen] == [
        ([], []),
        ([], []),
        (["a"], ["a"]),
        (["defragment", "restore"], ["True", measure]),
    ]


def test_the_enforcers_status_is_parsed_once_a_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round reads the enforcer's status file; it is parsed only when its bytes changed (the enforcer rewrites
    it every second, the round comes every half second), however soon after the last change it is rewritten in
    place; a corrupt one reads as none until it is written again; a stale one (STATUS_FRESH_S) as none."""
    from umemc.contract import EnforcerStatus, dump
    from umemc.runtime.gateway import sync as sync_module

    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 50), sv)
    parsed: list[float] = []
    real_parse = sync_module.parse

    def counted(kind: Any, text: bytes, where: Any) -> Any:
        doc = real_parse(kind, text, where)
        parsed.append(doc.pressure)
        return doc

    monkeypatch.setattr(sync_module, "parse", counted)

    def status(pressure: float, at: float | None = None) -> None:
        doc = EnforcerStatus(time=time.time() if at is None else at, pid=1, pressure=pressure, events_error=None,
                             events_moved_to=None, models={})  # fmt: skip
        sched.run.status.write_text(dump(doc))

    seen: list[float | None] = []

    async def body(s: Scheduler) -> None:
        for step in (lambda: status(0.25), lambda: None, lambda: status(0.5), lambda: None,
                     lambda: sched.run.status.write_text("{"), lambda: status(0.75, at=time.time() - 60)):  # fmt: skip
            step()
            await s.sync.refresh()
            seen.append(s.sync.pressure)

    running(sched, body)
    assert seen == [0.25, 0.25, 0.5, 0.5, None, None]
    assert parsed == [0.25, 0.5, 0.75]


def muted(sched: Scheduler, sv: FakeSupervisor) -> set[str]:
    """The models whose health URL stops answering while named in the returned set (a hung worker: supervisord
    still runs it)."""
    mute: set[str] = set()

    async def probe(m: Model) -> bool:
        return sv.states.get(m.name) == "RUNNING" and m.name not in mute

    sched.sync.probe = probe
    return mute


async def until_phase(s: Scheduler, name: str, phase: Phase) -> None:
    """The health watch (every millisecond here) running until the model is in `phase`."""
    watch = asyncio.create_task(s.sync.health_watch(0.001))
    try:
        while s.models[name].life.phase is not phase:
            await asyncio.sleep(0.001)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


def test_a_hung_worker_is_unhealthy_until_it_answers_or_is_gone(tmp_path: Path) -> None:
    """A ready worker whose health URL stops answering (two misses in a row) takes no request: it is back once it
    answers (a poll, or a request that waits for it and starts it afresh), and down once supervisord has lost it."""
    sv = FakeSupervisor(running=("a", "b"))
    sched = scheduler(tmp_path, model("a", 50) + model("b", 40), sv)
    mute = muted(sched, sv)

    async def body(s: Scheduler) -> None:
        a, b = s.models["a"], s.models["b"]
        mute.add("a")
        await until_phase(s, "a", Phase.UNHEALTHY)
        await s.sync.refresh()
        assert a.life.phase is Phase.UNHEALTHY  # still silent
        mute.discard("a")
        await s.sync.refresh()
        assert a.life.phase is Phase.READY  # answers again
        await s.slots.acquire(a)  # one in flight, one queued (max_concurrency 1) when it hangs
        queued = asyncio.create_task(s.slots.acquire(a))
        while s.slots["a"].queued < 1:
            await asyncio.sleep(0)
        mute.add("a")
        await until_phase(s, "a", Phase.STARTING)  # the queued request has its worker awaited afresh
        mute.discard("a")
        s.slots.release(a)
        await queued
        s.slots.release(a)
        assert a.life.phase is Phase.READY
        mute.add("b")
        await until_phase(s, "b", Phase.UNHEALTHY)
        sv.states["b"] = "EXITED"
        await s.sync.refresh()
        assert b.life.phase is Phase.DOWN
        assert states(s, "a") == [
            ("down", "ready", "answers its health URL"),  # found running at the gateway's start
            ("ready", "unhealthy", "its health URL did not answer 2 times in a row"),
            ("unhealthy", "ready", "answers its health URL"),
            ("ready", "unhealthy", "its health URL did not answer 2 times in a row"),
            ("unhealthy", "starting", None),
            ("starting", "ready", None),
        ]
        assert states(s, "b")[-2:] == [
            ("ready", "unhealthy", "its health URL did not answer 2 times in a row"),
            ("unhealthy", "down", "supervisord says EXITED"),
        ]

    running(sched, body)


def test_pressure_stops_a_hung_worker_and_one_never_seen_healthy(tmp_path: Path) -> None:
    """The pressure victim is whatever supervisord runs, by the policy's order, whether or not it answers: one that
    never answered since the gateway started (down to the gateway, running to supervisord), then a hung one."""
    sv = FakeSupervisor(running=("lo", "mid", "top"))
    sched = scheduler(tmp_path, model("lo", 10) + model("mid", 30) + model("top", 90, memory="256MiB"), sv)
    mute = muted(sched, sv)
    mute.add("lo")

    async def body(s: Scheduler) -> None:
        lo, mid = s.models["lo"], s.models["mid"]
        assert lo.life.phase is Phase.DOWN and lo.live  # never answered
        assert await s.actions.relieve_pressure(0.95) == {"action": "evicting", "model": "lo"}
        while lo.life.phase is not Phase.DOWN or sv.stopped != ["lo"]:
            await asyncio.sleep(0)
        mute.add("mid")
        await until_phase(s, "mid", Phase.UNHEALTHY)
        assert await s.actions.relieve_pressure(0.95) == {"action": "evicting", "model": "mid"}
        while mid.life.phase is not Phase.DOWN:
            await asyncio.sleep(0)
        assert sv.stopped == ["lo", "mid"]
        assert [(f, t) for f, t, _ in states(s, "lo")] == [("down", "stopping"), ("stopping", "down")]
        assert [(f, t) for f, t, _ in states(s, "mid")] == [
            ("down", "ready"),
            ("ready", "unhealthy"),
            ("unhealthy", "stopping"),
            ("stopping", "down"),
        ]

    running(sched, body)


@pytest.mark.parametrize("end", ["hangs", "dies"])
def test_a_draining_victim_that_hangs_or_dies(tmp_path: Path, end: str) -> None:
    """A victim draining for a cold start that stops answering is unhealthy (it takes no more of its batch); one
    whose process ends is down; either way the start it drained for goes on once it is gone."""
    sv = FakeSupervisor(running=("lo", "top"))
    sched = scheduler(tmp_path, model("lo", 10) + model("top", 90) + model("hi", 50, mode="cold"), sv)
    mute = muted(sched, sv)

    async def body(s: Scheduler) -> None:
        lo, hold = s.models["lo"], asyncio.Event()

        async def busy() -> None:
            async with s.slots.slot(lo, Admit.QUEUE):
                await hold.wait()

        first = asyncio.create_task(busy())
        while s.slots["lo"].in_flight < 1:
            await asyncio.sleep(0)
        hi = asyncio.create_task(s.slots.acquire(s.models["hi"]))
        while lo.life.phase is not Phase.DRAINING:
            await asyncio.sleep(0)
        if end == "hangs":
            mute.add("lo")
            await until_phase(s, "lo", Phase.UNHEALTHY)
        else:
            sv.states["lo"] = "EXITED"
            await s.sync.refresh()
            assert lo.life.phase is Phase.DOWN
        hold.set()
        await first
        await hi
        s.slots.release(s.models["hi"])
        assert s.models["hi"].ready and sv.started == ["hi"]
        moved = [(f, t) for f, t, _ in states(s, "lo")]
        assert moved[1:3] == ([("ready", "draining"), ("draining", "unhealthy")] if end == "hangs" else
                              [("ready", "draining"), ("draining", "down")])  # fmt: skip

    running(sched, body)
