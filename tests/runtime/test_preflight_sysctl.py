"""Preflight compares live VM tunables with the plan in the safe direction: a machine that already
keeps a larger free-memory reserve (or swaps less) is not asked to change. The live values come from
a fixture tree in /proc/sys's own format (one file per key, the value and a newline)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import PlanDoc, read
from umemc.runtime.preflight import Preflight
from umemc.runtime.probes.host import LinuxBox
from umemc.stack.resolve import load_stack

# what the small-16g bundle plans (its sysctl/90-umemc.conf)
PLANNED = {
    "vm.swappiness": "10",
    "vm.overcommit_memory": "0",
    "vm.vfs_cache_pressure": "50",
    "vm.min_free_kbytes": "65536",
    "vm.watermark_scale_factor": "125",
    "vm.max_map_count": "262144",
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small-16g with 6 GiB kept for the OS (the example keeps 3): its 6.4 GiB hot set then holds more than half of
    the 10 GiB left, where the VM tunables matter (the plan's tunables follow the 16 GiB of RAM, unchanged)."""
    where = tmp_path_factory.mktemp("pf")
    text = (REPO / "examples/small-16g.toml").read_text().replace('os_reserve = "3GiB"', 'os_reserve = "6GiB"')
    (where / "stack.toml").write_text(text.replace('"models/', f'"{REPO}/examples/models/'))
    build(make_plan(load_stack(where / "stack.toml")), where / "bundle")
    return where / "bundle"


def sysctl_finding(bundle: Path, tmp_path: Path, **live: str):  # type: ignore[no-untyped-def]
    values = {**PLANNED, **{k.replace("__", "."): v for k, v in live.items()}}
    for key, value in values.items():
        path = tmp_path / "sys" / key.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"), simulate=True, proc_sys=str(tmp_path / "sys"))
    return next(f for f in pf.run() if f.check == "sysctl")


@pytest.mark.parametrize(
    "live",
    [
        {"vm__min_free_kbytes": "67584"},  # a larger reserve than planned (the machine)
        {"vm__max_map_count": "1048576"},
        {"vm__watermark_scale_factor": "200"},
        {"vm__swappiness": "1"},
        {"vm__vfs_cache_pressure": "10"},
    ],
)
def test_safer_than_planned_passes(bundle: Path, tmp_path: Path, live: dict[str, str]) -> None:
    finding = sysctl_finding(bundle, tmp_path, **live)
    assert (finding.ok, finding.message) == (True, "6 VM tunables as planned (or safer)")


def test_the_unsafe_side_fails_with_the_bound(bundle: Path, tmp_path: Path) -> None:
    finding = sysctl_finding(
        bundle, tmp_path, vm__min_free_kbytes="32768", vm__swappiness="60", vm__overcommit_memory="2"
    )
    assert not finding.ok
    assert finding.message == (
        "vm.swappiness is 60, the plan needs at most 10; vm.overcommit_memory is 2, the plan needs 0; "
        "vm.min_free_kbytes is 32768, the plan needs at least 65536"
    )
    assert finding.fix == (
        f"sudo {sys.executable} -m umemc apply {bundle.resolve()}",
        "or now, until the next boot: sudo sysctl -w vm.swappiness=10 vm.overcommit_memory=0 vm.min_free_kbytes=65536",
    )


@pytest.mark.parametrize(
    "example,host_os,message",
    [
        (
            "apple-m-128",
            "linux",
            'this stack is for macOS (platform kind = "apple"), this host runs Linux: its host settings and GPU '
            "window do not apply here",
        ),
        (
            "small-16g",
            "darwin",
            'this stack is for Linux (platform kind = "cpu"), this host runs macOS: its host settings and GPU '
            "window do not apply here",
        ),
    ],
)
def test_preflight_refuses_a_stack_built_for_another_os(
    tmp_path: Path, example: str, host_os: str, message: str
) -> None:
    out = tmp_path / "bundle"
    build(make_plan(load_stack(REPO / f"examples/{example}.toml")), out)
    pf = Preflight(out, read(PlanDoc, out / "plan.json"), host_os=host_os)
    findings = pf.run()
    host = [f for f in findings if f.check == "host"]
    assert [(f.ok, f.message) for f in host] == [(False, message)]
    assert host[0] in pf.blocking()
    # nothing of the other OS is proposed: no sysctl -w on a Mac, no iogpu.wired_limit_mb on Linux
    assert not [f for f in findings if f.check in ("sysctl", "gpu window", "memlock", "swap", "cgroups")]


def test_a_stock_kernel_gets_its_fixes_grouped_with_a_summary(tmp_path: Path) -> None:
    """The Strix Halo example on a stock Debian kernel (fixture trees in /proc/sys's, /sys/module's and
    /proc/meminfo's formats, the values a fresh install has): a problem per check, one fix per command."""
    from umemc.runtime.findings import report

    bundle = tmp_path / "bundle"
    build(make_plan(load_stack(REPO / "examples/strix-halo-5.toml")), bundle)
    stock = {"vm.swappiness": "60", "vm.overcommit_memory": "0", "vm.vfs_cache_pressure": "100",
             "vm.min_free_kbytes": "67584", "vm.watermark_scale_factor": "10", "vm.max_map_count": "65530"}  # fmt: skip
    for key, value in stock.items():
        path = tmp_path / "proc" / "sys" / key.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    ttm = tmp_path / "sys/module/ttm/parameters/pages_limit"
    ttm.parent.mkdir(parents=True)
    ttm.write_text("16252928\n")  # the driver's default: half of 124 GiB of RAM, in 4 KiB pages
    card = tmp_path / "sys/class/drm/card1/device"  # amdgpu's sysfs: the GTT it sized from that default
    card.mkdir(parents=True)
    for name, value in (("vendor", "0x1002"), ("device", "0x1586"), ("mem_info_vram_total", str(512 << 20)),
                        ("mem_info_gtt_total", str(16252928 * 4096))):  # fmt: skip
        (card / name).write_text(f"{value}\n")
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.17.0-8-generic\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       130023424 kB\nMemAvailable:   125829120 kB\nSwapTotal:             0 kB\n")
    pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"), proc_sys=str(tmp_path / "proc/sys"), root=tmp_path,
                   box=LinuxBox("amd-apu", str(meminfo), str(tmp_path / "sys/class/drm")))  # fmt: skip
    findings = pf.run()
    lines, summary = report(findings, pf.blocking())
    apply = f"sudo {sys.executable} -m umemc apply {bundle.resolve()}"
    problems = [line for line in lines if not line.startswith("  [green]ok")]
    assert problems[:7] == [
        "  10 problems, 5 fixes (1 after a reboot):",
        f"  [bold]fix 1[/] (after a reboot): {apply}",
        "    [red]FAIL[/]  sysctl: vm.swappiness is 60, the plan needs at most 10; vm.vfs_cache_pressure is 100, the "
        "plan needs at most 50; vm.min_free_kbytes is 67584, the plan needs at least 524288; "
        "vm.watermark_scale_factor is 10, the plan needs at least 125; vm.max_map_count is 65530, the plan needs "
        "at least 262144",
        "    [red]FAIL[/]  gpu window: amdgpu's GTT is 62.0 GiB (card1 mem_info_gtt_total), the plan needs 120.0 GiB",
        "          or now, until the next boot: sudo sysctl -w vm.swappiness=10 vm.vfs_cache_pressure=50 "
        "vm.min_free_kbytes=524288 vm.watermark_scale_factor=125 vm.max_map_count=262144",
        "          (it writes the ttm option to modprobe.d; add ttm.pages_limit=31457280 to the kernel command line "
        "too: kernel/README.md), then reboot: amdgpu sizes its GTT once, when it loads",
        "  [bold]fix 2[/]: download each file to the path shown, or name it on the Hugging Face Hub "
        '(hf = "owner/repo/file.gguf", mmproj_hf = …) and `umemc pull` fetches it',
    ]
    assert summary == (
        "umemc up: preflight refused: 10 problems, 5 fixes above (1 after a reboot); fix them, or start anyway with "
        "--skip executables --skip files --skip 'gpu window' --skip sysctl"
    )


def test_a_small_stack_is_warned_of_a_stock_kernel_not_refused(tmp_path: Path) -> None:
    """A hot set of 0.8 GiB on a 16 GiB machine: the kernel's tuning cannot sink it. The stock values are a
    warning with the fix, and do not refuse the start, rehearsal or real run alike."""
    stack = tmp_path / "stack.toml"
    stack.write_text(
        'version = 1\nname = "small"\n[platform]\nkind = "cpu"\nmemory = "16GiB"\nos_reserve = "2GiB"\n'
        '[models.w]\nruntime = "command"\ncommand = ["true"]\nmemory = "700MiB"\n'
    )
    bundle = tmp_path / "bundle"
    build(make_plan(load_stack(stack)), bundle)
    stock = {"vm.swappiness": "60", "vm.vfs_cache_pressure": "100", "vm.watermark_scale_factor": "10",
             "vm.max_map_count": "65530"}  # fmt: skip
    for key, value in stock.items():
        path = tmp_path / "sys" / key.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    for simulate in (True, False):
        pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"), simulate=simulate, proc_sys=str(tmp_path / "sys"))
        finding = next(f for f in pf.run() if f.check == "sysctl")
        assert (finding.ok, finding.advisory) == (False, True)
        assert finding.message.endswith(
            # usable: 16 GiB less 2 reserved; the hot set: 700 MiB and its 10% headroom (770 MiB)
            "(this stack's hot set, 0.8 of 14.0 GiB, leaves the kernel room: a warning; the settings matter once the "
            "hot set holds half the memory)"
        )
        assert finding not in pf.blocking()


def test_a_rehearsal_refuses_what_the_real_run_refuses(bundle: Path, tmp_path: Path) -> None:
    """small-16g's hot set holds more than half its machine: an unsafe swappiness refuses the rehearsal too (it
    was a warning there, so the rehearsal passed and the real run failed); `--skip sysctl` passes both."""
    for simulate in (True, False):
        values = {**PLANNED, "vm.swappiness": "60"}
        for key, value in values.items():
            path = tmp_path / "sys" / key.replace(".", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}\n")
        pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"), simulate=simulate, proc_sys=str(tmp_path / "sys"))
        pf.run()
        assert [f.check for f in pf.blocking() if f.check == "sysctl"] == ["sysctl"]
        assert [f.check for f in pf.blocking({"sysctl"}) if f.check == "sysctl"] == []


def test_a_carve_out_the_plan_does_not_count_is_found(tmp_path: Path) -> None:
    """amdgpu's sysfs (mem_info_vram_total, bytes) says the BIOS reserves 96 GiB; the strix-halo-128 preset
    assumes the 512 MB minimum."""
    bundle = tmp_path / "bundle"
    build(make_plan(load_stack(REPO / "examples/strix-halo-5.toml")), bundle)
    dev = tmp_path / "sys/class/drm/card1/device"
    dev.mkdir(parents=True)
    for name, text in (("vendor", "0x1002"), ("device", "0x1586"), ("mem_info_vram_total", str(96 << 30)),
                       ("mem_info_gtt_total", str(16 << 30))):  # fmt: skip
        (dev / name).write_text(text + "\n")
    pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"), root=tmp_path)
    found = [f for f in pf.run() if f.check == "carve-out"]
    assert [(f.ok, f.message, f.fix, f.reboot) for f in found] == [
        (
            False,
            "the BIOS reserves 96.0 GiB of RAM for the GPU (UMA frame buffer, mem_info_vram_total) and the plan "
            "counts 0.0 GiB: the OS has 96.0 GiB less than the budget assumes",
            (
                "BIOS setup: set UMA Frame Buffer Size (or iGPU Memory Size) to 512M, then reboot",
                'or count it: [platform] uma_carveout = "96GiB" (`umemc init` writes it)',
            ),
            True,
        )
    ]


def test_the_checkouts_own_llama_server_is_named_where_path_does_not_reach_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README users run .venv/bin/umemc with only the venv on PATH: the llama-server `dev.py setup-llama-server`
    built beside it (VENV/llama-server/bin) is named in the fix, not an install from llama.cpp's releases."""
    from umemc.testing.tinygguf import TinySpec, write_tiny_gguf

    prefix = tmp_path / "venv"
    built = prefix / "llama-server" / "bin" / "llama-server"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    write_tiny_gguf(tmp_path / "m.gguf", TinySpec(n_layer=2))
    (tmp_path / "s.toml").write_text(
        'version = 1\nname = "own"\n[platform]\nkind = "cpu"\nmemory = "8GiB"\n[models.chat]\n'
        'runtime = "llama-server"\nmodel = "m.gguf"\n'
    )
    bundle = tmp_path / "bundle"
    build(make_plan(load_stack(tmp_path / "s.toml")), bundle)
    pf = Preflight(bundle, read(PlanDoc, bundle / "plan.json"))
    pf._files_and_executables()
    assert [(f.check, f.message, f.fix) for f in pf.findings] == [
        (
            "executables",
            "models.chat: llama-server not found",
            (
                f'export PATH="{built.parent}:$PATH"   # the llama-server `python3 dev.py setup-llama-server` built',
                f'or set bin = "{built}" in models.chat',
            ),
        )
    ]
