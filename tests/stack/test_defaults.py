"""Defaults that depend on other keys: ports, mmap by platform, max_concurrency, paths."""

from __future__ import annotations

from pathlib import Path

from umemc.stack.resolve import load_stack


def test_ports_mmap_concurrency_and_paths(write_stack, tmp_path: Path) -> None:
    path = write_stack("""
        version = 1
        name = "d"
        [platform]
        preset = "dgx-spark-128"
        [models.a]
        runtime = "llama-server"
        arch = "llama-3-8b"
        parallel = 3
        [models.b]
        runtime = "llama-server"
        arch = "llama-3-8b"
        port = 10002
        mmap = true
        [models.c]
        runtime = "llama-server"
        model = "weights/c.gguf"
        arch = "llama-3-8b"
        max_concurrency = 7
        """)
    loaded = load_stack(path)
    m = loaded.models
    assert [m[n].port for n in "abc"] == [10001, 10002, 10003]  # 10002 is taken explicitly
    assert [m[n].mmap for n in "abc"] == [False, True, False]  # unified platform: --no-mmap
    assert [m[n].max_concurrency for n in "abc"] == [3, 1, 7]  # default = parallel
    assert m["c"].model_path == tmp_path / "weights" / "c.gguf" and not m["c"].model_present
    # dgx-spark-128: what its OS sees (MemTotal 127600748 kB, XuehaiPan/nvitop#208) less the 8 GiB reserve
    assert (loaded.platform.memory, loaded.platform.gpu_window) == (127600748 * 1024, 127600748 * 1024 - 8 * 1024**3)


def test_cpu_defaults_to_mmap(write_stack) -> None:
    path = write_stack("""
        version = 1
        name = "d"
        [platform]
        kind = "cpu"
        memory = "8GiB"
        [models.a]
        runtime = "llama-server"
        arch = "llama-3-8b"
        """)
    loaded = load_stack(path)
    assert loaded.models["a"].mmap is True
    assert loaded.platform.os_reserve == 1024**3  # min(8 GiB, memory / 8)
