"""Preflight of a macOS stack, on macOS's probes fed from fixture outputs (tests/runtime/test_darwin.py says where
each format comes from): the GPU wired limit in force against the stack's GPU window, room for swap files, which
enforcement there is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.runtime.test_darwin import SYSCTL, VM_STAT, box
from umemc.budget.plan import make_plan
from umemc.commands.build import build
from umemc.contract import PlanDoc, read
from umemc.runtime.preflight import Preflight
from umemc.runtime.probes.darwin import SysctlText
from umemc.stack.resolve import load_stack

GiB = 1 << 30


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mac") / "bundle"
    build(make_plan(load_stack(REPO / "examples/apple-m-128.toml")), out)
    return out


def preflight(bundle: Path, sysctl: str, free: int = 200 * GiB) -> dict[str, tuple[bool, str, tuple[str, ...]]]:
    plan = read(PlanDoc, bundle / "plan.json")
    pf = Preflight(
        bundle,
        plan,
        host_os="darwin",
        box=box(sysctl, VM_STAT, plan.platform.gpu_window_bytes),
        sysctl=SysctlText(lambda: sysctl),
        swap_volume=lambda: "/",
        swap_room=lambda path: free,
    )
    return {f.check: (f.ok, f.message, f.fix) for f in pf.run() if f.check in ("gpu window", "swap", "cgroups")}


def test_the_default_wired_limit_is_below_the_stack_s_window(bundle: Path) -> None:
    """apple-m-128 plans a 112 GiB window (114688 MiB); a stock macOS on 128 GiB wires 107.52 GiB (0.84 of RAM, as
    two 128 GB Macs report it: antirez/ds4#893), printed to a tenth."""
    found = preflight(bundle, SYSCTL)
    apply = f"sudo {sys.executable} -m umemc apply {bundle.resolve()}"
    assert found["gpu window"] == (
        False,
        "iogpu.wired_limit_mb = 0: macOS's default GPU wired limit (about 107.5 GiB): the GPU may wire less than the "
        "plan's GPU window (112.0 GiB)",
        ("sudo sysctl iogpu.wired_limit_mb=114688", f"persist across boots: {apply}"),
    )


def test_a_raised_wired_limit_covers_it(bundle: Path) -> None:
    found = preflight(bundle, SYSCTL.replace("iogpu.wired_limit_mb: 0", "iogpu.wired_limit_mb: 120000"))
    assert found["gpu window"] == (
        True,
        "iogpu.wired_limit_mb = 120000 covers the plan's GPU window (112.0 GiB)",
        (),
    )


def test_a_macos_without_the_variable(bundle: Path) -> None:
    found = preflight(bundle, SYSCTL.replace("iogpu.wired_limit_mb: 0\n", ""))
    assert found["gpu window"][:2] == (
        False,
        "this macOS has no iogpu.wired_limit_mb (it came with macOS 14): macOS's default GPU wired limit is about "
        "107.5 GiB: the GPU may wire less than the plan's GPU window (112.0 GiB)",
    )


def test_room_for_swap_files_and_the_enforcement_there_is(bundle: Path) -> None:
    found = preflight(bundle, SYSCTL, free=200 * GiB)
    assert found["swap"] == (
        True,
        "200.0 GiB free for swap files in / (1.0 GiB in swap now; umemc reports swap that grows while the stack runs)",
        (),
    )
    assert found["cgroups"] == (
        True,
        "no kernel enforcement on macOS (no memory cgroups): umemc's enforcer kills a worker over its hard quota "
        "within a sample (100 ms), by its phys_footprint",
        (),
    )
    tight = preflight(bundle, SYSCTL, free=5 * GiB)
    assert tight["swap"] == (
        False,
        "only 5.0 GiB free in /, where macOS keeps its swap files: under pressure it then kills programs or stops "
        "with 'Your system has run out of application memory' (1.0 GiB in swap now; umemc reports swap that grows "
        "while the stack runs)",
        ("free at least 16.0 GiB on that volume",),
    )
