"""Strix Halo / ROCm preflight on fixture trees in the real files' formats:
- /proc/sys/kernel/osrelease ("7.0.0-27-generic"), /proc/cmdline (space-separated parameters);
- KFD's topology, /sys/class/kfd/kfd/topology/nodes/N/properties ("gfx_target_version 110501" lines, as the
  amdkfd driver prints them: key, space, decimal value);
- amdgpu's debugfs /sys/kernel/debug/dri/N/amdgpu_firmware_info ("MES feature version: 1, firmware version:
  0x00000083", the line the reporters of ROCm/legacy-rocm-build#5724 quote);
- module parameters /sys/module/ttm/parameters/pages_limit and /sys/module/amdgpu/parameters/gttsize (integers);
- amdgpu's sysfs /sys/class/drm/card1/device/{vendor,device,mem_info_vram_total,mem_info_gtt_total} (hex ids and
  bytes: `mem_info_gtt_total 103079215104` for `ttm.pages_limit=25165824` on a 128 GB Strix Halo,
  noamsto/nix-amd-ai#42).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import PlanDoc, read
from umemc.runtime.preflight import Preflight
from umemc.stack.resolve import load_stack

STACK = """version = 1
name = "halo"
[platform]
preset = "strix-halo-128"
[models.chat]
runtime = "command"
command = ["true"]
memory = "8GiB"
{env}"""
PAGES = 120 * 262144  # the preset's 120 GiB window in 4 KiB pages


def tree(root: Path, kernel: str = "6.16.3-061603-generic", mes: int | None = 0x84, gfx: int = 110501,
         cmdline: str = "BOOT_IMAGE=/vmlinuz ro quiet", gttsize: int = -1, pages: int = PAGES,
         gtt: int | None = None, module: str = "ttm") -> Path:  # fmt: skip
    """`gtt`: the GTT amdgpu sized when it loaded (default: what `pages` gives); `module`: ttm, or amdgpu-dkms's
    amdttm."""
    files = {
        "sys/class/drm/card1/device/vendor": "0x1002\n",
        "sys/class/drm/card1/device/device": "0x1586\n",
        "sys/class/drm/card1/device/mem_info_vram_total": f"{512 << 20}\n",
        "sys/class/drm/card1/device/mem_info_gtt_total": f"{pages * 4096 if gtt is None else gtt}\n",
        "proc/sys/kernel/osrelease": kernel + "\n",
        "proc/cmdline": cmdline + "\n",
        f"sys/module/{module}/parameters/pages_limit": f"{pages}\n",
        "sys/module/amdgpu/parameters/gttsize": f"{gttsize}\n",
        "sys/class/kfd/kfd/topology/nodes/0/properties": "cpu_cores_count 32\nsimd_count 0\ngfx_target_version 0\n",
        "sys/class/kfd/kfd/topology/nodes/1/properties": (
            f"cpu_cores_count 0\nsimd_count 80\nmem_banks_count 1\ngfx_target_version {gfx}\nvendor_id 4098\n"
        ),
    }
    if mes is not None:
        files["sys/kernel/debug/dri/128/amdgpu_firmware_info"] = (
            "VCE feature version: 0, firmware version: 0x00000000\n"
            "MES_KIQ feature version: 6, firmware version: 0x00000079\n"
            f"MES feature version: 1, firmware version: 0x{mes:08x}\n"
        )
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def findings(tmp_path: Path, root: Path, env: str = "") -> dict[str, list[tuple[bool, str, tuple[str, ...], bool]]]:
    (tmp_path / "s.toml").write_text(STACK.format(env=env))
    out = tmp_path / "bundle"
    build(make_plan(load_stack(tmp_path / "s.toml")), out, files_later=True)
    pf = Preflight(out, read(PlanDoc, out / "plan.json"), host_os="linux", root=root)
    got: dict[str, list[tuple[bool, str, tuple[str, ...], bool]]] = {}
    for f in pf.run():
        if f.check in ("kernel", "firmware", "gfx target", "gpu window"):
            got.setdefault(f.check, []).append((f.ok, f.message, f.fix, f.advisory))
    return got


def test_a_good_strix_halo_passes(tmp_path: Path) -> None:
    got = findings(tmp_path, tree(tmp_path / "root"))
    assert got == {
        "gpu window": [(True, "amdgpu's GTT is 120.0 GiB (card1): the plan needs 120.0 GiB", (), False)],
        "kernel": [(True, "kernel 6.16", (), False)],
        "firmware": [(True, "MES firmware 0x00000084", (), False)],
        "gfx target": [(True, "GPU gfx1151", (), False)],
    }


def test_the_mes_firmware_that_hangs_gfx1151_is_refused(tmp_path: Path) -> None:
    got = findings(tmp_path, tree(tmp_path / "root", mes=0x83))
    assert got["firmware"] == [
        (
            False,
            "MES firmware 0x00000083: ROCm/legacy-rocm-build#5724 (GPU hangs and memory access faults under ROCm "
            "compute)",
            (
                "update linux-firmware past 20251125 (or amdgpu-install's firmware), then reboot",
                "meanwhile: amdgpu.cwsr_enable=0 on the kernel command line",
            ),
            False,
        )
    ]


@pytest.mark.parametrize(
    "kernel,cmdline,expected",
    [
        (
            "6.14.0-27-generic",
            "ro quiet",
            (
                False,
                "kernel 6.14: MES queue-removal hangs under llama.cpp's ROCm backend (ROCm/legacy-rocm-build#5151, "
                "ROCm/TheRock#1413)",
                (
                    "a newer kernel (the reporters moved on to 6.16+), or amdgpu.cwsr_enable=0 on the kernel "
                    "command line",
                ),
                True,
            ),
        ),
        (
            "6.14.0-27-generic",
            "ro quiet amdgpu.cwsr_enable=0",
            (
                True,
                "kernel 6.14 with amdgpu.cwsr_enable=0 (the workaround for ROCm/legacy-rocm-build#5151, "
                "ROCm/TheRock#1413)",
                (),
                False,
            ),
        ),
        (
            "7.0.0-27-generic",
            "ro",
            (
                False,
                "kernel 7.0: a ~300x slower mmap'd weight load on gfx1151 (ROCm/legacy-rocm-build#6530)",
                ("keep mmap = false for llama.cpp models (umemc's default on amd-apu), or another kernel",),
                True,
            ),
        ),
        (
            "6.8.0-45-generic",
            "ro",
            (
                False,
                "kernel 6.8 is older than every kernel the gfx1151 (Strix Halo) reports in docs/STRIX-HALO.md ran "
                "(6.14 and later)",
                ("install a newer kernel (your distribution's HWE or mainline package)",),
                True,
            ),
        ),
    ],
)
def test_kernels_with_known_gfx1151_reports_are_warned(tmp_path: Path, kernel: str, cmdline: str, expected) -> None:
    assert findings(tmp_path, tree(tmp_path / "root", kernel=kernel, cmdline=cmdline))["kernel"] == [expected]


def test_gfx_override_and_deprecated_gtt_and_a_wrong_window(tmp_path: Path) -> None:
    # the parameter asks for 120 GiB, but amdgpu loaded before it was written: its default GTT, half of RAM, is in force
    root = tree(tmp_path / "root", gttsize=65536, gtt=62 << 30)
    got = findings(tmp_path, root, env='[models.chat.env]\nHSA_OVERRIDE_GFX_VERSION = "11.0.0"\n')
    assert got["gfx target"] == [
        (True, "GPU gfx1151", (), False),
        (
            False,
            "models.chat.env sets HSA_OVERRIDE_GFX_VERSION=11.0.0: on gfx1151 it makes ROCm load kernels built for "
            "another GPU",
            ("remove HSA_OVERRIDE_GFX_VERSION from models.chat.env (use a gfx1151 build)",),
            False,
        ),
    ]
    assert got["gpu window"][1] == (
        False,
        "amdgpu.gttsize=65536 is set: the parameter is deprecated, ttm.pages_limit bounds the GTT",
        ("remove amdgpu.gttsize from the kernel command line and modprobe.d; see kernel/README.md",),
        True,
    )
    assert got["gpu window"][0][:3] == (
        False,
        "amdgpu's GTT is 62.0 GiB (card1 mem_info_gtt_total), the plan needs 120.0 GiB (ttm.pages_limit already asks "
        "for 120.0 GiB: it takes effect at the next boot)",
        (
            got["gpu window"][0][2][0],  # sudo umemc apply BUNDLE (the bundle's path)
            "(it writes the ttm option to modprobe.d; add ttm.pages_limit=31457280 to the kernel command line too: "
            "kernel/README.md), then reboot: amdgpu sizes its GTT once, when it loads",
        ),
    )
    assert got["gpu window"][0][2][0].endswith(f"apply {tmp_path / 'bundle'}")


def test_a_larger_gtt_holds_a_smaller_plan_and_amdttm_is_known(tmp_path: Path) -> None:
    """The widely used 124 GiB setting holds the preset's 120 GiB plan; amdgpu-dkms's amdttm is the module read."""
    got = findings(tmp_path, tree(tmp_path / "root", pages=124 * 262144, module="amdttm"))
    assert got["gpu window"] == [(True, "amdgpu's GTT is 124.0 GiB (card1): the plan needs 120.0 GiB", (), False)]
    short = findings(tmp_path, tree(tmp_path / "short", pages=96 * 262144, module="amdttm"))
    assert short["gpu window"][0][1] == "amdgpu's GTT is 96.0 GiB (card1 mem_info_gtt_total), the plan needs 120.0 GiB"
    fix = "(it writes the amdttm option to modprobe.d; add amdttm.pages_limit=31457280 to the kernel command line"
    assert short["gpu window"][0][2][1].startswith(fix)


def test_a_runtime_built_for_another_gpu_is_refused(tmp_path: Path) -> None:
    """A llama.cpp HIP build carries its targets as clang offload bundle ids in libggml-hip.so."""
    from umemc.runtime.rocm import check

    bin_dir = tmp_path / "llama" / "bin"
    bin_dir.mkdir(parents=True)
    exe = bin_dir / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (bin_dir / "libggml-hip.so").write_bytes(
        b"\0ELF..hipv4-amdgcn-amd-amdhsa--gfx1100\0..hipv4-amdgcn-amd-amdhsa--gfx1030\0"
    )
    got = [f for f in check(tree(tmp_path / "root"), {"chat": str(exe)}, {}) if f.check == "gfx target"]
    assert [(f.ok, f.message, f.fix) for f in got] == [
        (True, "GPU gfx1151", ()),
        (
            False,
            f"models.chat: {exe} was built for gfx1030, gfx1100, not gfx1151",
            ("rebuild llama.cpp with -DGGML_HIP=ON -DAMDGPU_TARGETS=gfx1151",),
        ),
    ]
