"""Heat and power behind the generation budget: hwmon read from a fixture tree in the kernel's sysfs format
(Documentation/hwmon/sysfs-interface.rst: tempN_input, _max, _crit in millidegrees Celsius, tempN_label,
power1_average in microwatts, the chip's `name`), nvidia-smi's --query-gpu lines in its csv format (`nvidia-smi
--help-query-gpu`: `[N/A]` where the board cannot say, `Active` / `Not Active` for a throttle reason); the
enforcer's status saying it, and the gateway lowering max_generating while the box throttles and raising it after."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import msgspec
import pytest

from tests.runtime.test_enforcer_loop import Loop
from tests.runtime.test_scheduler import FakeSupervisor, model, running, scheduler
from umemc.contract import EnforcerStatus, dump
from umemc.runtime.gateway.generation import GenerationBudget
from umemc.runtime.gateway.scheduler import Scheduler
from umemc.runtime.probes.heat import AmdMemory, Heat, Sensor, hwmon, parse_gpu_metrics, parse_nvidia, read

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
    keys = ("heat_c", "heat_sensor", "power_w", "throttling", "heat_source", "memory_busy", "memory_gbps")
    assert {k: doc[k] for k in keys} == {
        "heat_c": 71.25,
        "heat_sensor": "k10temp Tctl",
        "power_w": 45.12,
        "throttling": "k10temp Tctl at 71.25 °C (throttle_above 70 °C)",
        "heat_source": "hwmon",
        "memory_busy": None,  # hwmon says nothing of the bus
        "memory_gbps": None,
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
                             memory_busy=0.37, memory_gbps=61.44, psi_some=0.125, psi_full=0.03)  # fmt: skip
        s.run.status.write_text(dump(doc))
        await s.sync.refresh()
        found["hot"] = (views.status(s)["heat"], samples(s))
        found["psi"] = views.status(s)["psi"]
        cool = msgspec.structs.replace(doc, heat_c=None, power_w=None, throttling=None, heat_source="none",
                                       memory_busy=None, memory_gbps=None, psi_some=None, psi_full=None)  # fmt: skip
        s.run.status.write_text(dump(cool))
        await s.sync.refresh()
        found["none"] = (views.status(s)["heat"], samples(s))
        found["no psi"] = views.status(s)["psi"]

    running(sched, body)
    assert found["hot"] == (
        {
            "celsius": 91.0,
            "sensor": "amdgpu edge",
            "watts": 45.12,
            "throttling": "amdgpu edge at 91 °C (throttle_above 90 °C)",
            "source": "hwmon",
            "memory_busy": 0.37,
            "memory_gbps": 61.44,
            "thermal_state": None,
        },
        {
            ("umemc_box_memory_stall_ratio", (("tasks", "some"),)): 0.125,
            ("umemc_box_memory_stall_ratio", (("tasks", "full"),)): 0.03,
            ("umemc_box_temperature_celsius", (("sensor", "amdgpu edge"),)): 91.0,
            ("umemc_box_power_watts", ()): 45.12,
            ("umemc_box_memory_busy_ratio", ()): 0.37,
            ("umemc_box_memory_bandwidth_bytes_per_second", ()): 61.44e9,
            ("umemc_box_throttling", ()): 1.0,
        },
    )
    assert found["none"] == (None, {})
    assert (found["psi"], found["no psi"]) == ({"some": 0.125, "full": 0.03}, None)


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


# amdgpu's gpu_metrics tables, packed field by field in the order and C alignment of the kernel's
# drivers/gpu/drm/amd/include/kgd_pp_interface.h (little-endian; the header is structure_size, format_revision,
# content_revision): the offsets come from the packing here, not from the reader's constants.
def header(size: int, form: int, content: int) -> bytes:
    return struct.pack("<HBB", size, form, content)


def metrics_v1_3(umc: int) -> bytes:
    """gpu_metrics_v1_3 (discrete GPUs): 6 temperatures, then gfx, umc and mm activity, ..."""
    body = struct.pack("<6H", 45, 60, 50, 40, 41, 42) + struct.pack("<3H", 80, umc, 0) + struct.pack("<H", 150)
    body += b"\0" * 2 + struct.pack("<QQ", 123, 456)  # padding to the u64 energy_accumulator, the timestamp
    return header(4 + len(body) + 64, 1, 3) + body + b"\0" * 64  # the rest of the table (clocks, ...)


def metrics_v1_0(umc: int) -> bytes:
    """gpu_metrics_v1_0: the u64 timestamp first (4 bytes of padding before it), then the temperatures."""
    body = (
        b"\0" * 4 + struct.pack("<Q", 1) + struct.pack("<6H", 45, 60, 50, 40, 41, 42) + struct.pack("<3H", 80, umc, 0)
    )
    return header(4 + len(body) + 40, 1, 0) + body + b"\0" * 40


def metrics_v1_5(umc: int) -> bytes:
    """gpu_metrics_v1_5: hotspot, mem, vrsoc temperatures, the socket power, gfx and umc activity, ..."""
    body = struct.pack("<3H", 70, 60, 50) + struct.pack("<H", 500) + struct.pack("<2H", 90, umc) + b"\0" * 80
    return header(4 + len(body), 1, 5) + body


def metrics_v3_0(reads: int, writes: int) -> bytes:
    """gpu_metrics_v3_0 (the SMU 14 APUs): gfx and soc temperatures, 16 core temperatures, the skin temperature,
    gfx and vcn activity, 8 IPU and 16 core activities, then the DRAM's reads and writes (MB/s), ..."""
    body = struct.pack("<2H", 5500, 5200) + struct.pack("<16H", *range(16)) + struct.pack("<H", 4000)
    body += struct.pack("<2H", 95, 0) + struct.pack("<8H", *[0] * 8) + struct.pack("<16H", *[50] * 16)
    body += struct.pack("<2H", reads, writes) + struct.pack("<2H", 0, 0) + b"\0" * 4 + struct.pack("<Q", 7)
    return header(4 + len(body) + 120, 3, 0) + body + b"\0" * 120


def test_gpu_metrics_tables_say_the_memory_by_their_revision() -> None:
    assert parse_gpu_metrics(metrics_v1_3(37)) == AmdMemory(0.37, None)
    assert parse_gpu_metrics(metrics_v1_0(12)) == AmdMemory(0.12, None)
    assert parse_gpu_metrics(metrics_v1_5(88)) == AmdMemory(0.88, None)
    assert parse_gpu_metrics(metrics_v3_0(41000, 20440)) == AmdMemory(None, 61.44)
    # not measured, a layout without it (format 2: the older APUs), a table cut short, an unknown revision
    assert parse_gpu_metrics(metrics_v1_3(0xFFFF)) == AmdMemory(None, None)
    assert parse_gpu_metrics(metrics_v3_0(0xFFFF, 10)) == AmdMemory(None, None)
    assert parse_gpu_metrics(header(120, 2, 2) + b"\x01" * 116) == AmdMemory(None, None)
    assert parse_gpu_metrics(metrics_v3_0(41000, 20440)[:90]) == AmdMemory(None, None)
    assert parse_gpu_metrics(header(200, 3, 1) + b"\x01" * 196) == AmdMemory(None, None)
    assert parse_gpu_metrics(b"\x01") == AmdMemory(None, None)


def test_heat_reads_every_gpu_table_once(tmp_path: Path) -> None:
    """/sys/class/drm/cardN/device is a link to the PCI device: card0 and its render node's alias are one GPU."""
    drm = tmp_path / "drm"
    for name, table in (("0000:c1:00.0", metrics_v3_0(41000, 20440)), ("0000:03:00.0", metrics_v1_3(37))):
        device = tmp_path / "devices" / name
        device.mkdir(parents=True)
        (device / "gpu_metrics").write_bytes(table)
    (drm).mkdir()
    (drm / "card0").mkdir()
    (drm / "card0" / "device").symlink_to(tmp_path / "devices" / "0000:c1:00.0")
    (drm / "card1").mkdir()
    (drm / "card1" / "device").symlink_to(tmp_path / "devices" / "0000:03:00.0")
    (drm / "card2").mkdir()
    (drm / "card2" / "device").symlink_to(tmp_path / "devices" / "0000:c1:00.0")  # the same GPU again
    got = read("amd-apu", "linux", root=str(tmp_path / "no-hwmon"), drm=str(drm))
    assert (got.memory_busy, got.memory_gbps, got.source) == (0.37, 61.44, "gpu_metrics")
    assert read("amd-apu", "linux", root=str(tmp_path / "no-hwmon"), drm=str(tmp_path / "none")).source == "none"


# `pmset -g therm` as macOS prints it, quoted from a Mac that limited its CPU (macOS 10.13, a question on
# apple.stackexchange.com, "Where does the pmset CPU_Speed_Limit variable come from"), its spacing as quoted
PMSET_LIMITED = """Note: No thermal warning level has been recorded
Note: No performance warning level has been recorded
2020-11-24 13:10:40 +0100 CPU Power notify
    CPU_Scheduler_Limit     = 100
    CPU_Available_CPUs  = 8
    CPU_Speed_Limit     = 35
"""
PMSET_NOTHING = (
    "Note: No thermal warning level has been recorded\nNote: No performance warning level has been recorded\n"
)


def test_macos_says_it_limits_the_cpu() -> None:
    from umemc.runtime.probes.heat import parse_pmset

    assert (parse_pmset(PMSET_LIMITED), parse_pmset(PMSET_NOTHING)) == (35, None)
    limited = Heat((), None, False, "pmset", cpu_speed_limit=35)
    assert limited.throttling() == "macOS limits the CPU to 35% of its speed (pmset -g therm)"
    assert Heat((), None, False, "pmset", cpu_speed_limit=100).throttling() is None


def test_a_platform_tool_answers_only_when_it_succeeds(tmp_path: Path) -> None:
    from umemc.runtime.probes.tools import answer

    tool = tmp_path / "tool"
    tool.write_text('#!/bin/sh\necho "CPU_Speed_Limit = 70"\nexit "$1"\n')
    tool.chmod(0o755)
    assert answer([str(tool), "0"]) == "CPU_Speed_Limit = 70\n"
    assert answer([str(tool), "3"]) is None  # failed: what it printed is no answer
    assert answer([str(tmp_path / "absent")]) is None
