"""Heat and power: what the platform reports, and whether the box throttles.

One memory bus feeds every model, and a unified-memory box that runs hot slows all of them at once: the stack's
generation budget (policy.max_generating) can be lowered while it throttles (policy.max_generating_throttled).

- Linux: hwmon (the kernel's Documentation/hwmon/sysfs-interface.rst): each /sys/class/hwmon/hwmonN has its
  driver's `name`, `tempK_input` in millidegrees Celsius with `tempK_label`, `tempK_max` and `tempK_crit` where the
  chip has them, and `power1_average` or `power1_input` in microwatts (amdgpu: the APU's package power). Only the
  chips that compute are read (COMPUTE_CHIPS: the GPU's and the CPU's drivers): a hot disk or network card slows
  its own device, not the memory bus. A sensor at or above its own max (else its crit) is the chip saying it is
  too hot.
- NVIDIA (discrete and unified): `nvidia-smi --query-gpu=temperature.gpu,power.draw,clocks_throttle_reasons.
  hw_thermal_slowdown,clocks_throttle_reasons.sw_thermal_slowdown,utilization.memory --format=csv,noheader,
  nounits`, one line per GPU (`nvidia-smi --help-query-gpu`): degrees, watts (`[N/A]` where the board does not
  measure it), `Active` or `Not Active` for each thermal slowdown (the driver's own word that it slows the GPU
  down for heat), and the share of the last sample period the memory was being read or written (%): the bus's
  activity.
- amdgpu's `gpu_metrics` (/sys/class/drm/cardN/device/gpu_metrics, a binary table the driver refreshes from the
  power firmware; its layouts are the kernel's drivers/gpu/drm/amd/include/kgd_pp_interface.h, little-endian, C
  alignment): a header of `structure_size` (u16), `format_revision` and `content_revision` (u8 each), then a layout
  that depends on both. The bus's share: the memory controller's activity (`average_umc_activity`, %) of the
  discrete GPUs' format 1 (at byte 30 in content 0, 18 in 1-3, 14 in 4-5); the bandwidth: the DRAM's read and write
  MB/s of the SMU 14 APUs' format 3.0 (`average_dram_reads` at byte 94, `average_dram_writes` at 96: after the
  header, two temperatures, 16 core temperatures, the skin temperature, two activities, 8 IPU and 16 core
  activities). Format 2 (the older APUs) has neither. 0xFFFF is the firmware's "not measured".
- Thermal zones (the kernel's Documentation/driver-api/thermal/sysfs-api.rst): /sys/class/thermal/thermal_zoneN
  with its `type` and `temp` (millidegrees), and trip points (`trip_point_K_type`, `_temp`): where a zone starts
  `passive` cooling is where the kernel slows the chip. Jetson reports its GPU and junction there (`gpu-thermal`,
  `tj-thermal`, `cpu-thermal`, `soc*-thermal`: laminair/jetson_stats_node_exporter#29, armbian/build#3747), not in
  hwmon.
- A reading no chip can have is not a reading: Jetson's GPU zone reads -256 °C while the GPU is power-gated
  (jetson_stats_node_exporter#29), the out-of-tree zenpower5 driver reports 149.8 °C and 0 °C for Strix Halo's CCDs
  (mattkeenan/zenpower5#10). Only 0 < t <= 125 °C counts (above every Tjmax of these chips); a sensor outside it is
  left out, never read as a box throttling for ever.
- macOS reports no temperature without root; its thermal pressure it does: NSProcessInfo's thermalState (nominal,
  fair, serious, critical: what macOS throttles by, no root). `pmset -g therm` prints `CPU_Speed_Limit = N` (%)
  only on Intel Macs; on Apple silicon it prints "No … has been recorded" lines and nothing else (exelban/stats#749,
  macmade/Hot#80). A limit below 100, or a thermal state of serious or worse, is macOS's own word that it slows the
  machine down.
- GB10's `utilization.memory` stays 0 whatever the load (mostlygeek/llama-swap#782): on nvidia-unified the memory
  bus is not measured, never read as idle.

`policy.throttle_above` (°C) makes any sensor at or above it count as throttling too, for chips that publish no
limit of their own."""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path
from typing import NamedTuple

from . import hostroot
from .tools import answer

HWMON = "/sys/class/hwmon"
DRM = "/sys/class/drm"
THERMAL = "/sys/class/thermal"
PLAUSIBLE_C = (0.0, 125.0)  # a reading outside (low, high] is a driver's garbage, not a temperature
# thermal zone types of the chips that share the memory bus (Jetson's, and ARM boards'); x86's acpitz and
# x86_pkg_temp are read through hwmon instead
ZONE_TYPES = re.compile(r"^(gpu|cpu|tj|soc\d*)[-_]?therm", re.I)
UNMEASURED = 0xFFFF
# format_revision 1 (discrete GPUs): where average_umc_activity (%) sits, by content_revision
UMC_ACTIVITY_AT = {0: 30, 1: 18, 2: 18, 3: 18, 4: 14, 5: 14}
DRAM_AT = 94  # format 3.0: average_dram_reads, then average_dram_writes (MB/s)
# hwmon drivers of the chips that share the memory bus: AMD's GPU and CPU (k10temp, or the out-of-tree zenpower),
# Intel's CPU, and the SoC thermal drivers of ARM boards
COMPUTE_CHIPS = frozenset({"amdgpu", "k10temp", "zenpower", "coretemp", "cpu_thermal", "soc_thermal"})
NVIDIA_QUERY = [
    "nvidia-smi",
    "--query-gpu=temperature.gpu,power.draw,clocks_throttle_reasons.hw_thermal_slowdown,"
    "clocks_throttle_reasons.sw_thermal_slowdown,utilization.memory",
    "--format=csv,noheader,nounits",
]


class Sensor(NamedTuple):
    name: str  # the chip and its label: "amdgpu edge", "k10temp Tctl", "nvidia gpu0"
    celsius: float
    limit: float | None  # the chip's own max (else crit), °C; None where it gives none


class Heat(NamedTuple):
    sensors: tuple[Sensor, ...]
    watts: float | None  # the package's or the GPUs' power draw, summed; None where nothing reports one
    driver_throttling: bool  # a driver says it slows down for heat (NVIDIA's thermal slowdown)
    source: str  # hwmon | nvidia-smi | hwmon+nvidia-smi | none
    memory_busy: float | None = None  # the memory bus's activity, 0-1, where a driver reports it (the busiest GPU)
    memory_gbps: float | None = None  # the DRAM's read + write bandwidth, GB/s, where the firmware reports it (APUs)
    cpu_speed_limit: int | None = None  # macOS's limit on the CPU's speed, % (pmset -g therm), where it set one
    thermal_state: str | None = None  # macOS's thermal pressure: nominal | fair | serious | critical

    @property
    def hottest(self) -> Sensor | None:
        return max(self.sensors, key=lambda s: s.celsius, default=None)

    def throttling(self, above: float | None = None) -> str | None:
        """Why the box counts as throttling now (None: it does not): the driver's word, a sensor at its own limit,
        or a sensor at or above the stack's `above` (°C)."""
        if self.driver_throttling:
            return "the GPU driver reports a thermal slowdown"
        if self.cpu_speed_limit is not None and self.cpu_speed_limit < 100:
            return f"macOS limits the CPU to {self.cpu_speed_limit}% of its speed (pmset -g therm)"
        if self.thermal_state in ("serious", "critical"):
            return f"macOS reports {self.thermal_state} thermal pressure"
        for s in self.sensors:
            if s.limit is not None and s.celsius >= s.limit:
                return f"{s.name} at {s.celsius:g} °C, its limit {s.limit:g} °C"
            if above is not None and s.celsius >= above:
                return f"{s.name} at {s.celsius:g} °C (throttle_above {above:g} °C)"
        return None


def plausible(celsius: float) -> bool:
    low, high = PLAUSIBLE_C
    return low < celsius <= high


def hwmon(root: str | None = None) -> tuple[list[Sensor], float | None]:
    """The temperatures and the power draw hwmon reports (nothing where it does not exist)."""
    sensors: list[Sensor] = []
    watts: float | None = None
    base = Path(root) if root is not None else hostroot.path(HWMON)
    try:
        chips = sorted(base.iterdir(), key=lambda p: p.name)
    except OSError:
        return [], None
    for chip in chips:
        name = _read(chip / "name") or chip.name
        if name not in COMPUTE_CHIPS:
            continue
        for entry in sorted(chip.glob("temp*_input")):
            index = entry.name[: -len("_input")]
            milli = _number(_read(entry))
            if milli is None:
                continue
            label = _read(chip / f"{index}_label") or index
            limit = _number(_read(chip / f"{index}_max"))
            if limit is None or limit <= 0:
                limit = _number(_read(chip / f"{index}_crit"))
            if plausible(milli / 1000):
                sensors.append(Sensor(f"{name} {label}", milli / 1000, limit / 1000 if limit and limit > 0 else None))
        micro = _number(_read(chip / "power1_average")) or _number(_read(chip / "power1_input"))
        if micro is not None:
            watts = (watts or 0.0) + micro / 1e6
    return sensors, watts


def thermal_zones(root: str | None = None) -> list[Sensor]:
    """The compute chips' thermal zones (ZONE_TYPES), each with the temperature where the kernel starts passive
    cooling as its limit (else its `hot`, else its `critical` trip)."""
    base = Path(root) if root is not None else hostroot.path(THERMAL)
    sensors = []
    for zone in sorted(base.glob("thermal_zone*"), key=lambda p: p.name):
        kind = _read(zone / "type") or ""
        milli = _number(_read(zone / "temp"))
        if not ZONE_TYPES.match(kind) or milli is None or not plausible(milli / 1000):
            continue
        trips: dict[str, float] = {}
        for trip in zone.glob("trip_point_*_type"):
            at = _number(_read(zone / trip.name.replace("_type", "_temp")))
            what = _read(trip) or ""
            if at is not None and at > 0:
                trips[what] = min(trips.get(what, at), at)
        limit = trips.get("passive") or trips.get("hot") or trips.get("critical")
        sensors.append(Sensor(f"thermal {kind}", milli / 1000, None if limit is None else limit / 1000))
    return sensors


class NvidiaReading(NamedTuple):
    sensors: list[Sensor]  # one per GPU
    watts: float | None  # summed
    slowing: bool  # any thermal slowdown
    memory_busy: float | None  # the busiest GPU's memory activity, 0-1


def parse_nvidia(text: str, bus_measured: bool = True) -> NvidiaReading:
    """nvidia-smi's lines for NVIDIA_QUERY. `bus_measured` False (a GB10) leaves utilization.memory out: it stays 0
    there whatever the load."""
    sensors: list[Sensor] = []
    watts: float | None = None
    busy: float | None = None
    slowing = False
    for i, line in enumerate(x for x in text.splitlines() if x.strip()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        temp, power, memory = _number(parts[0]), _number(parts[1]), _number(parts[4])
        if temp is not None and plausible(temp):
            sensors.append(Sensor(f"nvidia gpu{i}", temp, None))
        if power is not None:
            watts = (watts or 0.0) + power
        if memory is not None and bus_measured:
            busy = max(busy or 0.0, memory / 100)
        slowing = slowing or "Active" in (parts[2], parts[3])
    return NvidiaReading(sensors, watts, slowing, busy)


def nvidia(bus_measured: bool = True) -> NvidiaReading | None:
    text = answer(NVIDIA_QUERY)
    return None if text is None else parse_nvidia(text, bus_measured)


class AmdMemory(NamedTuple):
    busy: float | None  # the memory controller's activity, 0-1 (discrete GPUs)
    gbps: float | None  # the DRAM's read + write bandwidth, GB/s (the SMU 14 APUs)


def parse_gpu_metrics(data: bytes) -> AmdMemory:
    """What one gpu_metrics table says of the memory (nothing from a layout it does not carry it in, a table
    shorter than its layout, or a field the firmware left unmeasured)."""
    if len(data) < 4:
        return AmdMemory(None, None)
    size, form, content = struct.unpack_from("<HBB", data)
    data = data[: max(4, min(size, len(data)))]
    if form == 1 and content in UMC_ACTIVITY_AT and len(data) >= UMC_ACTIVITY_AT[content] + 2:
        (umc,) = struct.unpack_from("<H", data, UMC_ACTIVITY_AT[content])
        return AmdMemory(None if umc == UNMEASURED else min(umc, 100) / 100, None)
    if form == 3 and content == 0 and len(data) >= DRAM_AT + 4:
        reads, writes = struct.unpack_from("<HH", data, DRAM_AT)
        if UNMEASURED in (reads, writes):
            return AmdMemory(None, None)
        return AmdMemory(None, (reads + writes) / 1000)
    return AmdMemory(None, None)


def amdgpu(root: str | None = None) -> AmdMemory | None:
    """The memory figures of every amdgpu table (the busiest GPU's share, the bandwidths summed); None where no
    GPU publishes one."""
    seen: set[str] = set()
    busy: float | None = None
    gbps: float | None = None
    found = False
    for table in sorted((Path(root) if root is not None else hostroot.path(DRM)).glob("card*/device/gpu_metrics")):
        try:
            device = str(table.parent.resolve())
            if device in seen:
                continue
            seen.add(device)
            got = parse_gpu_metrics(table.read_bytes())
        except OSError:
            continue
        found = True
        if got.busy is not None:
            busy = max(busy or 0.0, got.busy)
        if got.gbps is not None:
            gbps = (gbps or 0.0) + got.gbps
    return AmdMemory(busy, gbps) if found else None


PMSET = ["pmset", "-g", "therm"]
_SPEED_LIMIT = re.compile(r"^\s*CPU_Speed_Limit\s*=\s*(\d+)\s*$", re.M)


def parse_pmset(text: str) -> int | None:
    """The CPU speed limit (%) `pmset -g therm` reports; None where it reports none."""
    found = _SPEED_LIMIT.findall(text)
    return int(found[-1]) if found else None


def macos_speed_limit() -> int | None:
    text = answer(PMSET)
    return None if text is None else parse_pmset(text)


def macos_thermal_state() -> str | None:
    """macOS's thermal pressure: NSProcessInfo's (a recorded Mac's facts.json)."""
    from .machine import facts

    if hostroot.recorded() is not None:
        state = facts().get("thermal_state")
        return state if isinstance(state, str) else None
    if sys.platform != "darwin":
        return None  # the darwin probes fed from fixtures (tests) on another OS
    from .darwin import thermal_state  # pragma: no cover - macOS only

    return thermal_state()  # pragma: no cover


def read(kind: str, platform: str, root: str | None = None, drm: str | None = None) -> Heat:
    """The box's heat now: hwmon, thermal zones and amdgpu's gpu_metrics on Linux, nvidia-smi on an NVIDIA kind;
    macOS's thermal pressure and speed limit on a Mac."""
    sensors: list[Sensor] = []
    watts: float | None = None
    slowing = False
    busy: float | None = None
    gbps: float | None = None
    sources = []
    if platform.startswith("linux"):
        sensors, watts = hwmon(root)
        if sensors or watts is not None:
            sources.append("hwmon")
        zones = thermal_zones(None if root is None else str(Path(root).parent / "thermal"))
        if zones:
            sensors += zones
            sources.append("thermal zones")
        amd = amdgpu(drm)
        if amd is not None and (amd.busy is not None or amd.gbps is not None):
            busy, gbps = amd.busy, amd.gbps
            sources.append("gpu_metrics")
    if kind in ("nvidia-unified", "nvidia-discrete"):
        got = nvidia(bus_measured=kind != "nvidia-unified")
        if got is not None:
            sensors += got.sensors
            if got.watts is not None:
                watts = got.watts if watts is None else watts + got.watts
            slowing = got.slowing
            if got.memory_busy is not None:
                busy = max(busy or 0.0, got.memory_busy)
            sources.append("nvidia-smi")
    limit = macos_speed_limit() if platform == "darwin" else None
    if limit is not None:
        sources.append("pmset")
    state = macos_thermal_state() if platform == "darwin" else None
    if state is not None:
        sources.append("thermal state")
    rounded = None if watts is None else round(watts, 2)
    return Heat(tuple(sensors), rounded, slowing, "+".join(sources) or "none", busy, gbps, limit, state)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", garbage
