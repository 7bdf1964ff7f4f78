"""Preflight compares live VM tunables with the plan in the safe direction: a machine that already
keeps a larger free-memory reserve (or swaps less) is not asked to change. The live values come from
a fixture tree in /proc/sys's own format (one file per key, the value and a newline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO
from umemc.budget import make_plan
from umemc.commands.build import build
from umemc.contract import PlanDoc, read
from umemc.runtime.preflight import Preflight
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
    out = tmp_path_factory.mktemp("pf") / "bundle"
    build(make_plan(load_stack(REPO / "examples/small-16g.toml")), out)
    return out


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
    assert finding.fix[:3] == (
        "sudo sysctl -w vm.swappiness=10",
        "sudo sysctl -w vm.overcommit_memory=0",
        "sudo sysctl -w vm.min_free_kbytes=65536",
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
