"""macOS's probes on fixture outputs in the exact formats of the real commands and calls (no Mac runs here):

- `sysctl NAME…` prints one `name: value` line per variable (sysctl(8), macOS 14); `vm.swapusage` is formatted
  from struct xsw_usage as `total = …M  used = …M  free = …M  (encrypted)`;
- `vm_stat` prints `Mach Virtual Memory Statistics: (page size of N bytes)` and `Label:   N.` lines, its "Pages
  free" without the speculative pages (vm_stat.c prints free_count - speculative_count);
- `memory_pressure` ends with `System-wide memory free percentage: N%`;
- proc_pid_rusage(pid, RUSAGE_INFO_V0, buf) fills `struct rusage_info_v0` of <sys/resource.h>: a 16-byte uuid,
  then ten uint64 fields (user, system time, idle and interrupt wakeups, pageins, wired, resident,
  phys_footprint, start and exit abstime), packed here field by field at their offsets;
- ggml-metal logs `recommendedMaxWorkingSetSize  = %8.2f MB` with the size / 1e6.
"""

from __future__ import annotations

import pytest

from umemc.runtime.llamalog import metal_working_set
from umemc.runtime.probes.darwin import (
    DarwinBox,
    DarwinProcesses,
    SysctlText,
    VmFigures,
    default_wired_limit,
    parse_memory_pressure,
    parse_rusage_v0,
    parse_swapusage,
    parse_sysctl,
    parse_vm_stat,
    vm_figures,
)
from umemc.runtime.probes.swap import Swap

GiB = 1 << 30
MiB = 1 << 20

SYSCTL = """hw.memsize: 137438953472
hw.pagesize: 16384
kern.memorystatus_level: 62
kern.memorystatus_vm_pressure_level: 1
vm.swapusage: total = 2048.00M  used = 1066.25M  free = 981.75M  (encrypted)
iogpu.wired_limit_mb: 0
"""

VM_STAT = """Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                                9000.
Pages active:                           2000000.
Pages inactive:                         1500000.
Pages speculative:                         1000.
Pages throttled:                              0.
Pages wired down:                       3000000.
Pages purgeable:                          12000.
"Translation faults":                 987654321.
Pages copy-on-write:                   12345678.
Pages zero filled:                    123456789.
Pages reactivated:                       123456.
Pages purged:                             12345.
File-backed pages:                       800000.
Anonymous pages:                        2700000.
Pages stored in compressor:              400000.
Pages occupied by compressor:            100000.
Decompressions:                          234567.
Compressions:                            345678.
Pageins:                                 456789.
Pageouts:                                  1234.
Swapins:                                      0.
Swapouts:                                     0.
"""

MEMORY_PRESSURE = """The system has 137438953472 (8388608 pages with a page size of 16384).

Stats:
Pages free: 9000
Pages purgeable: 12000
Pages purged: 12345

Swap I/O:
Swapins: 0
Swapouts: 0

Page Q counts:
Pages active: 2000000
Pages inactive: 1500000
Pages speculative: 1000
Pages throttled: 0
Pages wired down: 3000000

Compressor Stats:
Pages used by compressor: 100000
Pages decompressed: 234567
Pages compressed: 345678

File I/O:
Pageins: 456789
Pageouts: 1234

System-wide memory free percentage: 62%
"""


def rusage_v0(resident: int, footprint: int, wired: int = 0) -> bytes:
    """struct rusage_info_v0 laid out by hand: uuid[16] at 0, then uint64 fields at 16 + 8 * index."""
    fields = [111, 222, 0, 0, 7, wired, resident, footprint, 123456789, 0]
    return bytes(range(16)) + b"".join(v.to_bytes(8, "little") for v in fields)


def test_sysctl_output() -> None:
    values = parse_sysctl(SYSCTL)
    assert values["kern.memorystatus_level"] == "62" and values["hw.memsize"] == "137438953472"
    assert parse_swapusage(values["vm.swapusage"]) == Swap(2048 * MiB, round(1066.25 * MiB))
    assert parse_swapusage("total = 0.00M  used = 0.00M  free = 0.00M") == Swap(0, 0)
    assert parse_swapusage("nonsense") is None


def test_vm_stat_output() -> None:
    stat = parse_vm_stat(VM_STAT)
    assert (stat["page size"], stat["Pages wired down"], stat["Translation faults"]) == (16384, 3000000, 987654321)
    # free + speculative + inactive pages, and the wired ones, in bytes
    assert vm_figures(stat) == VmFigures((9000 + 1000 + 1500000) * 16384, 3000000 * 16384)


def test_memory_pressure_output() -> None:
    assert parse_memory_pressure(MEMORY_PRESSURE) == 62
    assert parse_memory_pressure("The system has 1 (1 pages with a page size of 16384).\n") is None


def test_rusage_struct() -> None:
    u = parse_rusage_v0(rusage_v0(resident=3 * GiB, footprint=5 * GiB, wired=1 * GiB))
    assert (u.user_time, u.system_time, u.wired, u.resident, u.footprint, u.start_abstime) == (
        111,
        222,
        1 * GiB,
        3 * GiB,
        5 * GiB,
        123456789,
    )
    assert len(rusage_v0(0, 0)) == 96  # sizeof(struct rusage_info_v0)


def test_a_process_holds_the_larger_of_footprint_and_resident() -> None:
    """Metal buffers and compressed pages are in the footprint (jetsam's figure); mmap'd weights only in the resident
    size: the larger is what the quotas hold a worker to."""
    answers = {10: rusage_v0(resident=2 * GiB, footprint=9 * GiB), 11: rusage_v0(resident=6 * GiB, footprint=1 * GiB)}
    procs = DarwinProcesses(answers.get)
    assert (procs.memory(10), procs.memory(11), procs.memory(12)) == (9 * GiB, 6 * GiB, 0)
    assert procs.memory_figure == "phys_footprint"


def box(sysctl: str, vm: str = VM_STAT, window: int | None = 96 * GiB) -> DarwinBox:
    return DarwinBox(SysctlText(lambda: sysctl), lambda: vm_figures(parse_vm_stat(vm)), window, evict_above=0.9)


def test_the_machine_from_sysctl_and_vm_stat() -> None:
    b = box(SYSCTL)
    usable = 120 * GiB
    assert b.available() == (9000 + 1000 + 1500000) * 16384
    assert b.swap() == Swap(2048 * MiB, round(1066.25 * MiB))
    assert b.level() == "normal"
    # 62% of 128 GiB free as jetsam counts it, against 120 GiB usable
    assert b.os_pressure(usable) == pytest.approx(1 - 0.62 * 128 / 120)
    assert b.gpu_share() == pytest.approx(3000000 * 16384 / (96 * GiB))
    assert b.wired_limit() == 0
    warn = box(SYSCTL.replace("pressure_level: 1", "pressure_level: 2"))
    assert (warn.level(), warn.os_pressure(usable)) == ("warn", 0.9)  # no cold start, nothing evicted yet
    critical = box(SYSCTL.replace("pressure_level: 1", "pressure_level: 4"))
    assert (critical.level(), critical.os_pressure(usable)) == ("critical", 1.0)
    bare = box("hw.memsize: 137438953472\n", window=None)
    assert (bare.level(), bare.os_pressure(usable), bare.swap(), bare.gpu_share(), bare.wired_limit()) == (
        None,
        0.0,
        None,
        0.0,
        None,
    )


def test_default_wired_limit() -> None:
    # iogpu.wired_limit_mb = 0, as measured Macs report it: 107.52 GiB at 128 GiB (0.84, antirez/ds4#893), 3/4 at
    # 96 GiB (ggml-org/llama.cpp#3213), 2/3 at 32 GiB (ollama/ollama#434)
    got = default_wired_limit(128 * GiB), default_wired_limit(96 * GiB), default_wired_limit(32 * GiB)
    assert got == (128 * GiB * 21 // 25, 72 * GiB, 32 * GiB * 2 // 3)
    assert round(got[0] / GiB, 2) == 107.52


def test_metal_working_set_from_a_llama_log() -> None:
    log = (
        "ggml_metal_device_init: GPU name:   Apple M4 Max\n"
        "ggml_metal_device_init: has unified memory    = true\n"
        "ggml_metal_device_init: recommendedMaxWorkingSetSize  = 103079.22 MB\n"
        "llama_model_load_from_file_impl: using device Metal (Apple M4 Max) (unknown id) - 98303 MiB free\n"
    )
    assert metal_working_set(log) == 103079220000
    assert metal_working_set("main: load the model\n") is None
