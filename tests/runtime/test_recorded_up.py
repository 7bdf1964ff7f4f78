"""`umemc up --simulate` on the recorded machines (tests/machines, UMEMC_HOST_ROOT): preflight judges the recorded
machine (its GTT, its VM tunables, its MemAvailable), the real supervisord runs placeholders here, and the enforcer
reads the recorded machine's pressure (PSI) into `status`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import patience
from tests.runtime.conftest import free_port
from umemc.cli import main

MACHINES = Path(__file__).resolve().parents[1] / "machines"
pytestmark = pytest.mark.slow


def stack_text(preset: str) -> str:
    return (
        f'version = 1\nname = "rec"\n[platform]\npreset = "{preset}"\n'
        f'[models.chat]\nruntime = "command"\ncommand = ["true"]\nmemory = "64MiB"\nport = {free_port()}\n'
    )


@pytest.mark.parametrize(
    ("machine", "preset", "psi_some"),
    [
        ("strix-halo-128-dkms", "strix-halo-128", 0.0052),
        ("strix-halo-128", "strix-halo-128", 0.0),
        ("dgx-spark", "dgx-spark-128", 0.0),
        ("jetson-agx-orin-64", "jetson-orin-64", 0.0),
        ("apple-128", "apple-silicon-128", None),
        ("apple-32", "apple-silicon-36", None),
    ],
)
def test_a_rehearsal_on_a_recorded_machine(
    machine: str, preset: str, psi_some: float | None, stack, monkeypatch, capsys, tmp_path: Path
) -> None:
    monkeypatch.setenv("UMEMC_HOST_ROOT", str(MACHINES / machine))
    r = stack(stack_text(preset), "--simulate")
    out = capsys.readouterr().out
    # the recorded GTT (125 GiB) holds the preset's 120 GiB window; the 96 GiB one does not, which a rehearsal only
    # warns of (its placeholders use no GPU); the Spark and the Jetson have none to judge
    if machine == "strix-halo-128-dkms":
        assert "amdgpu's GTT is 125.0 GiB (card1): the plan needs 120.0 GiB" in out
    if machine == "strix-halo-128":
        assert "amdgpu's GTT is 96.0 GiB (card1 mem_info_gtt_total), the plan needs 120.0 GiB" in out
    assert {n: m["state"] for n, m in r.status().items()} == {"chat": "RUNNING"}

    def machine_said() -> dict:
        assert main(["status", "--run-dir", str(r.run_dir), "--json"]) == 0
        return json.loads(capsys.readouterr().out)["machine"] or {}

    deadline = time.monotonic() + patience(30)  # the enforcer rewrites its status every second
    said = machine_said()
    while said.get("platform") is None and time.monotonic() < deadline:
        time.sleep(0.2)
        said = machine_said()
    # a recorded Mac is sampled through macOS's probes (its recorded sysctl and vm_stat), and has no PSI
    assert (said["platform"], said.get("psi_some")) == ("darwin" if psi_some is None else "linux", psi_some)
