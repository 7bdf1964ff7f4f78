"""Heat and power behind the generation budget: hwmon read from a fixture tree in the kernel's sysfs format
(Documentation/hwmon/sysfs-interface.rst: tempN_input, _max, _crit in millidegrees Celsius, tempN_label,
power1_average in microwatts, the chip's `name`), nvidia-smi's --query-gpu lines in its csv format (`nvidia-smi
--help-query-gpu`: `[N/A]` where the board cannot say, `Active` / `Not Active` for a throttle reason); the
enforcer's status saying it, and the gateway lowering max_generating while the box throttles and raising it after."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.runtime.test_enforcer_loop import Loop
from tests.runtime.test_scheduler import FakeSupervisor, model, running, scheduler
from umemc.contract import EnforcerStatus, dump
from umemc.runtime.gateway.generation import GenerationBudget
from umemc.runtime.gateway.scheduler import Scheduler
from umemc.runtime.probes.heat import Heat, Sensor, hwmon, parse_nvidia

CHIPS = {
    "hwmon0": {"name": "k10temp", "temp1_input": "71250", "temp1_label": "Tctl"},
    "hwmon1": {"name": "amdgpu", "temp1_input": "64000", "temp1_label": "edge", "power1_average": "45123000",
               "temp2_input": "66000", "temp2_label": "junction", "temp2_crit": "110000", "temp2_max": "0",
               "temp3_input": "58000", "temp3_crit": "0"},
    "hwmon2": {"name": "nvme", "temp1_input": "81850", "temp1_label": "Composite", "temp1_max": "81850"},
    "hwmon3": {"name": "coretemp", "temp1_input": "90000", "temp1_label": "Package id 0", "temp1_max": "90000",
               "temp1_crit": "100000"},
}  # fmt: skip


def tree(root: Path, chips: dict[str, dict[str, str]] = CHIPS) -> Path:
    for chip, files in chips.items():
        (root / chip).mkdir(parents=True)
        for name, text in files.items():
            (root / chip / name).write_text(text + "\n")
    return root


def test_hwmon_reads_each_chips_temperatures_limits_and_power(tmp_path: Path) -> None:
    sensors, watts = hwmon(str(tree(tmp_path)))
    assert sensors == [
        Sensor("k10temp Tctl", 71.25, None),
        Sensor("amdgpu edge", 64.0, None),
        Sensor("amdgpu junction", 66.0, 110.0),  # a max of 0 is none: its crit
        Sensor("amdgpu temp3", 58.0, None),  # no label: its file's name; a crit of 0 is no limit
        Sensor("coretemp Package id 0", 90.0, 90.0),  # its max, not its crit
    ]  # the nvme drive at its own max is no compute chip: it slows its disk, not the memory bus
    assert watts == 45.123
    assert hwmon(str(tmp_path / "absent")) == ([], None)


def test_nvidia_smis_lines_say_temperature_power_and_thermal_slowdown() -> None:
    text = "63, 45.12, Not Active, Not Active, 37\n71, [N/A], Not Active, Active, 58\n"
    assert parse_nvidia(text) == (
        [Sensor("nvidia gpu0", 63.0, None), Sensor("nvidia gpu1", 71.0, None)],
        45.12,
        True,
        0.58,  # the busier GPU's memory
    )
    assert parse_nvidia("63, 45.12, Not Active, Not Active, [N/A]\n") == (
        [Sensor("nvidia gpu0", 63.0, None)],
        45.12,
        False,
        None,
    )


def test_what_counts_as_throttling() -> None:
    cool = Heat((Sensor("amdgpu edge", 64.0, None), Sensor("nvme Composite", 41.85, 81.85)), 45.1, False, "hwmon")
    assert cool.throttling() is None
    assert cool.throttling(above=64.0) == "amdgpu edge at 64 °C (throttle_above 64 °C)"
    hot = cool._replace(sensors=(Sensor("nvme Composite", 82.0, 81.85),))
    assert hot.throttling() == "nvme Composite at 82 °C, its limit 81.85 °C"
    assert cool._replace(driver_throttling=True).throttling() == "the GPU driver reports a thermal slowdown"


def test_the_budget_lowers_while_throttling_and_wakes_its_waiters_after() -> None:
    async def go() -> None:
        budget = GenerationBudget(2, throttled=1)
        assert budget.throttle("hot") is True and budget.capacity == 1
        assert budget.throttle("still hot") is False  # no change of capacity: nothing to say
        order: list[str] = []
        release = asyncio.Event()

        async def generate(name: str) -> None:
            async with budget.hold(1, priority=50):
                order.append(name)
                await release.wait()

        first = asyncio.create_task(generate("a"))
        second = asyncio.create_task(generate("b"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (order, budget.waiting) == (["a"], 1)  # one at a time while it throttles
        assert budget.throttle(None) is True and budget.capacity == 2
        await asyncio.sleep(0)
        assert (order, budget.waiting) == (["a", "b"], 0)  # cooled: the waiter goes at once
        release.set()
        await asyncio.gather(first, second)
        assert budget.in_use == 0
        assert GenerationBudget(2).throttle("hot") is False  # no throttled capacity: the budget stays

    asyncio.run(go())


def test_the_enforcers_status_says_the_heat(tmp_path: Path) -> None:
    loop = Loop(tmp_path, policy="throttle_above = 70\n")
    loop.enforcer.heat_reads.read = lambda: Heat(
        (Sensor("k10temp Tctl", 71.25, None), Sensor("amdgpu edge", 64.0, None)), 45.12, False, "hwmon"
    )
    loop.enforcer.heat_reads.poll(time.time())  # asked off the loop: its answer awaited, then a slow tick says it
    loop.enforcer.heat_reads.wait()
    loop.enforcer.slow_tick(time.time())
    doc = json.loads(loop.enforcer.run_dir.status.read_text())
    keys = ("heat_c", "heat_sensor", "power_w", "throttling", "heat_source", "memory_busy")
    assert {k: doc[k] for k in keys} == {
        "heat_c": 71.25,
        "heat_sensor": "k10temp Tctl",
        "power_w": 45.12,
        "throttling": "k10temp Tctl at 71.25 °C (throttle_above 70 °C)",
        "heat_source": "hwmon",
        "memory_busy": None,  # hwmon says nothing of the bus
    }


@pytest.mark.parametrize("throttled", [1, None])
def test_the_gateway_lowers_max_generating_while_the_box_throttles(tmp_path: Path, throttled: int | None) -> None:
    """The enforcer's status says the box throttles: the gateway's budget becomes max_generating_throttled and
    the event log says so; cooled, it goes back. A stack without max_generating_throttled keeps its budget."""
    policy = "[policy]\nmax_generating = 3\n" + (f"max_generating_throttled = {throttled}\n" if throttled else "")
    sv = FakeSupervisor(running=("a",))
    sched = scheduler(tmp_path, model("a", 50) + policy, sv)
    seen: list[tuple[int | None, list[tuple[str, dict[str, object]]]]] = []

    def say(throttling: str | None) -> None:
        doc = EnforcerStatus(time=time.time(), pid=1, pressure=0.1, events_error=None, events_moved_to=None,
                             models={}, heat_c=91.0, heat_sensor="amdgpu edge", throttling=throttling,
                             heat_source="hwmon")  # fmt: skip
        sched.run.status.write_text(dump(doc))

    async def body(s: Scheduler) -> None:
        for why in ("amdgpu edge at 91 °C (throttle_above 90 °C)", None):
            say(why)
            await s.sync.refresh()
            events = [(e.kind, e.detail) for e in s.events.since(0) if e.kind == "throttle"]
            seen.append((s.generation.capacity, events))

    running(sched, body)
    hot = {"throttling": "amdgpu edge at 91 °C (throttle_above 90 °C)", "max_generating": 1, "heat_c": 91.0}
    cool = {"throttling": None, "max_generating": 3, "heat_c": 91.0}
    if throttled:
        assert seen == [(1, [("throttle", hot)]), (3, [("throttle", hot), ("throttle", cool)])]
    else:
        assert seen == [(3, []), (3, [])]


def test_the_page_and_metrics_show_the_heat(tmp_path: Path) -> None:
    """/umemc/status's `heat` (which the page shows) and /metrics' gauges, from the enforcer's status; nothing of
    heat where the platform reports none."""
    from prometheus_client.core import Metric

    from umemc.runtime.gateway import metrics, views

    sched = scheduler(tmp_path, model("a", 50), FakeSupervisor(running=("a",)))
    found: dict[str, object] = {}

    def samples(s: Scheduler) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        families: list[Metric] = list(metrics._heat(s))
        return {(x.name, tuple(sorted(x.labels.items()))): x.value for f in families for x in f.samples}

    async def body(s: Scheduler) -> None:
        doc = EnforcerStatus(time=time.time(), pid=1, pressure=0.1, events_error=None, events_moved_to=None,
                             models={}, heat_c=91.0, heat_sensor="amdgpu edge", power_w=45.12,
                             throttling="amdgpu edge at 91 °C (throttle_above 90 °C)", heat_source="hwmon",
                             memory_busy=0.37)  # fmt: skip
        s.run.status.write_text(dump(doc))
        await s.sync.refresh()
        found["hot"] = (views.status(s)["heat"], samples(s))
        s.run.status.write_text(dump(doc.model_copy(update={"heat_c": None, "power_w": None, "throttling": None,
                                                             "heat_source": "none", "memory_busy": None})))  # fmt: skip
        await s.sync.refresh()
        found["none"] = (views.status(s)["heat"], samples(s))

    running(sched, body)
    assert found["hot"] == (
        {
            "celsius": 91.0,
            "sensor": "amdgpu edge",
            "watts": 45.12,
            "throttling": "amdgpu edge at 91 °C (throttle_above 90 °C)",
            "source": "hwmon",
            "memory_busy": 0.37,
        },
        {
            ("umemc_box_temperature_celsius", (("sensor", "amdgpu edge"),)): 91.0,
            ("umemc_box_power_watts", ()): 45.12,
            ("umemc_box_memory_busy_ratio", ()): 0.37,
            ("umemc_box_throttling", ()): 1.0,
        },
    )
    assert found["none"] == (None, {})


def test_umemc_status_says_the_heat() -> None:
    from rich.console import Console

    from umemc.commands.status import _machine_words

    machine = {"enforcement": "umemc's enforcer alone", "heat_c": 91.0, "heat_sensor": "amdgpu edge", "power_w": 45.12,
               "throttling": "amdgpu edge at 91 °C (throttle_above 90 °C)"}  # fmt: skip
    console = Console(width=200, record=True, color_system=None)
    console.print("machine" + _machine_words(machine))
    assert console.export_text() == (
        "machine, 91 °C (amdgpu edge), 45.12 W (throttling: amdgpu edge at 91 °C (throttle_above 90 °C))\n"
        "enforced by umemc's enforcer alone\n"
    )
    cool = machine | {"heat_c": None, "power_w": None, "throttling": None}
    assert _machine_words(cool) == "\nenforced by umemc's enforcer alone"
