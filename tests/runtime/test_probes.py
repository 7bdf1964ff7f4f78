"""Probes against fixture trees in the exact format of the real interfaces (GPU driver files cannot
exist here), and against real processes where they can."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from umemc.runtime.enforcer.rules import trend as _trend
from umemc.runtime.enforcer.sampler import gtt_used_share
from umemc.runtime.events import EventLog
from umemc.runtime.probes.drm import DrmProbe, parse_fdinfo
from umemc.runtime.probes.meminfo import read_meminfo
from umemc.runtime.probes.nvidia import parse_compute_apps
from umemc.runtime.probes.proc import ProcTree

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


def test_nvidia_smi_compute_apps() -> None:
    # `nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`; GB10 prints [N/A]
    assert parse_compute_apps("1234, 5678\n2345, [N/A]\n1234, 2\n\n") == {1234: 5680 * 2**20}


def test_meminfo(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal:       131072000 kB\nMemAvailable:    1024 kB\n"
        "SwapTotal:             0 kB\nNvMapMemUsed:     2048 kB\nHugePages_Total:       0\n"
    )
    info = read_meminfo(str(tmp_path / "meminfo"))
    assert (info["MemAvailable"], info["NvMapMemUsed"], info["HugePages_Total"]) == (1048576, 2097152, 0)


CHILD = """
import subprocess, sys, time
data = b"\\x01" * (40 * 2**20)
if sys.argv[1] == "parent":
    subprocess.Popen([sys.executable, "-c", sys.argv[2], "child", sys.argv[2]])
print("ready", flush=True)
time.sleep(60)
"""


def test_proc_tree_counts_every_descendant() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "parent", CHILD], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline(), proc.stdout.readline()] == [b"ready\n", b"ready\n"]  # both allocated
        tree = ProcTree()
        deadline = time.monotonic() + 20
        while len(tree.descendants(proc.pid)) < 2 or tree.tree_rss(proc.pid)[0] < 80 * 2**20:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        total, pids = tree.tree_rss(proc.pid)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        assert sorted(pids) == sorted(p.pid for p in family)
        assert abs(total - sum(p.memory_info().rss for p in family)) < 2 * 2**20
        times = psutil.Process(proc.pid).cpu_times()  # psutil: the same clock ticks, read on its own
        assert tree.cpu_ticks(proc.pid) == round((times.user + times.system) * os.sysconf("SC_CLK_TCK"))
        tree.close()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


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
