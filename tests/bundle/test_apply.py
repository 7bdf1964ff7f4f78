"""`umemc apply`: dry run, staging into a root directory (no command run), refusal without root."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from tests.bundle.conftest import build_stack

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_changes_nothing(tmp_path: Path, run_cli) -> None:
    bundle = build_stack(REPO / "examples/strix-halo-5.toml", tmp_path / "b")
    code, out, err = run_cli("apply", str(bundle), "--dry-run")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "would install sysctl/90-umemc.conf -> /etc/sysctl.d/90-umemc.conf (mode 644)  # VM tunables",
        "would run: sysctl --system  # load them",
        "would install kernel/amd/umemc-ttm.conf -> /etc/modprobe.d/umemc-ttm.conf (mode 644)  # GTT limit as a "
        "ttm module option",
        "note: not changed automatically: add `ttm.pages_limit=31457280` to the kernel command line and reboot "
        "(kernel/README.md shows the GRUB commands)",
        "would install systemd/umemc-strix-halo-5.service -> /etc/systemd/system/umemc-strix-halo-5.service "
        "(mode 644)  # run the stack at boot",
        "would run: systemctl daemon-reload  # reload systemd",
        "note: then: systemctl enable --now umemc-strix-halo-5",
    ]


def test_staging_root_installs_files_and_runs_nothing(tmp_path: Path, run_cli) -> None:
    bundle = build_stack(REPO / "examples/strix-halo-5.toml", tmp_path / "b")
    root = tmp_path / "root"
    code, out, _ = run_cli("apply", str(bundle), "--root", str(root), "--run-dir", "/srv/umemc run")
    assert code == 0
    assert "skipped (--root): sysctl --system  # load them" in out.splitlines()
    assert (root / "etc/sysctl.d/90-umemc.conf").read_text() == (bundle / "sysctl/90-umemc.conf").read_text()
    assert (root / "etc/modprobe.d/umemc-ttm.conf").read_text().endswith("options ttm pages_limit=31457280\n")
    unit = (root / "etc/systemd/system/umemc-strix-halo-5.service").read_text()
    assert f'ExecStart={sys.executable} -m umemc up --foreground --run-dir "/srv/umemc run" {bundle}\n' in unit
    assert "@" not in unit.replace("network-online.target", "")
    assert "LimitMEMLOCK=infinity\n" in unit and "Delegate=yes\n" in unit
    # the bundle is private (0700/0600: worker environments may hold keys); what apply installs holds
    # none of them and gets the modes its readers need, whatever the bundle's or the umask's
    installed = [
        "etc/sysctl.d/90-umemc.conf",
        "etc/modprobe.d/umemc-ttm.conf",
        "etc/systemd/system/umemc-strix-halo-5.service",
    ]
    assert {f: stat.S_IMODE((root / f).stat().st_mode) for f in installed} == dict.fromkeys(installed, 0o644)
    assert stat.S_IMODE((bundle / "sysctl/90-umemc.conf").stat().st_mode) == 0o600


def test_apple_bundle_installs_the_launch_daemon(tmp_path: Path, run_cli) -> None:
    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b")
    code, out, _ = run_cli("apply", str(bundle), "--dry-run")
    assert code == 0
    assert out.splitlines() == [
        "would install kernel/apple/com.umemc.wired-limit.plist -> /Library/LaunchDaemons/com.umemc.wired-limit.plist "
        "(mode 644)  # wired limit at every boot",
        "would run: launchctl bootstrap system /Library/LaunchDaemons/com.umemc.wired-limit.plist  # load the "
        "LaunchDaemon",
        f"would run: sh {bundle}/kernel/apple/umemc-wired-limit.sh  # wired limit now",
        "would install launchd/com.umemc.apple-m-128.plist -> /Library/LaunchDaemons/com.umemc.apple-m-128.plist "
        "(mode 644)  # run the stack at boot",
        "would run: launchctl bootstrap system /Library/LaunchDaemons/com.umemc.apple-m-128.plist  # load the "
        "LaunchDaemon",
    ]
    assert "iogpu.wired_limit_mb=114688" in (bundle / "kernel/apple/umemc-wired-limit.sh").read_text()
    assert not (bundle / "sysctl").exists() and not (bundle / "systemd").exists()  # Linux only
    readme = (bundle / "kernel/README.md").read_text()
    assert "sysctl --system" not in readme and "systemctl" not in readme and "/proc/" not in readme


def test_apple_launch_daemon_gets_the_installed_paths(tmp_path: Path) -> None:
    import plistlib

    from umemc.commands.apply import plan_actions
    from umemc.contract import PlanDoc, read

    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b <&> x")
    _, rendered = plan_actions(bundle, read(PlanDoc, bundle / "plan.json"), "/var/lib/umemc/x y")
    doc = plistlib.loads(rendered["launchd/com.umemc.apple-m-128.plist"].encode())
    assert doc["ProgramArguments"] == [
        sys.executable,
        "-m",
        "umemc",
        "up",
        "--foreground",
        "--run-dir",
        "/var/lib/umemc/x y",
        str(bundle),
    ]
    assert doc["Label"] == "com.umemc.apple-m-128" and doc["RunAtLoad"] is True


def test_refuses_without_root(tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = build_stack(REPO / "examples/small-16g.toml", tmp_path / "b")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    code, out, err = run_cli("apply", str(bundle))
    assert (code, out) == (1, "")
    assert err == (
        f"umemc apply changes /etc and needs root; run:\n  sudo {sys.executable} -m umemc apply {bundle}\n"
        f"(or `umemc apply {bundle} --dry-run` to see what it would do)\n"
    )


def test_not_a_bundle(tmp_path: Path, run_cli) -> None:
    assert run_cli("apply", str(tmp_path)) == (
        2,
        "",
        f"{tmp_path}: not a umemc bundle (run `umemc build STACK -o {tmp_path}` first)\n",
    )
