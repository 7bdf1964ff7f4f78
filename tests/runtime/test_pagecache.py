"""The page cache of model files on a machine whose GPU allocates through its driver from system memory (DGX
Spark: nvidia-unified): a real file in this machine's real page cache, read and mapped by real processes, its
cached pages counted by mincore(2); released unless a process maps them; released by the gateway around a cold
start there (and only there), said in the event log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_scheduler import FakeSupervisor, model, running, scheduler, settled
from umemc.runtime.event_log import EventLog
from umemc.runtime.gateway.scheduler import Scheduler
from umemc.runtime.pagecache import PAGE, cached_bytes, release

MiB = 1024 * 1024
SIZE = 24 * MiB


def model_file(path: Path) -> Path:
    """A file as a model's would be after a load: on disk (written through, so its pages are clean and may be
    dropped), then read by another process (in the cache)."""
    with path.open("wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())
    subprocess.run([sys.executable, "-c", f"open({str(path)!r}, 'rb').read()"], check=True)
    return path


def test_cached_pages_nobody_maps_are_released(tmp_path: Path) -> None:
    f = model_file(tmp_path / "weights.gguf")
    assert cached_bytes(f) == SIZE
    mapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import mmap, sys\n"
            f"f = open({str(f)!r}, 'rb')\n"
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
            f"sum(m[i] for i in range(0, len(m), {PAGE}))\n"
            "print('mapped', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mapper.stdout is not None and mapper.stdout.readline() == "mapped\n"
        assert release([f]) == 0  # a running worker's mapped weights stay
        assert cached_bytes(f) == SIZE
    finally:
        mapper.communicate("")
    assert release([f, tmp_path / "gone.gguf"]) == SIZE  # a missing file is skipped
    assert cached_bytes(f) == 0
    assert release([f]) == 0


def spark(tmp_path: Path, platform: str, sv: FakeSupervisor) -> Scheduler:
    """Two command workers with model files, each of 60 GiB on a 128 GiB machine: the cold one's start evicts
    the hot one."""
    models = ""
    for name, priority, mode in (("a", 40, "hot"), ("b", 60, "cold")):
        path = model_file(tmp_path / f"{name}.gguf")
        models += model(name, priority, mode, memory="60GiB") + f'model = "{path}"\n'
    return scheduler(tmp_path, models, sv, platform=platform)


@pytest.mark.parametrize("platform", ['preset = "dgx-spark-128"', 'kind = "cpu"\nmemory = "128GiB"'])
def test_a_cold_start_on_a_spark_releases_the_model_files_cache(tmp_path: Path, platform: str) -> None:
    """On nvidia-unified: the evicted model's file before the load, the started one's once it serves; elsewhere
    the cache is the kernel's to reclaim and is left alone."""
    sv = FakeSupervisor(running=("a",))
    sched = spark(tmp_path, platform, sv)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"

    seen: list[tuple[str, str | None, dict[str, object]]] = []

    async def body(s: Scheduler) -> None:
        async with s.slots.slot(s.models["b"]):
            pass
        await settled(s)
        seen.extend((e.kind, e.model, e.detail) for e in s.events.since(0))

    running(sched, body)
    assert sv.states == {"a": "STOPPED", "b": "RUNNING"}
    released = [(model, detail) for kind, model, detail in seen if kind == "page_cache_released"]
    if "spark" not in platform:
        assert released == [] and cached_bytes(a) == SIZE and cached_bytes(b) == SIZE
        return
    assert released == [
        ("b", {"bytes": SIZE, "files": [str(a)], "before": "load"}),
        ("b", {"bytes": SIZE, "files": [str(b)], "before": "serving"}),
    ]
    assert cached_bytes(a) == 0 and cached_bytes(b) == 0
    assert [(k, m) for k, m, _ in seen if k in ("evict", "page_cache_released", "cold_start")] == [
        ("evict", "a"),
        ("page_cache_released", "b"),
        ("page_cache_released", "b"),
        ("cold_start", "b"),
    ]


def test_up_releases_the_hot_models_files_once_they_serve(tmp_path: Path) -> None:
    """`umemc up` on a Spark, its hot workers serving: every model file's cache nobody maps is released, and the
    event log says how much (the run's own log, read back)."""
    from umemc.commands.up import release_model_cache
    from umemc.runtime.control import Stack

    sched = spark(tmp_path, 'preset = "dgx-spark-128"', FakeSupervisor())
    sched.events.close()
    stack = Stack(sched.run)
    release_model_cache(stack, stack.plan)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert cached_bytes(a) == 0 and cached_bytes(b) == 0
    log = EventLog(sched.run.events)
    try:
        assert [(e.kind, e.model, e.detail) for e in log.since(0)] == [
            ("page_cache_released", None, {"bytes": 2 * SIZE, "files": [str(a), str(b)], "before": "serving"})
        ]
    finally:
        log.close()
