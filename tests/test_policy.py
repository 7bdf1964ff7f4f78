"""The one eviction policy (umemc.budget.policy): its arithmetic exact to the byte, and the three paths that use
it (`umemc check`, the gateway, the enforcer) choosing the same victims."""

from __future__ import annotations

from umemc.budget.policy import Budget, Held, Lease, Need, decide

MiB = 1024 * 1024


def held(
    name: str,
    priority: int,
    ram: int,
    *,
    cold: bool = True,
    busy: bool = False,
    drainable: bool = True,
    last_used: float = 0.0,
    gpu: int = 0,
) -> Held:
    return Held(
        name, priority, cold=cold, ram=ram * MiB, gpu=gpu * MiB, busy=busy, drainable=drainable, last_used=last_used
    )


def need(ram: int, priority: int = 50, *, cold: bool = True, drain: bool = True, gpu: int = 0) -> Need:
    return Need("x", ram=ram * MiB, gpu=gpu * MiB, priority=priority, cold=cold, drain=drain)


def test_fits_in_free_memory_without_evicting() -> None:
    d = decide(need(300), [held("a", 90, 400)], [], Budget(768 * MiB, None))
    assert (d.fits, d.evict, d.drain, d.free_ram) == (True, [], [], 368 * MiB)


def test_lowest_priority_first_then_least_recently_used() -> None:
    workers = [
        held("p30-new", 30, 200, last_used=20),
        held("p20", 20, 200, last_used=30),
        held("p30-old", 30, 200, last_used=10),
        held("p90", 90, 100),
    ]
    d = decide(need(350, 50), workers, [], Budget(768 * MiB, None))
    assert (d.fits, d.evict) == (True, ["p20", "p30-old"])


def test_idle_before_busy_and_busy_only_by_draining() -> None:
    workers = [held("busy", 10, 300, busy=True), held("idle", 20, 300)]
    assert decide(need(400), workers, [], Budget(700 * MiB, None)).evict == ["idle"]
    d = decide(need(600), workers, [], Budget(700 * MiB, None))
    assert (d.fits, d.evict, d.drain) == (True, ["idle"], ["busy"])
    lease = decide(need(600, drain=False), workers, [], Budget(700 * MiB, None))
    assert (lease.fits, lease.blocked_by) == (
        False,
        [{"kind": "worker", "name": "busy", "priority": 10, "bytes": 300 * MiB, "why": "requests in flight"}],
    )


def test_never_a_higher_or_equal_hot_priority_and_a_starting_worker_never() -> None:
    workers = [
        held("hot50", 50, 300, cold=False),
        held("high", 60, 300),
        held("starting", 10, 100, busy=True, drainable=False),
    ]
    d = decide(need(400, 50), workers, [], Budget(800 * MiB, None))
    assert not d.fits
    assert d.blocked_by == [
        {"kind": "worker", "name": "hot50", "priority": 50, "bytes": 300 * MiB, "why": "priority 50 >= 50"},
        {"kind": "worker", "name": "high", "priority": 60, "bytes": 300 * MiB, "why": "priority 60 >= 50"},
        {"kind": "worker", "name": "starting", "priority": 10, "bytes": 100 * MiB, "why": "starting"},
    ]
    assert d.reason(need(400, 50)) == (
        f"x needs {400 * MiB} bytes (0.39 GiB), {100 * MiB} bytes (0.10 GiB) free; blocked by hot50 (priority "
        "50 >= 50), high (priority 60 >= 50), starting (starting)"
    )


def test_equal_priority_cold_models_swap() -> None:
    d = decide(need(500, 50), [held("other", 50, 500)], [], Budget(768 * MiB, None))
    assert (d.fits, d.evict) == (True, ["other"])
    hot = decide(need(500, 50, cold=False), [held("other", 50, 500)], [], Budget(768 * MiB, None))
    assert not hot.fits


def test_leases_count_and_block() -> None:
    lease = Lease("l-1", "comfyui", 400 * MiB, 0, 50, 1e12)
    d = decide(need(300), [held("a", 10, 100)], [lease], Budget(768 * MiB, None))
    assert (d.fits, d.evict, d.free_ram) == (True, ["a"], 268 * MiB)
    d = decide(need(500), [held("a", 10, 100)], [lease], Budget(768 * MiB, None))
    assert not d.fits
    assert d.blocked_by == [{"kind": "lease", "id": "l-1", "holder": "comfyui", "bytes": 400 * MiB, "expires": 1e12}]


def test_gpu_window_is_a_second_ledger() -> None:
    workers = [held("a", 10, 100, gpu=500), held("b", 20, 100, gpu=100)]
    d = decide(need(100, gpu=400), workers, [], Budget(1000 * MiB, 700 * MiB))
    assert (d.fits, d.evict, d.free_gpu) == (True, ["a"], 100 * MiB)


SCENARIO = """
version = 1
name = "policy"
[platform]
kind = "cpu"
memory = "2304MiB"
os_reserve = "256MiB"
[policy]
safety_margin = 0.0
quota_headroom = 0.0
[gateway]
port = 18999
[models.a]
runtime = "command"
command = ["true"]
memory = "400MiB"
priority = 10
[models.b]
runtime = "command"
command = ["true"]
memory = "400MiB"
priority = 20
[models.c]
runtime = "command"
command = ["true"]
memory = "400MiB"
priority = 10
[models.d]
runtime = "command"
command = ["true"]
memory = "600MiB"
priority = 90
[models.x]
runtime = "command"
command = ["true"]
memory = "900MiB"
priority = 50
mode = "cold"
"""
# By hand: budget 2048 MiB, hot set 1800 MiB, headroom 248 MiB; x needs 900 MiB, so 652 MiB must be
# freed: a (priority 10, first in the file), then c (priority 10): 800 MiB. b (20) and d (90) stay.
EXPECTED = ["a", "c"]


def test_check_gateway_and_enforcer_choose_the_same_victims(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same stack, nothing used yet: `umemc check`'s cold admission, the gateway's decision and
    the enforcer's pressure guard (stopping until 652 MiB are freed) name the same workers."""
    from umemc.budget.plan import make_plan
    from umemc.commands.build import build
    from umemc.runtime.enforcer.loop import Enforcer
    from umemc.runtime.gateway.lifecycle import Phase
    from umemc.runtime.gateway.scheduler import Scheduler
    from umemc.stack.resolve import load_stack

    (tmp_path / "stack.toml").write_text(SCENARIO)
    plan = make_plan(load_stack(tmp_path / "stack.toml"))
    assert list(plan.cold_admission["x"].evicts) == EXPECTED  # umemc check

    build(plan, tmp_path / "run" / "bundle")
    sched = Scheduler.of_bundle(tmp_path / "run" / "bundle")
    for name in "abcd":
        sched.models[name].state = "RUNNING"
        sched.models[name].life.to(Phase.READY)
    assert sched.admission.decide_model(sched.models["x"]).evict == EXPECTED  # the gateway
    sched.events.close()

    enforcer = Enforcer(tmp_path / "run" / "bundle")
    infos = {name: {"statename": "RUNNING"} for name in "abcd"}
    for pid, name in enumerate("abcd", start=1000):
        w = enforcer.workers[name]
        w.pid, w.cpu_side = pid, w.quota.hard
    victims, freed = [], 0
    while freed < 652 * MiB:
        victim = enforcer.pressure_victim(infos, busy=set())
        assert victim is not None
        victims.append(victim.name)
        freed += victim.usage
        victim.pid = None  # stopped
    assert victims == EXPECTED  # the enforcer
    enforcer.events.close()


def test_on_paper_gives_decide_s_answer_for_every_need() -> None:
    """policy.OnPaper (bisection on the eviction order, for the placement's half a million questions) against
    decide() itself on 2000 random hot sets and cold needs, pressure rule included."""
    import random

    from umemc.budget.policy import Budget, Held, OnPaper, decide

    rng = random.Random(7)
    for _ in range(2000):
        held = [
            Held(
                f"h{i}",
                rng.choice((10, 20, 20, 50, 80)),
                cold=False,
                ram=rng.randint(1, 40) * MiB,
                gpu=rng.randint(0, 20) * MiB,
                busy=False,
                drainable=True,
                last_used=0.0,
            )
            for i in range(rng.randint(0, 8))
        ]
        gpu = None if rng.random() < 0.3 else rng.randint(50, 300) * MiB
        budget = Budget(rng.randint(50, 300) * MiB, gpu, usable=rng.choice((0, 400 * MiB)), load_below=0.7)
        paper = OnPaper(held, budget)
        for _ in range(5):
            need = Need(
                "x",
                ram=rng.randint(1, 120) * MiB,
                gpu=rng.randint(0, 60) * MiB,
                priority=rng.choice((15, 50, 90)),
                cold=True,
                drain=False,
            )
            d = decide(need, held, [], budget)
            assert paper.decide(need) == (d.fits, tuple(d.evict) if d.fits else ()), (held, budget, need)
