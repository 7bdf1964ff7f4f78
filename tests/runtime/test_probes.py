"""Probes against fixture trees in the exact format of the real interfaces (GPU driver files cannot
exist here), and against real processes where they can."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from umemc.runtime.enforcer.rules import trend as _trend
from umemc.runtime.event_log import EventLog
from umemc.runtime.probes.drm import DrmProbe, parse_fdinfo
from umemc.runtime.probes.host import LinuxBox, gtt_used_share, marked_processes, tree_memory
from umemc.runtime.probes.proc import LinuxProcesses
from umemc.runtime.probes.psproc import PsutilProcesses
from umemc.runtime.probes.swap import Swap

# An amdgpu DRM client's fdinfo, as specified in the kernel's Documentation/gpu/drm-usage-stats.rst
# (keys drm-driver, drm-pdev, drm-client-id, drm-memory-<region> in KiB) and printed by amdgpu_fdinfo.c.
AMDGPU_FDINFO = """pos:\t0
flags:\t02100002
mnt_id:\t25
ino:\t1090
drm-driver:\tamdgpu
drm-pdev:\t0000:c5:00.0
drm-client-id:\t{client}
pasid:\t32770
drm-memory-vram:\t{vram} KiB
drm-memory-gtt: \t{gtt} KiB
drm-memory-cpu: \t0 KiB
amd-memory-visible-vram:\t0 KiB
drm-engine-gfx:\t1234567 ns
drm-engine-compute:\t0 ns
"""


def fake_process(root: Path, pid: int, fds: dict[int, tuple[str, str]]) -> None:
    """/proc/PID/fd/N -> target, /proc/PID/fdinfo/N <- text."""
    (root / str(pid) / "fd").mkdir(parents=True)
    (root / str(pid) / "fdinfo").mkdir()
    for fd, (target, info) in fds.items():
        os.symlink(target, root / str(pid) / "fd" / str(fd))
        (root / str(pid) / "fdinfo" / str(fd)).write_text(info)


def test_parse_fdinfo() -> None:
    client, mem = parse_fdinfo(AMDGPU_FDINFO.format(client=7, vram=1024, gtt=2048))
    assert client == ("0000:c5:00.0", "7") and mem == {"vram": 1048576, "gtt": 2097152, "cpu": 0}
    assert parse_fdinfo("pos:\t0\nflags:\t02\n") == (None, {})


def test_drm_dedupes_clients_and_ignores_other_files(tmp_path: Path) -> None:
    same = AMDGPU_FDINFO.format(client=7, vram=512, gtt=3 * 1024 * 1024)
    fake_process(
        tmp_path,
        100,
        {
            3: ("/dev/dri/renderD128", same),
            4: ("/dev/dri/renderD128", same),  # a second fd of the same client
            5: ("/dev/dri/card1", AMDGPU_FDINFO.format(client=8, vram=0, gtt=1024)),
            6: ("/work/model.gguf", "pos:\t0\nflags:\t0100000\n"),
        },
    )
    fake_process(tmp_path, 101, {3: ("/dev/dri/renderD128", AMDGPU_FDINFO.format(client=9, vram=0, gtt=4096))})
    probe = DrmProbe(str(tmp_path))
    assert probe.process_bytes(100) == {"vram": 512 * 1024, "gtt": (3 * 1024 * 1024 + 1024) * 1024, "cpu": 0}
    assert probe.gpu_bytes([100, 101, 999]) == 512 * 1024 + (3 * 1024 * 1024 + 1024 + 4096) * 1024


def test_gtt_used_share(tmp_path: Path) -> None:
    # amdgpu's sysfs files: /sys/class/drm/cardN/device/mem_info_gtt_{used,total}, bytes (amdgpu_gtt_mgr.c)
    (tmp_path / "card0").mkdir()
    dev = tmp_path / "card1" / "device"
    dev.mkdir(parents=True)
    (dev / "mem_info_gtt_total").write_text("128849018880\n")
    (dev / "mem_info_gtt_used").write_text("32212254720\n")
    assert gtt_used_share(str(tmp_path)) == 0.25
    assert gtt_used_share(str(tmp_path / "missing")) == 0.0


def test_linux_box_reads_meminfo(tmp_path: Path) -> None:
    # /proc/meminfo's format (fs/proc/meminfo.c): `Key:   N kB`, the counters without a unit are counts
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       131072000 kB\nMemAvailable:    1024 kB\n"
        "SwapTotal:       4194304 kB\nSwapFree:        3145728 kB\n"
        "NvMapMemUsed:     2048 kB\nHugePages_Total:       0\n"
    )
    box = LinuxBox("cpu", str(meminfo), str(tmp_path / "drm"))
    assert box.available() == 1024 * 1024
    assert box.swap() == Swap(4194304 * 1024, 1048576 * 1024)
    assert (box.level(), box.os_pressure(1 << 30), box.gpu_share()) == (None, 0.0, 0.0)
    box.close()


CHILD = """
import subprocess, sys, time
data = b"\\x01" * (40 * 2**20)
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
print("ready", flush=True)
time.sleep(60)
"""


def statm_rss(pid: int) -> int:
    """Resident bytes as /proc/PID/statm says (proc(5): the second field, in pages), read here on its own."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("backend", [LinuxProcesses, PsutilProcesses])
def test_a_process_tree_is_counted_whole_by_either_backend(backend: type) -> None:
    """Both sides of the one interface (Linux's direct reads, psutil's everywhere) agree on a real tree: its
    members, what each holds (statm read independently), its CPU time."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "parent", CHILD], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline(), proc.stdout.readline()] == [b"ready\n", b"ready\n"]  # both allocated
        tree = backend()
        deadline = time.monotonic() + 20
        while len(tree.descendants(proc.pid)) < 2 or tree_memory(tree, proc.pid)[0] < 80 * 2**20:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        total, pids = tree_memory(tree, proc.pid)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert sorted(pids) == sorted(p.pid for p in family) and pids[0] == proc.pid
        assert tree.children(proc.pid) == frozenset({family[1].pid})
        assert abs(total - sum(statm_rss(p.pid) for p in family)) < 2 * 2**20
        times = psutil.Process(proc.pid).cpu_times()  # the same clock ticks (USER_HZ is 100 on Linux)
        assert abs(tree.cpu_ticks(proc.pid) - round((times.user + times.system) * os.sysconf("SC_CLK_TCK"))) <= 1
        tree.close()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


MARKED = """
import os, sys, time
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("backend", [LinuxProcesses, PsutilProcesses])
def test_identity_of_a_process_by_either_backend(backend: type) -> None:
    """alive (a zombie is not), a start time that names one process, the run's mark from its environment, its
    argv: what `down`, the records and the sweep ask of single processes."""
    env = dict(os.environ, UMEMC_RUN="ab12cd34", UMEMC_MODEL="chat")
    proc = subprocess.Popen([sys.executable, "-c", MARKED, "x y"], stdout=subprocess.PIPE, env=env)
    procs = backend()
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        assert procs.alive(proc.pid) and procs.start_time(proc.pid) > 0
        assert procs.start_time(proc.pid) != procs.start_time(os.getpid())
        assert procs.run_environ(proc.pid) == {"UMEMC_RUN": "ab12cd34", "UMEMC_MODEL": "chat"}
        assert procs.cmdline(proc.pid) == [sys.executable, "-c", MARKED, "x y"]
        assert proc.pid in procs.pids()
        assert marked_processes("ab12cd34", procs) == [(proc.pid, "chat")]
        proc.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # not yet reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert not procs.alive(proc.pid) and marked_processes("ab12cd34", procs) == []
    finally:
        proc.kill()
        proc.wait()
    assert not procs.alive(proc.pid) and procs.memory(proc.pid) == 0 and procs.run_environ(proc.pid) == {}


def test_event_log_is_bounded(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.db", max_rows=100)
    for i in range(1200):
        log.add("soft_limit", "w", i=i)
    log.prune()
    events = log.since(0)
    assert len(events) == 100 and events[-1].detail == {"i": 1199} and events[0].detail == {"i": 1100}
    assert log.count("soft_limit", "w") == 100
    log.close()


def test_trend() -> None:
    slope, r2 = _trend([(t, 1000 + 50 * t) for t in range(10)])
    assert abs(slope - 50) < 1e-9 and abs(r2 - 1) < 1e-9
    assert _trend([(t, 7) for t in range(5)]) == (0.0, 0.0)


THREADS = """
import subprocess, sys, threading, time
kids = []
def fork():
    kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    print("forked", kids[-1].pid, flush=True)
    sys.stdin.readline()  # the thread ends when told
worker = threading.Thread(target=fork)
worker.start()
worker.join()
print("thread ended", flush=True)
sys.stdin.readline()
held = b"\\x02" * (30 * 2**20)
print("grown", flush=True)
time.sleep(60)
"""


def own_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("cap", [None, 0], ids=["kept", "over the cap"])
def test_kept_descriptors_read_afresh_and_close_with_their_thread_or_process(cap: int | None) -> None:
    """Linux's reads through kept descriptors: each read is the file as it is now (a child a thread forked, memory
    grown since), a thread that ended has its children file closed, a process gone has all of its closed; past the
    cap nothing is kept and the reads are the same."""
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
    )
    procs = LinuxProcesses()
    if cap is not None:
        procs._cap = cap
    before = own_descriptors()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        forked = proc.stdout.readline().split()
        assert forked[0] == b"forked"
        child = int(forked[1])
        assert procs.children(proc.pid) == frozenset({child})  # listed by the thread that forked it
        small = procs.memory(proc.pid)
        assert abs(small - statm_rss(proc.pid)) < 2**20
        threads = len(os.listdir(f"/proc/{proc.pid}/task"))
        kept = own_descriptors() - before
        assert kept == (0 if cap == 0 else threads + 1)  # each thread's children file, and statm
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"thread ended\n"
        # the child outlives its thread: the kernel hands it to a live thread of the same process (its main one)
        assert procs.children(proc.pid) == frozenset({child})
        assert own_descriptors() - before == (0 if cap == 0 else kept - (threads - 1))
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"grown\n"
        assert procs.memory(proc.pid) - small > 28 * 2**20  # read afresh through the same descriptor
    finally:
        os.killpg(proc.pid, 9)
        os.kill(child, 9)
        proc.wait()
    assert procs.memory(proc.pid) == 0 and procs.children(proc.pid) == frozenset()
    assert own_descriptors() == before
