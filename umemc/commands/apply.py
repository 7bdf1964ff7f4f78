"""`umemc apply BUNDLE [--dry-run] [--root DIR]`: install the host files that need root — the sysctl
file, the kernel/macOS knobs and the systemd unit — printing each action. Commands are argv lists."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..contract import PLAN_FILE, PlanDoc, read
from ..errors import RuntimeFailure, UsageError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("apply", help="install a bundle's host files (sysctl, kernel/macOS knobs, systemd unit) as root")
    p.add_argument("bundle", help="a bundle directory written by `umemc build`")
    p.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    p.add_argument(
        "--root",
        metavar="DIR",
        default="/",
        help="install below DIR instead of / and run no command (staging, packaging, tests)",
    )
    p.add_argument("--run-dir", metavar="DIR", help="run dir for the systemd unit (default /var/lib/umemc/<name>)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Action:
    text: str
    install: tuple[str, str, int] | None = None  # (bundle-relative source or rendered text key, destination, mode)
    argv: tuple[str, ...] | None = None


def plan_actions(bundle: Path, plan: PlanDoc, run_dir: str) -> tuple[list[Action], dict[str, str]]:
    """The actions for this bundle's platform, and any text rendered at install time (the unit)."""
    name, kind = plan.stack, plan.platform.kind
    actions: list[Action] = []
    rendered: dict[str, str] = {}
    if kind != "apple":
        actions += [
            Action("VM tunables", ("sysctl/90-umemc.conf", "/etc/sysctl.d/90-umemc.conf", 0o644)),
            Action("load them", argv=("sysctl", "--system")),
        ]
    if (bundle / "kernel/amd/umemc-ttm.conf").exists():
        pages = (bundle / "kernel/amd/cmdline.txt").read_text().strip()
        actions += [
            Action(
                "GTT limit as a ttm module option",
                ("kernel/amd/umemc-ttm.conf", "/etc/modprobe.d/umemc-ttm.conf", 0o644),
            ),
            Action(
                f"not changed automatically: add `{pages}` to the kernel command line and reboot "
                "(kernel/README.md shows the GRUB commands)"
            ),
        ]
    if (bundle / "kernel/apple/com.umemc.wired-limit.plist").exists():
        plist = "/Library/LaunchDaemons/com.umemc.wired-limit.plist"
        actions += [
            Action("wired limit at every boot", ("kernel/apple/com.umemc.wired-limit.plist", plist, 0o644)),
            Action("load the LaunchDaemon", argv=("launchctl", "bootstrap", "system", plist)),
            Action("wired limit now", argv=("sh", str(bundle / "kernel/apple/umemc-wired-limit.sh"))),
        ]
    daemon_rel = f"launchd/com.umemc.{name}.plist"
    if kind == "apple" and (bundle / daemon_rel).exists():
        import plistlib

        doc = plistlib.loads((bundle / daemon_rel).read_bytes())
        fill = {"@PYTHON@": sys.executable, "@RUN_DIR@": run_dir, "@BUNDLE@": str(bundle)}
        doc["ProgramArguments"] = [fill.get(a, a) for a in doc["ProgramArguments"]]
        rendered[daemon_rel] = plistlib.dumps(doc, sort_keys=False).decode()
        dest = f"/Library/LaunchDaemons/com.umemc.{name}.plist"
        actions += [
            Action("run the stack at boot", (daemon_rel, dest, 0o644)),
            Action("load the LaunchDaemon", argv=("launchctl", "bootstrap", "system", dest)),
        ]
    unit_rel = f"systemd/umemc-{name}.service"
    if kind != "apple" and (bundle / unit_rel).exists():
        umemc = " ".join(_systemd_quote(a) for a in (sys.executable, "-m", "umemc"))
        text = (bundle / unit_rel).read_text().replace("@UMEMC@", umemc)
        text = text.replace("@BUNDLE@", _systemd_quote(str(bundle))).replace("@RUN_DIR@", _systemd_quote(run_dir))
        rendered[unit_rel] = text
        dest = f"/etc/systemd/system/umemc-{name}.service"
        actions += [
            Action("run the stack at boot", (unit_rel, dest, 0o644)),
            Action("reload systemd", argv=("systemctl", "daemon-reload")),
            Action(f"then: systemctl enable --now umemc-{name}"),
        ]
    return actions, rendered


def _systemd_quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "/._-+:@=," for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run(args: argparse.Namespace) -> int:
    from ..write import is_bundle

    bundle = Path(args.bundle).absolute()
    if not is_bundle(bundle):
        raise UsageError(f"{args.bundle}: not a umemc bundle (run `umemc build STACK -o {args.bundle}` first)")
    plan = read(PlanDoc, bundle / PLAN_FILE)
    run_dir = args.run_dir or f"/var/lib/umemc/{plan.stack}"
    actions, rendered = plan_actions(bundle, plan, run_dir)
    root = Path(args.root)
    staging = root.resolve() != Path("/")
    if not args.dry_run and not staging and os.geteuid() != 0:
        cmd = shlex.join(["sudo", sys.executable, "-m", "umemc", "apply", str(bundle)])
        raise RuntimeFailure(
            f"umemc apply changes /etc and needs root; run:\n  {cmd}\n"
            f"(or `umemc apply {args.bundle} --dry-run` to see what it would do)"
        )
    for action in actions:
        _do(action, bundle, root, rendered, dry=args.dry_run, staging=staging)
    return 0


def _do(a: Action, bundle: Path, root: Path, rendered: dict[str, str], *, dry: bool, staging: bool) -> None:
    if a.install is not None:
        rel, dest, mode = a.install
        target = root / dest.lstrip("/")
        print(f"{'would install' if dry else 'install'} {rel} -> {target} (mode {mode:o})  # {a.text}")
        if not dry:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.umemc-tmp")
            if rel in rendered:
                tmp.write_text(rendered[rel])
            else:
                shutil.copyfile(bundle / rel, tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
    elif a.argv is not None:
        shown = shlex.join(a.argv)
        if dry or staging:
            print(f"{'would run' if dry else 'skipped (--root)'}: {shown}  # {a.text}")
            return
        print(f"run: {shown}  # {a.text}")
        done = subprocess.run(list(a.argv), check=False)
        if done.returncode != 0:
            raise RuntimeFailure(f"`{shown}` failed with exit code {done.returncode}")
    else:
        print(f"note: {a.text}")
