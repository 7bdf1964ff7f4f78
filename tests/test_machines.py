"""The recorded machines (tests/machines/*, each assembled from published real outputs; SOURCES.md names every
piece and what had to be synthesised): `umemc doctor`, `init`, `check` and `--capture` read each as umemc would
read the machine itself (UMEMC_HOST_ROOT). Every expected figure below is the published one, converted by hand."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

MACHINES = Path(__file__).parent / "machines"
GiB, MiB = 1 << 30, 1 << 20

# machine -> (platform, memory the OS sees, GPU window in force, its source); from each SOURCES.md
EXPECTED = {
    "strix-halo-128": ("amd-apu", 131_406_596 * 1024, 103_079_215_104, "amdgpu card1 mem_info_gtt_total"),
    "strix-halo-128-dkms": ("amd-apu", 130_470_000 * 1024, 32_768_000 * 4096, "amdgpu card1 mem_info_gtt_total"),
    "apple-128": ("apple", 128 * GiB, 115_448_720_916, "Metal recommendedMaxWorkingSetSize"),
    "apple-32": ("apple", 32 * GiB, 22_906_503_168, "Metal recommendedMaxWorkingSetSize"),
    "dgx-spark": (
        "nvidia-unified",
        127_600_748 * 1024,
        None,
        "none: the GPU allocates from the memory the OS has (MemAvailable)",
    ),
    "jetson-agx-orin-64": (
        "nvidia-unified",
        62_841 * MiB,
        None,
        "none: the GPU allocates from the memory the OS has (MemAvailable)",
    ),
}


def doctor(run_cli, monkeypatch, machine: Path, *args: str) -> tuple[int, dict]:
    monkeypatch.setenv("UMEMC_HOST_ROOT", str(machine))
    code, out, err = run_cli("doctor", "--json", *args)
    assert err == ""
    return code, json.loads(out)


def test_every_recorded_machine_names_its_sources() -> None:
    assert sorted(p.name for p in MACHINES.iterdir()) == sorted(EXPECTED)
    for machine in MACHINES.iterdir():
        sources = (machine / "SOURCES.md").read_text()
        assert "https://github.com/" in sources and "Synthesised" in sources, machine.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_doctor_reads_each_machine_as_published(name: str, run_cli, monkeypatch) -> None:
    code, got = doctor(run_cli, monkeypatch, MACHINES / name)
    kind, memory, window, source = EXPECTED[name]
    assert (got["platform"], got["memory_bytes"], got["gpu_window_bytes"], got["gpu_window_source"]) == (
        kind,
        memory,
        window,
        source,
    )
    assert set(got) >= {"platform", "memory_bytes", "gpu_window_bytes", "gpu_window_source", "memory_busy", "findings"}
    assert got["recorded"] == str(MACHINES / name)
    assert all(f["status"] in ("ok", "warn", "fail") for f in got["findings"])
    assert code == (1 if any(f["status"] == "fail" for f in got["findings"]) else 0)


def test_strix_halo_heat_leaves_out_zenpower5_s_impossible_ccd_readings(run_cli, monkeypatch) -> None:
    """zenpower5 reports Tccd1 149.8 and Tccd2 0.0 on an idle Strix Halo (mattkeenan/zenpower5#10): not readings."""
    _, got = doctor(run_cli, monkeypatch, MACHINES / "strix-halo-128")
    sensors = {s["name"]: s["celsius"] for s in got["heat"]["sensors"]}
    assert sensors == {"amdgpu edge": 41.0, "zenpower Tdie": 39.4, "zenpower Tctl": 39.4}
    assert got["heat"]["throttling"] is None
    assert (got["uma_carveout_bytes"], got["gpu_window_note"]) == (4 * GiB, None)


def test_a_gb10_has_a_gpu_without_memory_and_a_bus_that_is_not_measured(run_cli, monkeypatch) -> None:
    _, got = doctor(run_cli, monkeypatch, MACHINES / "dgx-spark")
    assert got["platform_why"] == (
        "NVIDIA GB10: nvidia-smi reports no memory of its own (memory.total [N/A]): it shares the RAM"
    )
    assert got["memory_busy"] is None  # its utilization.memory reads 0: a dead counter, not an idle bus
    assert got["memory_busy_source"].startswith("not measured")
    assert got["gpu_processes"] == {"114687": 19135 * MiB}  # llama-swap#782's compute-apps line
    assert [s["name"] for s in got["heat"]["sensors"]] == ["nvidia gpu0"]


def test_jetson_reads_nvmap_and_thermal_zones_without_the_gated_gpu_zone(run_cli, monkeypatch) -> None:
    _, got = doctor(run_cli, monkeypatch, MACHINES / "jetson-agx-orin-64")
    assert got["platform_why"] == "Jetson (NVIDIA Jetson AGX Orin Developer Kit)"
    assert got["nvmap_used_bytes"] == 805_068 * 1024
    sensors = {s["name"]: (s["celsius"], s["limit"]) for s in got["heat"]["sensors"]}
    assert sensors == {  # gpu-thermal's -256 °C (power-gated) is left out
        f"thermal {z}": (c, 105.0)
        for z, c in (("cpu-thermal", 52.0), ("soc0-thermal", 49.0), ("soc1-thermal", 49.0), ("soc2-thermal", 48.0))
    } | {"thermal tj-thermal": (52.0, 105.0)}
    assert got["gpu_processes"] is None  # no nvidia-smi figure on Jetson's iGPU


def test_psi_is_read_where_the_kernel_has_it(run_cli, monkeypatch) -> None:
    _, got = doctor(run_cli, monkeypatch, MACHINES / "strix-halo-128-dkms")
    assert got["psi"] == {"some10": 0.0052, "some60": 0.002, "some300": 0.0005, "full10": 0.0031,
                          "full60": 0.0011, "full300": 0.0002}  # fmt: skip
    _, mac = doctor(run_cli, monkeypatch, MACHINES / "apple-128")
    assert mac["psi"] is None


STACK = """version = 1
name = "m"
[platform]
preset = "{preset}"
[models.probe]
runtime = "command"
command = ["true"]
memory = "1GiB"
"""


def window_finding(run_cli, monkeypatch, tmp_path: Path, machine: str, preset: str) -> dict:
    path = tmp_path / "stack.toml"
    path.write_text(STACK.format(preset=preset))
    _, got = doctor(run_cli, monkeypatch, MACHINES / machine, str(path))
    assert got["findings_against"] == f"{path} (BUNDLE: what `umemc build STACK` writes)"
    return next(f for f in got["findings"] if f["check"] == "gpu window")


def test_a_stock_128_gb_mac_holds_the_apple_preset(run_cli, monkeypatch, tmp_path: Path) -> None:
    """The preset's 107.5 GiB window fits under macOS's stock 107.52 GiB (it was judged against 3/4 of RAM)."""
    f = window_finding(run_cli, monkeypatch, tmp_path, "apple-128", "apple-silicon-128")
    assert (f["status"], f["message"]) == (
        "ok",
        "iogpu.wired_limit_mb = 0: Metal's recommendedMaxWorkingSetSize (about 107.5 GiB) covers the plan's GPU "
        "window (107.5 GiB)",
    )


def test_strix_halo_windows_are_judged_by_the_gtt_in_force(run_cli, monkeypatch, tmp_path: Path) -> None:
    """A 125 GiB GTT (amdgpu-dkms, amdttm) holds the preset's 120 GiB plan; a 96 GiB GTT does not, and the fix is the
    module option and a reboot, never a run-time write."""
    f = window_finding(run_cli, monkeypatch, tmp_path, "strix-halo-128-dkms", "strix-halo-128")
    assert (f["status"], f["message"]) == ("ok", "amdgpu's GTT is 125.0 GiB (card1): the plan needs 120.0 GiB")
    f = window_finding(run_cli, monkeypatch, tmp_path, "strix-halo-128", "strix-halo-128")
    assert (f["status"], f["message"]) == (
        "fail",
        "amdgpu's GTT is 96.0 GiB (card1 mem_info_gtt_total), the plan needs 120.0 GiB",
    )
    assert f["fix"][0].endswith("apply BUNDLE")
    assert not any("/sys/module" in x for x in f["fix"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_init_and_check_on_each_machine(name: str, run_cli, monkeypatch, tmp_path: Path) -> None:
    """init writes what the OS sees (never rounded up); the stack it writes checks."""
    monkeypatch.setenv("UMEMC_HOST_ROOT", str(MACHINES / name))
    out = tmp_path / "stack.toml"
    code, said, _ = run_cli("init", "-o", str(out), cwd=tmp_path)
    assert code == 0, said
    code, report, _ = run_cli("check", str(out), "--format", "json")
    assert code == 0
    capacity = json.loads(report)["capacity"]
    kind, memory, window, _ = EXPECTED[name]
    carve = 4 * GiB if name == "strix-halo-128" else 0
    assert capacity["memory_bytes"] <= memory + carve  # the budget never counts memory the OS does not have
    assert capacity["memory_bytes"] >= (memory + carve) - MiB  # MemTotal written to the MiB below
    if kind == "amd-apu" and carve:
        assert capacity["gpu_window_bytes"] == carve + window  # the carve-out and the GTT in force


def test_the_spark_gets_its_preset_at_what_its_os_sees(run_cli, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UMEMC_HOST_ROOT", str(MACHINES / "dgx-spark"))
    out = tmp_path / "stack.toml"
    assert run_cli("init", "-o", str(out), cwd=tmp_path)[0] == 0
    text = out.read_text()
    assert 'preset = "dgx-spark-128"' in text
    assert not [x for x in text.splitlines() if x.startswith("memory =")]  # the preset already says what the OS sees
    report = json.loads(run_cli("check", str(out), "--format", "json")[1])
    assert report["capacity"]["memory_bytes"] == 127_600_748 * 1024
    assert report["capacity"]["os_reserve_bytes"] == 8 * GiB


@pytest.mark.parametrize("name", ["dgx-spark", "apple-128", "strix-halo-128"])
def test_capture_writes_what_replays_the_same(name: str, run_cli, monkeypatch, tmp_path: Path) -> None:
    """doctor --capture of a (recorded) machine, unpacked and replayed, reads as the machine itself."""
    _, first = doctor(run_cli, monkeypatch, MACHINES / name)
    capture = tmp_path / "machine.tar.gz"
    code, said, err = run_cli("doctor", "--capture", str(capture))
    assert (code, err) == (0, "")
    assert said.startswith(f"wrote {capture}: ")
    with tarfile.open(capture) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "replay", filter="data")
    assert "CAPTURE.json" in names and not any(n.startswith(("home", "root", "proc/self", "environ")) for n in names)
    _, again = doctor(run_cli, monkeypatch, tmp_path / "replay")
    first.pop("recorded"), again.pop("recorded")
    assert again == first


def test_capture_refuses_a_name_that_is_not_a_tarball(run_cli, tmp_path: Path) -> None:
    code, _, err = run_cli("doctor", "--capture", str(tmp_path / "machine.zip"))
    assert (code, err) == (2, f"--capture {tmp_path / 'machine.zip'}: name a .tar.gz file\n")


def test_a_recorded_macs_room_for_swap_is_its_own(run_cli, monkeypatch, tmp_path: Path) -> None:
    """The room for macOS's swap files is a recorded Mac's own figure (facts.json, which a capture on a Mac writes),
    never the disk of the machine replaying it: said where recorded, and said as not recorded where not."""
    import shutil

    now = "0.0 GiB in swap now; umemc reports swap that grows while the stack runs"
    _, found = doctor(run_cli, monkeypatch, MACHINES / "apple-128")
    swap = [f["message"] for f in found["findings"] if f["check"] == "swap"]
    assert swap == [f"the room for swap files in / was not recorded with this machine ({now})"]
    mac = tmp_path / "mac"
    shutil.copytree(MACHINES / "apple-128", mac)
    facts = json.loads((mac / "facts.json").read_text())
    (mac / "facts.json").write_text(json.dumps({**facts, "swap_volume_free_bytes": 3 * GiB + GiB // 2}))
    _, found = doctor(run_cli, monkeypatch, mac)
    swap = [(f["status"], f["message"]) for f in found["findings"] if f["check"] == "swap"]
    assert swap == [
        (
            "warn",  # advisory: swap is room to slow down in, not a refusal
            "only 3.5 GiB free in /, where macOS keeps its swap files: under pressure it then kills programs or stops "
            f"with 'Your system has run out of application memory' ({now})",
        )
    ]
    code, _, err = run_cli("doctor", "--capture", str(tmp_path / "again.tar.gz"))
    assert (code, err) == (0, "")
    with tarfile.open(tmp_path / "again.tar.gz") as tar:
        tar.extractall(tmp_path / "replay", filter="data")
    assert json.loads((tmp_path / "replay" / "facts.json").read_text())["swap_volume_free_bytes"] == 3 * GiB + GiB // 2
