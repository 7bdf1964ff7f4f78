"""A Vulkan build of llama.cpp on an amd-apu host (what many Strix Halo owners run where ROCm fails), read from what
a real Vulkan build printed: tests/recorded/llama-server-vulkan/ (its README says how it was built and run: the
llama.cpp that llama-cpp-python 0.3.36 vendors, -DGGML_VULKAN=ON, on Mesa's lavapipe, the only Vulkan driver of a
machine without a GPU). Its `--list-devices` (none by default: llama.cpp leaves CPU renderers out; llvmpipe when
GGML_VK_VISIBLE_DEVICES makes it visible), its server's own dry run and the real load's buffers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.runtime.test_preflight_rocm import tree
from umemc.estimate.dryrun import parse_buffers as dry_run_buffers
from umemc.estimate.dryrun import parse_table
from umemc.lockfile import host_bytes, totals
from umemc.runtime.llamabuild import Device, backends, devices, parse_devices
from umemc.runtime.llamalog import parse_buffers as load_buffers
from umemc.runtime.rocm import check

RECORDED = Path(__file__).resolve().parents[1] / "recorded" / "llama-server-vulkan"
MiB = 1024 * 1024
LLVMPIPE = Device("Vulkan0", "Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)", 2048 * MiB, 2048 * MiB)
# a GPU's line in the recorded line's format (common/arg.cpp prints every device so); the description is how RADV
# names a Strix Halo GPU, written here, not recorded (no such GPU on this machine)
RADV_LINE = "Available devices:\n  Vulkan0: AMD Radeon 8060S Graphics (RADV GFX1151) (98304 MiB, 97000 MiB free)\n"


def test_list_devices_as_a_vulkan_build_prints_them() -> None:
    assert parse_devices((RECORDED / "list-devices.txt").read_text()) == [LLVMPIPE]
    assert parse_devices((RECORDED / "list-devices-default.txt").read_text()) == []
    assert parse_devices(RADV_LINE) == [
        Device("Vulkan0", "Vulkan", "AMD Radeon 8060S Graphics (RADV GFX1151)", 98304 * MiB, 97000 * MiB)
    ]
    assert not parse_devices(RADV_LINE)[0].software and LLVMPIPE.software


def stand_in(tmp_path: Path, listing: str, libs: tuple[str, ...] = ("vulkan",)) -> str:
    """A llama-server that answers --list-devices with `listing` (a recorded one), beside its ggml libraries."""
    bin_dir = tmp_path / "llama" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "listing.txt").write_text(listing)
    exe = bin_dir / "llama-vulkan"  # a stand-in: the name of the real server would make it a slow test
    exe.write_text(f'#!/bin/sh\n[ "$1" = --list-devices ] && exec cat "{bin_dir / "listing.txt"}"\nexit 1\n')
    exe.chmod(0o755)
    for lib in libs:
        (bin_dir / f"libggml-{lib}.so").write_bytes(b"\0ELF")
    return str(exe)


def vulkan_findings(
    tmp_path: Path, listing: str, env: dict[str, str] | None = None, window: int | None = None
) -> tuple[str, list[tuple[bool, str, tuple[str, ...], bool]]]:
    exe = stand_in(tmp_path, listing)
    got = check(tree(tmp_path / "root"), {"chat": exe}, {"chat": env or {}}, window)
    return exe, [(f.ok, f.message, f.fix, f.advisory) for f in got if f.check == "vulkan"]


def test_a_vulkan_build_that_sees_no_gpu_is_refused(tmp_path: Path) -> None:
    """llama.cpp lists no CPU renderer: on a box without RADV the model would silently run on the CPU."""
    exe, got = vulkan_findings(tmp_path, (RECORDED / "list-devices-default.txt").read_text())
    assert backends(exe) == {"Vulkan"}
    assert got == [
        (
            False,
            f"models.chat: {exe} is a Vulkan build of llama.cpp; it sees no GPU (`--list-devices`: none): the model "
            "would run on the CPU",
            (
                "install Mesa's Vulkan driver for AMD GPUs, RADV (Debian and Ubuntu: mesa-vulkan-drivers; Fedora: "
                "mesa-vulkan-drivers); `vulkaninfo --summary` then lists the GPU",
            ),
            False,
        )
    ]


def test_a_cpu_renderer_is_no_gpu(tmp_path: Path) -> None:
    exe, got = vulkan_findings(
        tmp_path, (RECORDED / "list-devices.txt").read_text(), env={"GGML_VK_VISIBLE_DEVICES": "0"}
    )
    assert [g[:2] for g in got] == [
        (
            False,
            f"models.chat: {exe} is a Vulkan build of llama.cpp; Vulkan0 is llvmpipe, Mesa's CPU renderer, not the "
            "GPU (made visible by GGML_VK_VISIBLE_DEVICES)",
        )
    ]


def test_a_gpu_is_checked_against_the_window(tmp_path: Path) -> None:
    exe, got = vulkan_findings(tmp_path, RADV_LINE, window=96 * 1024 * MiB)
    assert got == [
        (True, "models.chat: Vulkan build, Vulkan0 AMD Radeon 8060S Graphics (RADV GFX1151), 98304 MiB", (), False)
    ]
    exe, got = vulkan_findings(tmp_path / "b", RADV_LINE, window=120 * 1024 * MiB)
    assert got == [
        (
            False,
            "models.chat: Vulkan build, Vulkan0 AMD Radeon 8060S Graphics (RADV GFX1151), 98304 MiB reported to "
            "llama.cpp, less than the plan's GPU window (122880 MiB): llama.cpp's fit keeps layers on the CPU "
            "beyond what the driver reports",
            (
                "the driver reports what the GPU's memory settings give it: the BIOS's dedicated GPU memory and the "
                "GTT limit (ttm.pages_limit, kernel/README.md); or lower the stack's gpu_window",
            ),
            True,
        )
    ]


def test_rocm_settings_do_not_concern_a_vulkan_build(tmp_path: Path) -> None:
    """HSA_OVERRIDE_GFX_VERSION steers ROCm only: set for a Vulkan build it is no finding; a build with both
    backends still gets it."""
    exe = stand_in(tmp_path, RADV_LINE)
    env = {"chat": {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}}
    gfx = [f for f in check(tree(tmp_path / "root"), {"chat": exe}, env) if f.check == "gfx target"]
    assert [f.message for f in gfx] == ["GPU gfx1151"]
    both = stand_in(tmp_path / "both", RADV_LINE, libs=("vulkan", "hip"))
    gfx = [f for f in check(tree(tmp_path / "root2"), {"chat": both}, env) if f.check == "gfx target"]
    assert [f.message for f in gfx] == [
        "GPU gfx1151",
        "models.chat.env sets HSA_OVERRIDE_GFX_VERSION=11.0.0: on gfx1151 it makes ROCm load kernels built for another "
        "GPU",
        f"models.chat: {both} was built for no GPU, not gfx1151",
    ]


def test_a_cpu_build_is_asked_nothing(tmp_path: Path) -> None:
    exe = stand_in(tmp_path, RADV_LINE, libs=())
    asked: list[str] = []

    def listing(program: str, env: dict[str, str]) -> list[Device]:
        asked.append(program)
        return []

    check(tree(tmp_path / "root"), {"chat": exe}, {}, None, listing)
    assert backends(exe) == set() and asked == []
    assert devices(exe) == parse_devices(RADV_LINE)  # the program itself, asked


def test_the_server_dry_run_on_the_vulkan_build_matches_its_real_load() -> None:
    """umemc's dry run reads llama-server's own (`--fit on`, stopped at its first memory breakdown); on the Vulkan
    build it names the device with a description in parentheses of its own. Its figures against the same
    server's real load (the buffer lines after it): KV, compute and output to the 0.01 MiB, weights to the MiB."""
    dry = (RECORDED / "dry-run-smollm2.log").read_text()
    load = load_buffers((RECORDED / "load-smollm2.excerpt.log").read_text())
    table = parse_table(dry)
    assert table == {
        "Vulkan0": {"model": 92 * MiB, "context": 90 * MiB, "compute": 13 * MiB},
        "Host": {"model": 28 * MiB, "context": 0, "compute": 4 * MiB},
    }
    buffers = dry_run_buffers(dry)
    assert buffers == {
        "Vulkan0": {"model": 0, "kv": round(90.00 * MiB), "compute": round(13.26 * MiB)},
        "Vulkan_Host": {"model": 0, "output": round(0.38 * MiB), "compute": round(4.26 * MiB)},
    }
    assert load == {
        "CPU_Mapped": {"model": round(28.69 * MiB)},
        "Vulkan0": {"model": round(92.10 * MiB), "kv": round(90.00 * MiB), "compute": round(13.26 * MiB)},
        "Vulkan_Host": {"output": round(0.38 * MiB), "compute": round(4.26 * MiB)},
    }
    real, dry_totals = totals(load), totals(buffers)
    assert (dry_totals["kv"], dry_totals["compute"], dry_totals["output"]) == (
        real["kv"],
        real["compute"],
        real["output"],
    )
    # the weights: the breakdown's whole MiB against the loaded buffers' (92.10 + 28.69 MiB)
    assert sum(v["model"] for v in table.values()) == (real["model"] // MiB) * MiB
    # what lives in host memory: the mapped weights and the driver's host buffers (Vulkan_Host), not Vulkan0's
    assert host_bytes(load) == round(28.69 * MiB) + round(0.38 * MiB) + round(4.26 * MiB)


VULKAN_SERVER = os.environ.get("UMEMC_LLAMA_SERVER_VULKAN")


@pytest.mark.slow
@pytest.mark.skipif(not VULKAN_SERVER, reason="UMEMC_LLAMA_SERVER_VULKAN names no Vulkan llama-server build")
def test_a_real_vulkan_build_is_recognized_and_its_dry_run_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the build itself (tests/recorded/llama-server-vulkan/README.md says how to make one): its backend,
    its device, and umemc's dry run on it against the real load recorded from that build."""
    from tests.realmodels import SMOLLM2
    from umemc.estimate import dryrun

    assert VULKAN_SERVER is not None
    if not SMOLLM2.is_file():
        pytest.skip(f"no {SMOLLM2}: python3 dev.py setup-models")
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")  # lavapipe is a CPU renderer: llama.cpp hides it unasked
    assert "Vulkan" in backends(VULKAN_SERVER)
    seen = devices(VULKAN_SERVER)
    assert seen is not None and len(seen) >= 1 and seen[0].backend == "Vulkan"
    tool = dryrun.find_tool("llama-server", VULKAN_SERVER)
    assert not isinstance(tool, str), tool
    args = ["-m", str(SMOLLM2), "-c", "4096", "-np", "2", "-ub", "512", "-b", "2048", "-fa", "on", "-ctk", "f16"]
    run = dryrun.run(tool, [*args, "-ctv", "f16", "-ngl", "99"], {})
    real = totals(load_buffers((RECORDED / "load-smollm2.excerpt.log").read_text()))
    got = totals(run.buffers)
    assert (got["kv"], got["compute"], got["output"]) == (real["kv"], real["compute"], real["output"])
    assert run.table["Vulkan0"] == {"model": 92 * MiB, "context": 90 * MiB, "compute": 13 * MiB}


def test_an_older_llama_cpp_s_log_still_states_its_weights() -> None:
    """llama.cpp builds of 2024 print weights without the word `model` (`llm_load_tensors: CUDA0 buffer size`) and
    their context under llama_new_context_with_model: the drift check must see those weights. Lines as published
    from such builds (a CUDA load with an RPC part, and a reload)."""
    log = (
        "llama_model_loader: loaded meta data with 19 key-value pairs and 291 tensors\n"
        "llm_load_tensors: offloaded 33/33 layers to GPU\n"
        "llm_load_tensors:      CUDA0 buffer size =  9999.00 MiB\n"
        "llama_model_loader: loaded meta data with 19 key-value pairs and 291 tensors\n"  # the model loaded again
        "llm_load_tensors: offloaded 81/81 layers to GPU\n"
        "llm_load_tensors: RPC[192.168.62.35:50052] buffer size = 19142.56 MiB\n"
        "llm_load_tensors:        CPU buffer size =   563.65 MiB\n"
        "llm_load_tensors:      CUDA0 buffer size = 18764.46 MiB\n"
        "llama_new_context_with_model: n_ctx      = 2048\n"
        "llama_kv_cache_init:      CUDA0 KV buffer size =  1350.00 MiB\n"
        "llama_new_context_with_model:  CUDA_Host  output buffer size =     0.98 MiB\n"
        "llama_new_context_with_model:      CUDA0 compute buffer size =  1104.00 MiB\n"
    )
    assert load_buffers(log) == {
        "RPC[192.168.62.35:50052]": {"model": round(19142.56 * MiB)},
        "CPU": {"model": round(563.65 * MiB)},
        "CUDA0": {"model": round(18764.46 * MiB), "kv": 1350 * MiB, "compute": 1104 * MiB},
        "CUDA_Host": {"output": round(0.98 * MiB)},
    }
