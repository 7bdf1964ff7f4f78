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
- macOS reports no temperature without root; none is read there.

`policy.throttle_above` (°C) makes any sensor at or above it count as throttling too, for chips that publish no
limit of their own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

HWMON = "/sys/class/hwmon"
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

    @property
    def hottest(self) -> Sensor | None:
        return max(self.sensors, key=lambda s: s.celsius, default=None)

    def throttling(self, above: float | None = None) -> str | None:
        """Why the box counts as throttling now (None: it does not): the driver's word, a sensor at its own limit,
        or a sensor at or above the stack's `above` (°C)."""
        if self.driver_throttling:
            return "the GPU driver reports a thermal slowdown"
        for s in self.sensors:
            if s.limit is not None and s.celsius >= s.limit:
                return f"{s.name} at {s.celsius:g} °C, its limit {s.limit:g} °C"
            if above is not None and s.celsius >= above:
                return f"{s.name} at {s.celsius:g} °C (throttle_above {above:g} °C)"
        return None


def hwmon(root: str = HWMON) -> tuple[list[Sensor], float | None]:
    """The temperatures and the power draw hwmon reports (nothing where it does not exist)."""
    sensors: list[Sensor] = []
    watts: float | None = None
    base = Path(root)
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
            sensors.append(Sensor(f"{name} {label}", milli / 1000, limit / 1000 if limit and limit > 0 else None))
        micro = _number(_read(chip / "power1_average")) or _number(_read(chip / "power1_input"))
        if micro is not None:
            watts = (watts or 0.0) + micro / 1e6
    return sensors, watts


class NvidiaReading(NamedTuple):
    sensors: list[Sensor]  # one per GPU
    watts: float | None  # summed
    slowing: bool  # any thermal slowdown
    memory_busy: float | None  # the busiest GPU's memory activity, 0-1


def parse_nvidia(text: str) -> NvidiaReading:
    """nvidia-smi's lines for NVIDIA_QUERY."""
    sensors: list[Sensor] = []
    watts: float | None = None
    busy: float | None = None
    slowing = False
    for i, line in enumerate(x for x in text.splitlines() if x.strip()):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        temp, power, memory = _number(parts[0]), _number(parts[1]), _number(parts[4])
        if temp is not None:
            sensors.append(Sensor(f"nvidia gpu{i}", temp, None))
        if power is not None:
            watts = (watts or 0.0) + power
        if memory is not None:
            busy = max(busy or 0.0, memory / 100)
        slowing = slowing or "Active" in (parts[2], parts[3])
    return NvidiaReading(sensors, watts, slowing, busy)


def nvidia() -> NvidiaReading | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(NVIDIA_QUERY, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia(done.stdout) if done.returncode == 0 else None


def read(kind: str, platform: str, root: str = HWMON) -> Heat:
    """The box's heat now: hwmon on Linux, nvidia-smi on an NVIDIA kind; nothing on macOS."""
    sensors: list[Sensor] = []
    watts: float | None = None
    slowing = False
    busy: float | None = None
    sources = []
    if platform.startswith("linux"):
        sensors, watts = hwmon(root)
        if sensors or watts is not None:
            sources.append("hwmon")
    if kind in ("nvidia-unified", "nvidia-discrete"):
        got = nvidia()
        if got is not None:
            sensors += got.sensors
            if got.watts is not None:
                watts = got.watts if watts is None else watts + got.watts
            slowing, busy = got.slowing, got.memory_busy
            sources.append("nvidia-smi")
    rounded = None if watts is None else round(watts, 2)
    return Heat(tuple(sensors), rounded, slowing, "+".join(sources) or "none", busy)


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
