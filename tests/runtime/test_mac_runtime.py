"""`umemc up` with the code a Mac runs: the enforcer samples real workers through macOS's probes (each process's
proc_pid_rusage answer packed from what it really holds, the machine's sysctl and vm_stat from fixture files in
their exact formats, rewritten by the test to change the machine: umemc.testing.mac_probes), with userspace
enforcement only (no cgroups), and without a parent-death signal: a reaper stops the run when supervisord dies.
The quota rules, pressure guard, swap watch and events are the same code as on Linux."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.conftest import patience_now
from tests.runtime.conftest import free_port, live_sysctl_table, worker
from tests.runtime.test_enforcement import HARD, last_logged
from umemc.runtime.probes.host import marked_processes
from umemc.runtime.rundir import run_mark

pytestmark = pytest.mark.slow

MiB = 1 << 20
GiB = 1 << 30
PAGE = 16384
# an 8 GiB Mac: 80% free as jetsam sees it, the kernel's pressure level normal, 100 MiB in swap
SYSCTL = """hw.memsize: 8589934592
hw.pagesize: 16384
kern.memorystatus_level: 80
kern.memorystatus_vm_pressure_level: {level}
vm.swapusage: total = 2048.00M  used = {swap:.2f}M  free = {free:.2f}M  (encrypted)
iogpu.wired_limit_mb: 0
"""
# 6 GiB available: (free + speculative + inactive) pages of 16 KiB
VM_STAT = f"""Mach Virtual Memory Statistics: (page size of {PAGE} bytes)
Pages free:                              100000.
Pages active:                            100000.
Pages inactive:                          293216.
Pages speculative:                            0.
Pages throttled:                              0.
Pages wired down:                         50000.
Pages purgeable:                              0.
"Translation faults":                  12345678.
Pages copy-on-write:                     123456.
Pages zero filled:                      1234567.
Pages reactivated:                            0.
Pages purged:                                 0.
File-backed pages:                        50000.
Anonymous pages:                         150000.
Pages stored in compressor:                   0.
Pages occupied by compressor:                 0.
Decompressions:                               0.
Compressions:                                 0.
Pageins:                                   1234.
Pageouts:                                     0.
Swapins:                                      0.
Swapouts:                                     0.
"""


def machine(folder: Path, level: int = 1, swap_mib: float = 100.0) -> None:
    """Rewrite the fixture Mac (atomically: the enforcer reads it at every sample)."""
    for name, text in (
        ("sysctl.txt", SYSCTL.format(level=level, swap=swap_mib, free=2048 - swap_mib)),
        ("vm_stat.txt", VM_STAT),
    ):
        tmp = folder / f".{name}"
        tmp.write_text(text)
        tmp.replace(folder / name)


@pytest.fixture
def mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "darwin"
    folder.mkdir()
    machine(folder)
    monkeypatch.setenv("UMEMC_PROBES", "umemc.testing.mac_probes:probes")
    monkeypatch.setenv("UMEMC_DARWIN_FIXTURES", str(folder))
    monkeypatch.setenv("UMEMC_PARENT_DEATH", "reaper")
    return folder


def stack_text(name: str) -> str:
    return (
        f'version = 1\nname = "{name}"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\nos_reserve = "1GiB"\n'
        '[policy]\nsample_interval = "100ms"\nkernel_enforcement = "off"\nmax_kills = 2\nkill_window = "120s"\n'
        + live_sysctl_table()
        + worker("steady-a", "steady.py", "{port}", 30, memory="100MiB", priority=80, port=free_port())
        + worker("steady-b", "steady.py", "{port}", 20, memory="100MiB", priority=70, port=free_port())
    )


def test_the_macos_enforcer_kills_watches_pressure_and_swap(stack, mac: Path) -> None:
    r = stack(stack_text("mac") + worker("leaker", "leaker.py", 1024, 8, memory="270MiB", priority=10, mode="cold"))
    from umemc.commands.status import collect

    status = r.wait_for(lambda: (s := collect(str(r.run_dir)))["_machine"] and s, what="the enforcer's first status")
    assert {k: status["_machine"][k] for k in ("platform", "memory_figure", "pressure_level", "swap_used_bytes")} == {
        "platform": "darwin",
        "memory_figure": "phys_footprint",
        "pressure_level": "normal",
        "swap_used_bytes": 100 * MiB,
    }
    assert status["_machine"]["enforcement"] == (
        "umemc's enforcer alone (macOS has no memory cgroups), by each worker's phys_footprint"
    )
    r.wait_for(lambda: collect(str(r.run_dir))["models"]["steady-a"]["_enforced_by"] == "enforcer", what="sampling")

    # a worker over its hard quota: killed by the enforcer reading footprints, restarted, killed, left stopped
    from umemc.runtime.supervisor import Supervisor

    Supervisor(r.run_dir / "state" / "supervisor.sock").start("leaker")
    r.wait_for(lambda: r.events("give_up", "leaker"), timeout=60, what="the enforcer to give up on the leaker")
    kills = r.events("hard_limit_kill", "leaker")
    assert [k["detail"]["by"] for k in kills] == ["enforcer", "enforcer"]
    assert all(k["detail"]["usage_bytes"] > HARD == k["detail"]["hard_bytes"] for k in kills)
    # within one sampling period of crossing (100 ms at 1 GiB/s, and one 8 MiB step), the period as long as this
    # machine's load stretches it (the enforcer must be given the CPU to look; bench/enforce.py measures it idle)
    bound = 1024 * MiB * 0.1 * patience_now(1) + 8 * MiB
    peaks = last_logged(r.log_lines("leaker"), "rss")
    assert peaks and all(peak - HARD <= bound for peak in peaks), [(p - HARD) / MiB for p in peaks]

    # swap grown by 1 GiB since the enforcer started (threshold: 256 MiB): the machine swaps
    machine(mac, swap_mib=100 + 1024)
    swapping = r.wait_for(lambda: r.events("swapping"), what="the swap event")
    assert [(e["model"], e["detail"]) for e in swapping] == [
        (None, {"swap_used_bytes": 1124 * MiB, "grown_bytes": 1024 * MiB, "level": "normal"})
    ]

    # the kernel says critical: the pressure guard evicts the lowest priority first (through the gateway)
    machine(mac, level=4, swap_mib=100 + 1024)
    evicted = r.wait_for(lambda: r.events("evict"), what="an eviction for pressure")
    machine(mac, level=1, swap_mib=100 + 1024)
    assert evicted[0]["model"] == "steady-b" and evicted[0]["detail"]["reason"] == "pressure"
    assert evicted[0]["detail"]["pressure"] == 1.0


def test_the_reaper_stops_the_run_when_supervisord_is_killed(stack, mac: Path) -> None:
    """No parent-death signal (macOS): kill -9 of supervisord, and the reaper its wrapper started stops the workers,
    the enforcer and the gateway by the run's mark, says so in the event log and ends; `down` then finds nothing."""
    r = stack(stack_text("reap"))
    mark = run_mark(r.run_dir / "state")
    names = ("steady-a", "steady-b", "umemc-enforcer", "umemc-gateway", "umemc-supervisord")
    pids = r.wait_for(lambda: all((r.run_dir / "state/pids" / n).exists() for n in names) and records(r, names))
    sv = pids["umemc-supervisord"]
    reaper = [c.pid for c in psutil.Process(sv).children() if "umemc.runtime.reaper" in " ".join(c.cmdline())]
    assert len(reaper) == 1  # started by supervisord's wrapper before its exec, so supervisord's child
    # the reaper carries the run's mark too (`down` stops it with the rest), named umemc-reaper
    marked = dict(marked_processes(mark))
    assert sorted(marked) == sorted([*pids.values(), reaper[0]]) and marked[reaper[0]] == "umemc-reaper"
    os.kill(sv, signal.SIGKILL)
    r.wait_for(lambda: not marked_processes(mark), timeout=20, what="the reaper to stop the run")
    reaped = r.wait_for(lambda: r.events("reaped"), what="the reaped event")
    assert reaped[0]["detail"]["supervisord_pid"] == sv
    # the workers at least (a program writing to its dead supervisord's pipe may end on its own first)
    workers = {pids["steady-a"], pids["steady-b"]}
    assert workers <= set(reaped[0]["detail"]["pids"]) <= set(pids.values()) - {sv}
    r.wait_for(lambda: not psutil.pid_exists(reaper[0]) or psutil.Process(reaper[0]).status() == "zombie")


def records(r, names: tuple[str, ...]) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {n: int((r.run_dir / "state/pids" / n).read_text().split()[0]) for n in names}
