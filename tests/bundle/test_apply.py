"""`umemc apply`: dry run, staging into a root directory (no command run), refusal without root."""

from __future__ import annotations

import os
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
        "note: not changed automatically: add `ttm.pages_limit=31457280 amdttm.pages_limit=31457280` to the kernel "
        "command line and reboot "
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
    assert (
        (root / "etc/modprobe.d/umemc-ttm.conf")
        .read_text()
        .endswith("options ttm pages_limit=31457280\noptions amdttm pages_limit=31457280\n")
    )
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


WIRED = [
    "would install kernel/apple/com.umemc.wired-limit.plist -> /Library/LaunchDaemons/com.umemc.wired-limit.plist "
    "(mode 644)  # wired limit at every boot",
    "would run: launchctl bootstrap system /Library/LaunchDaemons/com.umemc.wired-limit.plist  # load the LaunchDaemon",
]


def test_apple_bundle_installs_a_launch_agent_by_default(tmp_path: Path, run_cli) -> None:
    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b")
    code, out, _ = run_cli("apply", str(bundle), "--dry-run", "--user", "root")
    assert code == 0
    run_dir = "/root/Library/Application Support/umemc/apple-m-128"
    assert out.splitlines() == [
        *WIRED,
        f"would run: sh {bundle}/kernel/apple/umemc-wired-limit.sh  # wired limit now",
        f"would make {run_dir} (mode 700)  # the run dir (launchd's log and working directory)",
        "would install launchd/LaunchAgents/com.umemc.apple-m-128.plist -> "
        "/root/Library/LaunchAgents/com.umemc.apple-m-128.plist (mode 644)  # run the stack while root is logged in",
        "would run: launchctl bootstrap gui/0 /root/Library/LaunchAgents/com.umemc.apple-m-128.plist  # load the "
        "LaunchAgent",
    ]
    assert "iogpu.wired_limit_mb=114688" in (bundle / "kernel/apple/umemc-wired-limit.sh").read_text()
    assert not (bundle / "sysctl").exists() and not (bundle / "systemd").exists()  # Linux only
    readme = (bundle / "kernel/README.md").read_text()
    assert "sysctl --system" not in readme and "systemctl" not in readme and "/proc/" not in readme


def test_apple_bundle_as_a_launch_daemon(tmp_path: Path, run_cli) -> None:
    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b")
    code, out, _ = run_cli("apply", str(bundle), "--dry-run", "--user", "root", "--launchd", "daemon")
    assert code == 0
    assert out.splitlines()[3:] == [
        "would make /root/Library/Application Support/umemc/apple-m-128 (mode 700)  # the run dir (launchd's log "
        "and working directory)",
        "would install launchd/LaunchDaemons/com.umemc.apple-m-128.plist -> "
        "/Library/LaunchDaemons/com.umemc.apple-m-128.plist (mode 644)  # run the stack at boot as root",
        "would run: launchctl bootstrap system /Library/LaunchDaemons/com.umemc.apple-m-128.plist  # load the "
        "LaunchDaemon",
    ]


@pytest.mark.parametrize("launchd", ["agent", "daemon"])
def test_apple_launchd_jobs_get_the_installed_values(tmp_path: Path, launchd: str) -> None:
    """Every @...@ of the bundle's job is filled (paths escaped for XML by plistlib, read back here by plistlib), and
    the keys launchd.plist(5) gives them their meaning: KeepAlive on a crash only, Interactive (not throttled as
    background work), time to drain at exit, enough descriptors for supervisord; a daemon runs as the user."""
    import plistlib

    from umemc.commands.apply import MacUser, plan_actions
    from umemc.contract import PlanDoc, read

    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b <&> x")
    user = MacUser("alice", 501, "/Users/alice", launchd)
    _, rendered = plan_actions(bundle, read(PlanDoc, bundle / "plan.json"), "/Users/alice/run x", user)
    folder = {"agent": "LaunchAgents", "daemon": "LaunchDaemons"}[launchd]
    text = rendered[f"launchd/{folder}/com.umemc.apple-m-128.plist"]
    assert "@" not in text
    doc = plistlib.loads(text.encode())
    path = doc.pop("EnvironmentVariables")["PATH"].split(":")
    assert path[:2] == ["/opt/homebrew/bin", "/usr/local/bin"] and "/usr/bin" in path and len(path) == len(set(path))
    expected = {
        "Label": "com.umemc.apple-m-128",
        "ProgramArguments": [sys.executable, "-m", "umemc", "up", "--foreground", "--run-dir", "/Users/alice/run x",
                             str(bundle)],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ProcessType": "Interactive",
        "ExitTimeOut": 150,
        "SoftResourceLimits": {"NumberOfFiles": 4096},
        "HardResourceLimits": {"NumberOfFiles": 4096},
        "WorkingDirectory": "/Users/alice/run x",
        "StandardOutPath": "/Users/alice/run x/launchd.log",
        "StandardErrorPath": "/Users/alice/run x/launchd.log",
    }  # fmt: skip
    assert doc == expected | ({"UserName": "alice"} if launchd == "daemon" else {})


def test_a_user_installs_the_launch_agent_alone(tmp_path: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root: the LaunchAgent and the run dir are the user's to install (done, with launchctl, here a
    stand-in on PATH that records its argv: macOS's launchctl cannot run here); the wired limit needs root, said."""
    import plistlib

    from umemc.commands.apply import MacUser

    bundle = build_stack(REPO / "examples/apple-m-128.toml", tmp_path / "b")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "launchctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/launchctl.argv\n')
    (bin_dir / "launchctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr("os.geteuid", lambda: 501)
    monkeypatch.setattr("umemc.commands.apply.mac_user", lambda name, launchd="agent": MacUser("alice", 501, str(home)))
    code, out, err = run_cli("apply", str(bundle))
    agent = home / "Library/LaunchAgents/com.umemc.apple-m-128.plist"
    run_dir = home / "Library/Application Support/umemc/apple-m-128"
    assert (code, out.splitlines()) == (
        1,
        [
            "needs root, not done: wired limit at every boot",
            "needs root, not done: load the LaunchDaemon",
            "needs root, not done: wired limit now",
            f"make {run_dir} (mode 700)  # the run dir (launchd's log and working directory)",
            f"install launchd/LaunchAgents/com.umemc.apple-m-128.plist -> {agent} (mode 644)  # run the stack while "
            "alice is logged in",
            f"run: launchctl bootstrap gui/501 {agent}  # load the LaunchAgent",
        ],
    )
    assert err == f"3 of the actions above need root; for them run:\n  sudo {sys.executable} -m umemc apply {bundle}\n"
    assert (tmp_path / "launchctl.argv").read_text() == f"bootstrap gui/501 {agent}\n"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700 and stat.S_IMODE(agent.stat().st_mode) == 0o644
    assert plistlib.loads(agent.read_bytes())["WorkingDirectory"] == str(run_dir)


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
