"""GPU memory per process on NVIDIA, where no NVIDIA driver can exist: nvidia-smi is a script on PATH printing
its query's exact output format (`nvidia-smi --help-query-compute-apps`: `pid, used_memory` in MiB with
`--format=csv,noheader,nounits`; `[N/A]` where the driver cannot give a value, `[Not Supported]` where the GPU
does not support it), NVML a module in nvidia-ml-py's shape (`pynvml`: each running process an object with `pid`
and `usedGpuMemory` in bytes, None where NVML says not available). On a DGX Spark (nvidia-unified) that memory is
in neither RSS nor the cgroup's charge: the enforcer's sampler counts it on the worker, once."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import PlanDoc, read
from umemc.runtime.enforcer.sampler import Sampler
from umemc.runtime.enforcer.worker_state import Quota, Worker
from umemc.runtime.probes import nvidia
from umemc.runtime.rundir import RunDir
from umemc.stack.resolve import load_stack

MiB = 1024 * 1024


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> Path:
    """An nvidia-smi on PATH that prints `output` and notes each run in a file beside it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "output.txt").write_text(output)
    runs = bin_dir / "runs"
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$*" >> {runs}\ncat {bin_dir / "output.txt"}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return runs


def fake_nvml(monkeypatch: pytest.MonkeyPatch, devices: list[list[tuple[int, int | None]]]) -> None:
    """nvidia-ml-py's pynvml over `devices` (per device, its compute processes as (pid, usedGpuMemory))."""
    module: Any = types.ModuleType("pynvml")
    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        for pid, used in devices[h]
    ]
    monkeypatch.setitem(sys.modules, "pynvml", module)


def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError


def test_nvidia_smis_lines_read_with_what_the_driver_could_not_say() -> None:
    text = "1234, 5678\n2345, [N/A]\n1234, 2\n3456, [Not Supported]\n\n"
    assert nvidia.parse_compute_apps(text) == {1234: 5680 * MiB, 2345: None, 3456: None}


def test_nvidia_smi_answers_where_nvml_is_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)
    runs = fake_smi(tmp_path, monkeypatch, "4242, 1536\n4343, [N/A]\n")
    assert nvidia.query() == {4242: 1536 * MiB}
    assert runs.read_text() == "--query-compute-apps=pid,used_memory --format=csv,noheader,nounits\n"


def test_nvml_answers_alone_when_it_knows_every_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process from one source: NVML's figures, nvidia-smi not run (its figure for the same process would
    be counted a second time)."""
    fake_nvml(monkeypatch, [[(4242, 3 * MiB)], [(4242, 1 * MiB), (77, 5 * MiB)]])
    runs = fake_smi(tmp_path, monkeypatch, "4242, 4\n77, 5\n")
    assert nvidia.query() == {4242: 4 * MiB, 77: 5 * MiB}
    assert not runs.exists()


def test_nvidia_smi_fills_what_nvml_could_not_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml(monkeypatch, [[(4242, 3 * MiB), (77, None)]])
    runs = fake_smi(tmp_path, monkeypatch, "4242, 9\n77, 7\n88, [N/A]\n")
    assert nvidia.query() == {4242: 3 * MiB, 77: 7 * MiB}
    assert runs.exists()


def test_no_driver_no_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_nvml(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert nvidia.query() == {}


SPARK = """version = 1
name = "spark"
[platform]
{platform}
[models.cuda]
runtime = "command"
command = ["true"]
memory = "2GiB"
"""


@pytest.mark.parametrize("kind", ["nvidia-unified", "nvidia-discrete"])
def test_the_workers_cuda_memory_counts_against_its_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A real process as the worker: its RSS from /proc, its 1.5 GiB of CUDA memory from the driver (2 s apart at
    most, like the enforcer's slow tick), its usage the sum; a process of another run is not counted."""
    stack = tmp_path / "s.toml"
    platform = (
        'preset = "dgx-spark-128"'
        if kind == "nvidia-unified"
        else f'kind = "{kind}"\nmemory = "64GiB"\ngpu_window = "24GiB"'
    )
    stack.write_text(SPARK.format(platform=platform))
    bundle = tmp_path / "run" / "bundle"
    build(make_plan(load_stack(stack)), bundle, files_later=True)
    plan = read(PlanDoc, bundle / "plan.json")
    assert plan.platform.kind == kind
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        no_nvml(monkeypatch)
        fake_smi(tmp_path, monkeypatch, f"{proc.pid}, 1536\n1, 512\n")
        sampler = Sampler(plan, RunDir.of_bundle(bundle))
        w = Worker(Quota("cuda", hard=3 << 30, soft=2 << 30, priority=50, estimate=2 << 30), pid=proc.pid)
        sampler.refresh_nvidia(now=1000.0)  # asked off the loop: its answer awaited here
        sampler.nvidia_reads.wait()
        sampler.refresh(w, now=1000.0)
        rss = sampler.procs.memory(proc.pid)
        assert w.gpu_side == 1536 * MiB
        assert rss > 0 and abs(w.cpu_side - rss) < 4 * MiB  # read a moment apart
        assert w.usage == w.cpu_side + 1536 * MiB
        assert w.gpu_visible is True
        # the driver stops listing it (a container's PID namespace, a Jetson): its GPU figure is said not visible
        (tmp_path / "bin" / "output.txt").write_text("1, 512\n")
        sampler.refresh_nvidia(now=1010.0)
        sampler.nvidia_reads.wait()
        sampler.refresh(w, now=1010.0)
        assert (w.gpu_side, w.gpu_visible) == (0, False)
    finally:
        proc.kill()
        proc.wait()


def test_before_the_driver_answered_visibility_is_not_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack = tmp_path / "s.toml"
    stack.write_text(SPARK.format(platform='preset = "dgx-spark-128"'))
    bundle = tmp_path / "run" / "bundle"
    build(make_plan(load_stack(stack)), bundle, files_later=True)
    sampler = Sampler(read(PlanDoc, bundle / "plan.json"), RunDir.of_bundle(bundle))
    w = Worker(Quota("cuda", hard=3 << 30, soft=2 << 30, priority=50, estimate=2 << 30), pid=os.getpid())
    sampler.refresh(w, now=1000.0)
    assert (sampler.nvidia_reads.answered, w.gpu_visible) == (False, None)


def test_status_says_a_gpu_figure_it_cannot_see() -> None:
    """`umemc status`'s table: a worker whose processes the driver does not list shows "not visible", not 0 B."""
    from rich.console import Console

    from umemc.commands.status import table

    def row(visible: bool | None) -> dict[str, Any]:
        return {"state": "RUNNING", "pid": 42, "rss_bytes": 512 * MiB, "gpu_bytes": 0, "quota_soft_bytes": 2 << 30,
                "quota_hard_bytes": 3 << 30, "restarts": 0, "_uptime_s": 10.0, "_last_event": None,
                "_resident_bytes": None, "_reserved": 0, "_gpu_visible": visible}  # fmt: skip

    status = {"stack": "spark", "running": True, "models": {"seen": row(True), "unseen": row(False)}}
    console = Console(width=200, record=True)
    console.print(table(status))
    lines = {x.split()[0]: x for x in console.export_text().splitlines() if x.split()[:1] in (["seen"], ["unseen"])}
    assert "not visible" in lines["unseen"] and "not visible" not in lines["seen"]
